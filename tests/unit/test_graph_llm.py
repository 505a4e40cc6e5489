"""The LLM graph extractor (graph/llm_extract.py) against the fake vendor servers: the exact
request, entities and relations parsed into the graph, a malformed answer read offline, the
cache that keeps an unchanged chunk from being sent twice, and the cost; and the community
summaries that the model writes (graph/llm_summaries.py) the same way."""

from __future__ import annotations

import json

from llmframe_ray.generate.chain import ProviderParams, provider_chain
from llmframe_ray.generate.costs import PriceTable
from llmframe_ray.graph.llm_extract import SCHEMA, SYSTEM, ExtractionCache, LlmExtractor, passages_prompt
from llmframe_ray.graph.store import build_graph
from llmframe_ray.types import Chunk
from tests.fakes.vendors import FakeAnthropic, FakeOpenAI, ToolCall

CHUNKS = [
    Chunk("film#0", "film", 0, "Kiss and Tell is a 1945 comedy starring Shirley Temple as Corliss Archer.", title="Kiss and Tell (1945 film)"),
    Chunk("temple#0", "temple", 0, "Shirley Temple Black later served as Chief of Protocol of the United States.", title="Shirley Temple"),
    Chunk("lava#0", "lava", 0, "Lava is molten rock expelled by a volcano.", title="Lava"),
]
FIRST = {"passages": [
    {"n": 1, "entities": [
        {"name": "Kiss and Tell", "type": "work", "description": "A 1945 American comedy film."},
        {"name": "Shirley Temple", "type": "person", "description": "The actress who played Corliss Archer."},
        {"name": "Corliss Archer", "type": "person", "description": "A fictional teenage girl."},
    ], "relations": [{"source": "Shirley Temple", "target": "Kiss and Tell", "description": "She starred in it."}]},
    {"n": 2, "entities": [
        {"name": "Shirley  Temple", "type": "person", "description": "Actress and diplomat."},
        {"name": "Chief of Protocol of the United States", "type": "concept", "description": "A diplomatic office."},
    ], "relations": [{"source": "Shirley Temple", "target": "Chief of Protocol of the United States", "description": "She held the office."}]},
]}
SECOND = {"passages": [{"n": 1, "entities": [{"name": "volcano", "type": "unknown-kind", "description": "Where lava comes from."}], "relations": []}]}


def chain(fake, vendor="anthropic"):
    if vendor == "anthropic":
        return provider_chain(ProviderParams(
            providers="anthropic,extractive", anthropic_api_key="k", anthropic_base_url=fake.base_url,
            anthropic_model="claude-test", max_attempts=1, backoff_s=0,
        ))
    return provider_chain(ProviderParams(
        providers="openai,extractive", openai_api_key="k", openai_base_url=fake.base_url, openai_model="gpt-test", max_attempts=1, backoff_s=0,
    ))


def extractor(fake, tmp_path, vendor="anthropic"):
    prices = PriceTable({"claude-test": (3.0, 15.0), "gpt-test": (1.0, 2.0)})
    return LlmExtractor(chain(fake, vendor), ExtractionCache(tmp_path / "cache.jsonl"), batch=2, concurrency=1, prices=prices)


def triples():
    return [(0, i, c) for i, c in enumerate(CHUNKS)]


def test_the_request_and_the_parsed_graph(tmp_path):
    with FakeAnthropic() as fake:
        fake.script.extend([ToolCall("knowledge_graph", FIRST, input_tokens=300, output_tokens=120),
                            ToolCall("knowledge_graph", SECOND, input_tokens=100, output_tokens=30)])
        graph = build_graph(triples(), llm=extractor(fake, tmp_path))
        first, second = fake.requests[0].body, fake.requests[1].body
    assert first["system"] == SYSTEM
    assert first["messages"] == [{"role": "user", "content": (
        "[1] Kiss and Tell (1945 film)\nKiss and Tell is a 1945 comedy starring Shirley Temple as Corliss Archer.\n\n"
        "[2] Shirley Temple\nShirley Temple Black later served as Chief of Protocol of the United States."
    )}]
    assert first["tools"][0]["name"] == "knowledge_graph" and first["tools"][0]["input_schema"] == SCHEMA
    assert first["tool_choice"] == {"type": "tool", "name": "knowledge_graph"}
    assert second["messages"][0]["content"] == passages_prompt([("Lava", CHUNKS[2].text)])
    ids = graph.entity_ids()
    temple, film, office = ids["shirley templ"], ids["kiss and tell"], ids["chief of protocol of the unit state"]
    assert (graph.types[temple], graph.types[film], graph.types[ids["volcano"]]) == ("title", "title", "phrase")
    assert graph.descriptions[temple] == "The actress who played Corliss Archer."  # the first description given
    assert graph.relation_notes[(min(temple, film), max(temple, film))] == "She starred in it."
    assert graph.relation_notes[(min(temple, office), max(temple, office))] == "She held the office."
    mentions = graph.mentions.toarray()
    assert mentions[0, temple] == 1 and mentions[1, temple] == 3  # named in the film's chunk; its own title
    report = graph.info["llm"]
    assert {k: report[k] for k in ("chunks", "cached", "asked", "requests", "fallback", "input_tokens", "output_tokens")} == {
        "chunks": 3, "cached": 0, "asked": 3, "requests": 2, "fallback": 0, "input_tokens": 400, "output_tokens": 150,
    }
    assert report["cost_usd"] == round((400 * 3.0 + 150 * 15.0) / 1e6, 8)
    assert graph.info["extractor"] == "llm-v1"


def test_the_cache_keeps_an_unchanged_chunk_from_being_sent_again(tmp_path):
    with FakeAnthropic() as fake:
        fake.script.extend([ToolCall("knowledge_graph", FIRST), ToolCall("knowledge_graph", SECOND)])
        build_graph(triples(), llm=extractor(fake, tmp_path))
        again = build_graph(triples(), llm=extractor(fake, tmp_path))  # a new extractor: the cache file alone remembers
        changed = [(0, 0, CHUNKS[0]), (0, 1, CHUNKS[1]), (0, 2, Chunk("lava#0", "lava", 0, "Lava cools into basalt.", title="Lava"))]
        fake.script.append(ToolCall("knowledge_graph", SECOND))
        third = build_graph(changed, llm=extractor(fake, tmp_path))
        sent = [r.body["messages"][0]["content"] for r in fake.requests]
    assert len(sent) == 3 and sent[2] == "[1] Lava\nLava cools into basalt."
    assert (again.info["llm"]["cached"], again.info["llm"]["requests"]) == (3, 0)
    assert (third.info["llm"]["cached"], third.info["llm"]["asked"]) == (2, 1)
    lines = (tmp_path / "cache.jsonl").read_text().splitlines()
    assert len(lines) == 4 and all(set(json.loads(line)) == {"fp", "entities", "relations"} for line in lines)


def test_a_malformed_answer_is_read_offline_and_asked_again(tmp_path):
    with FakeOpenAI() as fake:
        fake.script.extend([
            ToolCall("knowledge_graph", {"passages": [{"n": 7, "entities": [], "relations": []}]}),
            ToolCall("knowledge_graph", {"entities": []}),
        ])
        graph = build_graph(triples(), llm=extractor(fake, tmp_path, "openai"))
        assert fake.requests[0].body["tools"][0]["function"]["name"] == "knowledge_graph"
    report = graph.info["llm"]
    assert (report["fallback"], report["requests"]) == (3, 2)
    assert report["problems"] == [
        "chunks 0..1: a passage answer has no passage number from 1 to 2: {'n': 7, 'entities': [], 'relations': []}",
        "chunks 2..2: the answer has no 'passages' list",
    ]
    ids = graph.entity_ids()
    assert "corliss archer" in ids and graph.descriptions == [""] * len(ids)  # the offline reading
    assert not (tmp_path / "cache.jsonl").exists()  # nothing cached: the next build asks again


def test_community_summaries_written_by_the_model_and_cached(tmp_path):
    from llmframe_ray.graph.llm_summaries import SCHEMA as SUMMARY_SCHEMA, SYSTEM as SUMMARY_SYSTEM
    from llmframe_ray.graph.llm_summaries import LlmSummarizer, SummaryCache, community_text
    from llmframe_ray.graph.store import KnowledgeGraph

    prices = PriceTable({"claude-test": (3.0, 15.0)})
    with FakeAnthropic() as fake:
        fake.script.extend([ToolCall("knowledge_graph", FIRST), ToolCall("knowledge_graph", SECOND)])
        plain = build_graph(triples(), llm=extractor(fake, tmp_path))  # the extractions are cached from here on
        n = len(plain.communities)
        assert n >= 2
        answer = {"communities": [{"n": i, "summary": f"Report  {i}."} for i in range(1, n)]}  # the last one is missing
        fake.script.append(ToolCall("community_summaries", answer, input_tokens=500, output_tokens=60))
        summarizer = LlmSummarizer(chain(fake), SummaryCache(tmp_path / "summaries.jsonl"), prices=prices)
        graph = build_graph(triples(), llm=extractor(fake, tmp_path), summarizer=summarizer)
        asked = fake.requests[-1].body
        fake.script.append(ToolCall("community_summaries", {"communities": [{"n": 1, "summary": "The last report."}]}))
        again = build_graph(triples(), llm=extractor(fake, tmp_path),
                            summarizer=LlmSummarizer(chain(fake), SummaryCache(tmp_path / "summaries.jsonl"), prices=prices))
        last = fake.requests[-1].body
        assert len(fake.requests) == 4  # two extractions, then one summary request per build
    assert asked["system"] == SUMMARY_SYSTEM and asked["tools"][0]["input_schema"] == SUMMARY_SCHEMA
    assert asked["tool_choice"] == {"type": "tool", "name": "community_summaries"}
    assert asked["messages"][0]["content"] == "\n\n".join(f"[{i}] {community_text(plain, c)}" for i, c in enumerate(plain.communities, 1))
    temple = plain.entity_ids()["shirley templ"]
    assert f"- Shirley Temple (title): {plain.descriptions[temple]}" in asked["messages"][0]["content"]
    assert [c.summary for c in graph.communities] == [f"Report {i}." for i in range(1, n)] + [plain.communities[-1].summary]
    assert [c.evidence for c in graph.communities[:-1]] == [c.summary for c in plain.communities[:-1]]
    report = graph.info["llm_summaries"]
    assert {k: report[k] for k in ("communities", "cached", "asked", "requests", "fallback")} == {
        "communities": n, "cached": 0, "asked": n, "requests": 1, "fallback": 1}
    assert report["problems"] == [f"communities {n - 1}: no summary in the answer"]
    assert report["cost_usd"] == round((500 * 3.0 + 60 * 15.0) / 1e6, 8)
    assert last["messages"][0]["content"] == f"[1] {community_text(plain, plain.communities[-1])}"  # only the missing one
    assert again.info["llm_summaries"]["cached"] == n - 1 and again.communities[-1].summary == "The last report."
    back = KnowledgeGraph.load(again.save(tmp_path / "graph"))
    assert back.communities == again.communities


def test_a_malformed_summary_answer_keeps_the_extractive_summaries(tmp_path):
    from llmframe_ray.graph.llm_summaries import LlmSummarizer, SummaryCache

    with FakeOpenAI() as fake:
        fake.script.append(ToolCall("community_summaries", {"reports": []}))
        summarizer = LlmSummarizer(chain(fake, "openai"), SummaryCache(tmp_path / "summaries.jsonl"))
        graph = build_graph(triples(), summarizer=summarizer)
    plain = build_graph(triples())
    assert [c.summary for c in graph.communities] == [c.summary for c in plain.communities]
    report = graph.info["llm_summaries"]
    assert (report["fallback"], report["problems"]) == (len(plain.communities), [
        f"communities 0..{len(plain.communities) - 1}: the answer has no 'communities' list"])
    assert not (tmp_path / "summaries.jsonl").exists()
