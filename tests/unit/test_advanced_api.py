"""The advanced pipeline through the HTTP API, in process: retrieval strategies, alpha, query
rewriting (multi-query, PRF, conversational) and contextual compression."""

from __future__ import annotations

import numpy as np
import pytest
from fastapi.testclient import TestClient

from llmframe_ray.api.auth import ApiKeys
from llmframe_ray.api.http import create_app
from llmframe_ray.api.local import LocalStages
from llmframe_ray.api.service import RagService
from llmframe_ray.config import load_settings
from llmframe_ray.index.versions import IndexDirectory
from llmframe_ray.ingest.build import build_index
from llmframe_ray.ingest.chunker import sentences
from llmframe_ray.retrieve import evidence
from llmframe_ray.retrieve.compress import Split, cosines, lexical_overlap, scoring_text
from llmframe_ray.retrieve.pipeline import Pipeline
from llmframe_ray.retrieve.rewrite import decompose, expand, feedback_terms, fuse_hit_lists, query_weights
from llmframe_ray.retrieve.strategy import GRAPH_MISSING
from llmframe_ray.types import Document
from tests.unit.test_http_api import DOCS, as_dicts

KEY = "test-key-advanced-0123"
AUTH = {"X-API-Key": KEY}
MOON = Document("moon-facts", title="The Moon", text=(
    "The Moon is Earth's only natural satellite. It is about a quarter of Earth's diameter. "
    "Its gravity raises the ocean tides twice a day. The far side was first photographed in 1959. "
    "Astronauts first walked on it in 1969."
))


@pytest.fixture(scope="module")
def settings():
    return load_settings(chunk_size=128, chunk_overlap=8, fusion_depth=8, max_top_k=20, api_secret_key=KEY, llm_providers="extractive")


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory, settings, embedder):
    root = tmp_path_factory.mktemp("advanced") / "index"
    build_index([*DOCS, MOON], root, settings.params().index, embedder)
    return root


@pytest.fixture(scope="module")
def pipeline(index_dir, settings, embedder):
    return Pipeline.open(index_dir, embedder, settings.params().retrieval)


@pytest.fixture(scope="module")
def client(index_dir, settings, pipeline):
    stages = LocalStages(index_dir, pipeline, IndexDirectory(index_dir).current_version())
    app = create_app(RagService(stages, settings.params().service), ApiKeys.from_settings(settings))
    with TestClient(app) as test_client:
        yield test_client


def search(client, **body):
    response = client.post("/v1/search", headers=AUTH, json=body)
    assert response.status_code == 200, response.text
    return response.json()


@pytest.mark.parametrize(("strategy", "mode"), [("hybrid", "hybrid"), ("dense", "dense"), ("sparse", "bm25")])
def test_each_strategy_is_its_mode(client, pipeline, strategy, mode):
    got = search(client, query="what pulls the ocean tides", retrieval_strategy=strategy, top_k=5)
    assert (got["retrieval_strategy"], got["mode"], got["rewrites"]) == (strategy, mode, [])
    assert got["hits"] == as_dicts(pipeline.search("what pulls the ocean tides", mode, 5))
    by_mode = search(client, query="what pulls the ocean tides", mode=mode, top_k=5)
    assert by_mode["hits"] == got["hits"] and by_mode["retrieval_strategy"] == strategy


@pytest.mark.parametrize(("body", "field", "message"), [
    ({"retrieval_strategy": "graph"}, "retrieval_strategy", f"retrieval_strategy: {GRAPH_MISSING}"),
    ({"retrieval_strategy": "hybrid-graph"}, "retrieval_strategy", f"retrieval_strategy: {GRAPH_MISSING}"),
    ({"retrieval_strategy": "sparse", "mode": "dense"}, "mode",
     "mode: mode 'dense' contradicts retrieval_strategy 'sparse' (which searches with 'bm25'); send one of them"),
    ({"retrieval_strategy": "fuzzy"}, "retrieval_strategy",
     "retrieval_strategy: Input should be 'hybrid', 'dense', 'sparse', 'graph', 'hybrid-graph' or 'compressed'"),
    ({"alpha": 1.5}, "alpha", "alpha: Input should be less than or equal to 1"),
    ({"query_rewrite": "hyde"}, "query_rewrite",
     "query_rewrite: Input should be 'none', 'multi-query', 'prf' or 'conversational'"),
])
def test_bad_pipeline_fields_are_422_naming_them(client, body, field, message):
    response = client.post("/v1/search", headers=AUTH, json={"query": "moon", **body})
    assert response.status_code == 422, response.text
    assert response.json()["error"] == {"type": "invalid_request", "message": message, "field": field}


def test_alpha_weights_the_rankers(client, pipeline):
    query = "moon orbit phases"
    equal = search(client, query=query, alpha=0.5, top_k=8)["hits"]
    assert equal == search(client, query=query, top_k=8)["hits"]  # 0.5: the configured equal weights
    dense_only = search(client, query=query, alpha=1.0, top_k=8)["hits"]
    assert dense_only == as_dicts(pipeline.search(query, "hybrid", 8, alpha=1.0))
    dense = pipeline.search(query, "dense", 8)
    # with BM25's weight 0, the order is dense retrieval's (BM25-only finds after it, at score 0)
    assert [h["doc_id"] for h in dense_only[: len(dense)]] == [h.doc_id for h in dense]
    assert {h["score"] for h in dense_only[len(dense):]} <= {0.0}


def test_prf_expands_with_the_first_pass_terms_and_fuses_both(client, pipeline, settings):
    params = settings.params().service.rewrite
    query = "ocean tides"
    got = search(client, query=query, query_rewrite="prf", top_k=5)
    first = pipeline.search(query, "hybrid", max(5, params.prf_docs))
    terms = feedback_terms(query, first, params.prf_docs, params.prf_terms)
    assert terms, "the sample corpus gives feedback terms"
    expanded = expand(query, terms)
    assert got["rewrites"] == [expanded]
    second = pipeline.search(expanded, "hybrid", 5)
    assert got["hits"] == as_dicts(fuse_hit_lists([first[:5], second], [1.0, params.prf_weight], params.rrf_k, 5))


def test_offline_multi_query_retrieves_each_part_and_fuses(client, pipeline, settings):
    question = "Which is about microbes, the sourdough starter or the bicycle commute?"
    parts = decompose(question, settings.params().service.rewrite.queries)
    assert len(parts) >= 2
    got = search(client, query=question, query_rewrite="multi-query", top_k=4)
    assert got["rewrites"] == parts
    lists = [pipeline.search(q, "hybrid", 4) for q in [question, *parts]]
    weights = query_weights(len(lists), settings.params().service.rewrite, offline=True)
    assert weights[1:] == [settings.params().service.rewrite.parts_weight] * len(parts)
    assert got["hits"] == as_dicts(fuse_hit_lists(lists, weights, 60, 4))
    assert "timings_ms" in got and "rewrite" in got["timings_ms"]


def test_conversational_rewrite_uses_the_session(client):
    first = client.post("/v1/query", headers=AUTH, json={"question": "What drives ocean tides?", "session_id": "s-1"}).json()
    assert first["rewrites"] == []  # nothing before it: the question as asked
    follow = client.post("/v1/query", headers=AUTH, json={
        "question": "and eclipses?", "session_id": "s-1", "query_rewrite": "conversational",
    })
    assert follow.status_code == 200, follow.text
    assert follow.json()["rewrites"] == ["drives ocean tides eclipses?"]
    alone = client.post("/v1/query", headers=AUTH, json={"question": "and eclipses?", "query_rewrite": "conversational"}).json()
    assert alone["rewrites"] == []  # no session: nothing to carry


def test_conversational_rewrite_in_chat_uses_the_messages(client):
    response = client.post("/v1/chat/completions", headers=AUTH, json={
        "query_rewrite": "conversational",
        "messages": [
            {"role": "user", "content": "How is a sourdough starter made?"},
            {"role": "assistant", "content": "From wild yeast [1]."},
            {"role": "user", "content": "what about the bacteria?"},
        ],
    })
    assert response.status_code == 200, response.text
    assert response.json()["llmframe"]["rewrites"] == ["sourdough starter made the bacteria?"]


def test_compressed_keeps_sentences_of_the_same_hits(client):
    query = "When did astronauts walk on the Moon?"
    hybrid = search(client, query=query, top_k=3)["hits"]
    tight = search(client, query=query, retrieval_strategy="compressed", compression_budget_tokens=1, top_k=3)
    assert tight["retrieval_strategy"] == "compressed" and tight["mode"] == "hybrid"
    assert [h["chunk_id"] for h in tight["hits"]] == [h["chunk_id"] for h in hybrid]
    assert "compress" in tight["timings_ms"]
    for full, cut in zip(hybrid, tight["hits"]):
        kept = [s for s in cut["text"].split("...") if s.strip()]
        assert len(kept) == 1 and kept[0].strip() in sentences(full["text"])  # one token: each keeps its best sentence
    moon = next(h for h in tight["hits"] if h["doc_id"] == "moon-facts")
    assert moon["text"] == "... Astronauts first walked on it in 1969."
    loose = search(client, query=query, retrieval_strategy="compressed", compression_budget_tokens=100_000, top_k=3)
    assert [h["text"] for h in loose["hits"]] == [h["text"] for h in hybrid]  # everything fits: nothing cut
    # a threshold alone, no budget: no sentence scores 100, so each passage keeps its best
    strict = search(client, query=query, retrieval_strategy="compressed", compression_threshold=100.0, top_k=3)
    assert [h["text"] for h in strict["hits"]] == [h["text"] for h in tight["hits"]]


def test_offline_compression_keeps_the_sentences_likely_to_be_evidence(index_dir, pipeline, embedder, settings):
    """With the local embedder and no request budget, compression keeps the sentences whose evidence
    probability (retrieve/evidence.py) reaches LLMFRAME_COMPRESSION_EVIDENCE, and the question's
    best one; a hit that keeps none leaves the list; a request's budget fills the budget instead."""
    query = "When did astronauts walk on the Moon?"
    hybrid = pipeline.search(query, "hybrid", 3)
    split = Split.of_hits(hybrid)
    vectors = embedder.embed([query, *(scoring_text(hybrid[p].title, s) for p, s in zip(split.owner, split.sentences))])
    probs = sorted(evidence.probabilities(cosines(vectors[0], vectors[1:]), lexical_overlap(query, split.sentences), split.owner))
    assert settings.params().service.compression.evidence == 0.0068  # the default: this rule
    for threshold, expected in (((probs[-1] + probs[-2]) / 2, [("moon-facts", "... Astronauts first walked on it in 1969.")]),
                                (probs[0] / 2, [(h.doc_id, h.text) for h in hybrid])):  # the best alone; everything
        tuned = load_settings(**{**settings.model_dump(), "compression_evidence": threshold})
        stages = LocalStages(index_dir, pipeline, IndexDirectory(index_dir).current_version())
        with TestClient(create_app(RagService(stages, tuned.params().service), ApiKeys.from_settings(tuned))) as c:
            found = search(c, query=query, top_k=3, retrieval_strategy="compressed")["hits"]
            budgeted = search(c, query=query, top_k=3, retrieval_strategy="compressed", compression_budget_tokens=1)["hits"]
        assert [(h["doc_id"], h["text"]) for h in found] == expected
        assert [h["chunk_id"] for h in budgeted] == [h.chunk_id for h in hybrid]  # one token: each keeps its best
        assert all(len(pieces) == 1 for pieces in compressed_pieces(budgeted))
    # the embedder's sentence scores beside a deployed reranker (LLMFRAME_COMPRESSION_SCORER=embedder):
    # the same rule, no whole passage asked for or kept (the passage margin is the budget rule's)
    beside = load_settings(**{**settings.model_dump(), "compression_scorer": "embedder"})
    reranker = PassageReranker({h.passage: 9.0 for h in hybrid})
    stages = LocalStages(index_dir, pipeline, IndexDirectory(index_dir).current_version(), reranker=reranker)
    with TestClient(create_app(RagService(stages, beside.params().service), ApiKeys.from_settings(beside))) as c:
        with_reranker = search(c, query=query, top_k=3, retrieval_strategy="compressed")["hits"]
    stages = LocalStages(index_dir, pipeline, IndexDirectory(index_dir).current_version())
    with TestClient(create_app(RagService(stages, settings.params().service), ApiKeys.from_settings(settings))) as c:
        alone = search(c, query=query, top_k=3, retrieval_strategy="compressed")["hits"]
    assert reranker.asked == [] and [h["text"] for h in with_reranker] == [h["text"] for h in alone]
    assert len(alone) < len(hybrid) or any(h["text"] != full.text for h, full in zip(alone, hybrid))  # it cut something


def test_compressed_answers_cite_the_same_documents(client):
    asked = {"question": "When did astronauts walk on the Moon?", "top_k": 3}
    plain = client.post("/v1/query", headers=AUTH, json=asked).json()
    squeezed = client.post("/v1/query", headers=AUTH, json={**asked, "retrieval_strategy": "compressed", "compression_budget_tokens": 20}).json()
    assert squeezed["retrieval_strategy"] == "compressed"
    retrieved = {h["doc_id"] for h in search(client, query=asked["question"], top_k=3)["hits"]}
    assert squeezed["citations"] and {c["doc_id"] for c in squeezed["citations"]} <= retrieved
    assert squeezed["usage"]["input_tokens"] < plain["usage"]["input_tokens"]


def test_scripted_session_rewritten_by_claude(index_dir, settings, pipeline):
    """A two-turn session against the fake Anthropic server: the second turn's rewrite request
    carries the first turn (question and answer), its parsed query is what retrieval ran."""
    from llmframe_ray.generate.chain import ProviderParams, provider_chain
    from llmframe_ray.generate.rewriting import STANDALONE_SYSTEM
    from tests.fakes.vendors import Answer, FakeAnthropic, ToolCall

    with FakeAnthropic() as fake:
        chain = provider_chain(ProviderParams(
            providers="anthropic", anthropic_api_key="k", anthropic_base_url=fake.base_url, anthropic_model="claude-test",
        ))
        stages = LocalStages(index_dir, pipeline, IndexDirectory(index_dir).current_version(), provider=chain)
        app = create_app(RagService(stages, settings.params().service), ApiKeys.from_settings(settings))
        fake.script.extend([
            Answer(("The Moon's pull drives them [1].",)),
            ToolCall("standalone_query", {"query": "what causes a solar eclipse"}, input_tokens=30, output_tokens=6),
            Answer(("When the Moon passes between Earth and the Sun [1].",)),
        ])
        with TestClient(app) as c:
            first = c.post("/v1/query", headers=AUTH, json={"question": "What drives ocean tides?", "session_id": "talk"})
            second = c.post("/v1/query", headers=AUTH, json={
                "question": "and eclipses?", "session_id": "talk", "query_rewrite": "conversational", "top_k": 3,
            })
        rewrite_request = fake.requests[1].body
    assert first.status_code == 200 and second.status_code == 200, second.text
    assert rewrite_request["system"] == STANDALONE_SYSTEM
    assert rewrite_request["messages"] == [{"role": "user", "content": (
        "Conversation so far:\nuser: What drives ocean tides?\nassistant: The Moon's pull drives them [1].\n\n"
        "Question: and eclipses?"
    )}]
    body = second.json()
    assert body["rewrites"] == ["what causes a solar eclipse"]
    assert [c["doc_id"] for c in body["citations"]] == [pipeline.search("what causes a solar eclipse", "hybrid", 3)[0].doc_id]
    assert "rewrite" in body["timings_ms"]


def test_llm_compression_keeps_what_claude_names(index_dir, embedder, tmp_path):
    """LLMFRAME_COMPRESSION_SCORER=llm: the chain is shown the numbered sentences and its choice
    is applied; a passage it keeps nothing of keeps its first sentence; a failure compresses offline."""
    from llmframe_ray.generate.chain import ProviderParams, provider_chain
    from llmframe_ray.generate.extracting import EXTRACT_SCHEMA, EXTRACT_SYSTEM, extract_prompt
    from tests.fakes.vendors import Fail, FakeAnthropic, ToolCall

    settings = load_settings(chunk_size=128, chunk_overlap=8, fusion_depth=8, api_secret_key=KEY, compression_scorer="llm")
    pipeline = Pipeline.open(index_dir, embedder, settings.params().retrieval)
    query = "When did astronauts walk on the Moon?"
    hits = pipeline.search(query, "hybrid", 2)
    assert hits[0].doc_id == "moon-facts"
    passages = [sentences(h.text) for h in hits]
    with FakeAnthropic() as fake:
        chain = provider_chain(ProviderParams(
            providers="anthropic", anthropic_api_key="k", anthropic_base_url=fake.base_url, anthropic_model="claude-test", max_attempts=1,
        ))
        stages = LocalStages(index_dir, pipeline, IndexDirectory(index_dir).current_version(), provider=chain)
        app = create_app(RagService(stages, settings.params().service), ApiKeys.from_settings(settings))
        fake.script.extend([ToolCall("keep_sentences", {"keep": ["1.5", "1.3"]}), Fail(500, "overloaded")])
        with TestClient(app) as c:
            body = {"query": query, "top_k": 2, "retrieval_strategy": "compressed", "compression_budget_tokens": 40}
            chosen = c.post("/v1/search", headers=AUTH, json=body).json()
            fallback = c.post("/v1/search", headers=AUTH, json=body).json()
        asked = fake.requests[0].body
    assert asked["system"] == EXTRACT_SYSTEM.format(budget=40)
    assert asked["messages"] == [{"role": "user", "content": extract_prompt(query, passages)}]
    assert asked["tools"][0]["input_schema"] == EXTRACT_SCHEMA
    assert [h["text"] for h in chosen["hits"]] == [
        f"... {passages[0][2]} ... {passages[0][4]}",
        passages[1][0] + (" ..." if len(passages[1]) > 1 else ""),
    ]
    assert chosen["warnings"] == []
    assert fallback["warnings"][0].startswith("LLM compression failed, the sentences were scored offline: ")
    assert [h["chunk_id"] for h in fallback["hits"]] == [h.chunk_id for h in hits]


class PassageReranker:
    """A stand-in cross-encoder with set scores for whole passages; records what it is asked."""

    def __init__(self, scores: dict[str, float]) -> None:
        self.scores, self.asked = scores, []

    def score(self, query, passages):
        self.asked.append(list(passages))
        return np.array([self.scores.get(p, -10.0) for p in passages], dtype=np.float32)


@pytest.mark.parametrize("margin", ["1.0", "none"])
def test_passages_the_reranker_rates_near_the_best_stay_whole(index_dir, embedder, margin):
    """With a reranker deployed, compression asks it for the whole passages (one call) and keeps
    whole those within LLMFRAME_COMPRESSION_PASSAGE_MARGIN of the best, over the budget; the
    sentences are still scored by the embedder here (LLMFRAME_COMPRESSION_SCORER=embedder)."""
    settings = load_settings(chunk_size=128, chunk_overlap=8, fusion_depth=8, api_secret_key=KEY,
                             compression_scorer="embedder", compression_passage_margin=margin)
    pipeline = Pipeline.open(index_dir, embedder, settings.params().retrieval)
    query = "When did astronauts walk on the Moon?"
    hybrid = pipeline.search(query, "hybrid", 3)
    assert hybrid[0].doc_id == "moon-facts" and len(sentences(hybrid[0].text)) == 5
    reranker = PassageReranker({hybrid[0].passage: 3.0, hybrid[1].passage: 2.5, hybrid[2].passage: 0.0})
    stages = LocalStages(index_dir, pipeline, IndexDirectory(index_dir).current_version(), reranker=reranker)
    app = create_app(RagService(stages, settings.params().service), ApiKeys.from_settings(settings))
    with TestClient(app) as c:
        found = search(c, query=query, top_k=3, retrieval_strategy="compressed", compression_budget_tokens=1)["hits"]
    assert [h["chunk_id"] for h in found] == [h.chunk_id for h in hybrid]
    kept = [[s for s in h["text"].split("...") if s.strip()] for h in found]
    if margin == "none":
        assert reranker.asked == []
        assert found[0]["text"] == "... Astronauts first walked on it in 1969."
        assert all(len(k) == 1 for k in kept)  # a budget of one token: each passage's best sentence
    else:
        assert reranker.asked == [[h.passage for h in hybrid]]
        assert [h["text"] for h in found[:2]] == [h.text for h in hybrid[:2]]  # 3.0 and 2.5: within 1.0 of the best
        assert len(kept[2]) == 1  # 0.0: its best sentence only


def compressed_pieces(hits):
    return [[piece.strip() for piece in h["text"].split("...") if piece.strip()] for h in hits]


def test_with_a_relative_threshold_compression_keeps_what_scores_near_the_best_after_the_passage_prior(index_dir, embedder):
    """LLMFRAME_COMPRESSION_RELATIVE and ..._PASSAGE_PRIOR with a cross-encoder's scores (a
    stand-in): each sentence loses the prior x its passage's distance from the best passage, and
    every sentence within the relative threshold of the best one is kept, whatever the budget."""
    query = "When did astronauts walk on the Moon?"
    settings = load_settings(chunk_size=128, chunk_overlap=8, fusion_depth=8, api_secret_key=KEY,
                             compression_scorer="cross-encoder", compression_passage_margin="none",
                             compression_relative="2.5", compression_budget_tokens=1, compression_passage_drop="none")
    pipeline = Pipeline.open(index_dir, embedder, settings.params().retrieval)
    hybrid = pipeline.search(query, "hybrid", 3)
    first, second = sentences(hybrid[0].text), sentences(hybrid[1].text)
    assert len(first) >= 2 and len(second) == 1
    texts = lambda h, s: f"{h.title}\n{s}" if h.title else s  # compress.scoring_text
    scores = {
        hybrid[1].passage: 3.0, hybrid[0].passage: 1.0, hybrid[2].passage: 0.0,
        texts(hybrid[1], second[0]): 5.0, texts(hybrid[0], first[0]): 4.5, texts(hybrid[0], first[1]): 4.0,
    }
    # score = model + 0.3 x overlap + prior x (passage - 5.0) (not + the passage's best under this
    # rule; the one-sentence second passage is scored as its sentence, 5.0): second[0] 5.0 is the
    # best (cut 2.5, at most 2.8 with overlap). Prior 1: first[0] 0.5, its passage's best, kept;
    # first[1] 0.0 dropped. Prior 0: first[1] 4.0 kept.
    for prior, first_kept in ((1.0, first[:1]), (0.0, first[:2])):
        reranker = PassageReranker(scores)
        stages = LocalStages(index_dir, pipeline, IndexDirectory(index_dir).current_version(), reranker=reranker)
        service = RagService(stages, load_settings(**{**settings.model_dump(), "compression_passage_prior": prior}).params().service)
        with TestClient(create_app(service, ApiKeys.from_settings(settings))) as c:
            found = search(c, query=query, top_k=3, retrieval_strategy="compressed")["hits"]
            budgeted = search(c, query=query, top_k=3, retrieval_strategy="compressed", compression_budget_tokens=1)["hits"]
        kept = compressed_pieces(found)
        assert kept[0] == [" ".join(first_kept)] and kept[1] == second and len(kept[2]) == 1  # adjacent: one piece
        assert len(reranker.asked) == 2 and reranker.asked[0][-3:] == [h.passage for h in hybrid]
        # a request's budget replaces the relative rule: one token keeps each passage's best sentence
        assert compressed_pieces(budgeted)[:2] == [first[:1], second]
    # LLMFRAME_COMPRESSION_PASSAGE_DROP: the third passage is one sentence, which the stand-in scores
    # as the passage (0.0), less the prior's 5.0 (the one-sentence second passage is scored as its
    # sentence, 5.0): about 10 below the best, further than the relative 2.5 + a drop of 5.0, so it
    # keeps nothing and leaves the list (with no drop, above, it kept its one sentence)
    assert len(sentences(hybrid[2].text)) == 1
    dropping = load_settings(**{**settings.model_dump(), "compression_passage_drop": 5.0})
    stages = LocalStages(index_dir, pipeline, IndexDirectory(index_dir).current_version(), reranker=PassageReranker(scores))
    with TestClient(create_app(RagService(stages, dropping.params().service), ApiKeys.from_settings(settings))) as c:
        found = search(c, query=query, top_k=3, retrieval_strategy="compressed")["hits"]
    assert [h["doc_id"] for h in found] == [h.doc_id for h in hybrid[:2]]
    assert compressed_pieces(found) == [[" ".join(first[:1])], second]


@pytest.mark.parametrize(("trained_on_sentences", "rule"), [(True, "auto"), (True, "none"), (False, "auto"), (False, "none")])
def test_a_reranker_trained_on_rationale_sentences_gets_its_evidence_rule_by_default(index_dir, embedder, trained_on_sentences, rule):
    """LLMFRAME_COMPRESSION_SCORER=auto (the default) with a Reranker deployed: where its card says
    it was trained with --rationales, its evidence model (retrieve/evidence.py, threshold
    LLMFRAME_COMPRESSION_RATIONALE_EVIDENCE; `none`: the relative rule at 6.25), no passage kept
    whole. A reranker trained on passages alone: the embedder's evidence rule, the reranker not
    asked (LLMFRAME_COMPRESSION_EVIDENCE `none`: its scores, the passage margin and the budget)."""
    query = "When did astronauts walk on the Moon?"
    evidence = {"compression_rationale_evidence": 0.002 if rule == "auto" else "none"} if trained_on_sentences else {
        "compression_evidence": 0.0068 if rule == "auto" else "none"}
    settings = load_settings(chunk_size=128, chunk_overlap=8, fusion_depth=8, api_secret_key=KEY,
                             compression_budget_tokens=1, compression_passage_budget_tokens=1, **evidence)
    pipeline = Pipeline.open(index_dir, embedder, settings.params().retrieval)
    hybrid = pipeline.search(query, "hybrid", 3)
    first, second = sentences(hybrid[0].text), sentences(hybrid[1].text)
    assert len(first) >= 3 and len(second) == 1 and lexical_overlap(query, first[2:3]) == [0.0]
    texts = lambda h, s: f"{h.title}\n{s}" if h.title else s
    reranker = PassageReranker({
        hybrid[1].passage: 3.0, hybrid[0].passage: 1.0, hybrid[2].passage: 0.0,
        texts(hybrid[1], second[0]): 5.0, texts(hybrid[0], first[0]): 4.5, texts(hybrid[0], first[1]): 4.0,
        texts(hybrid[0], first[2]): 2.0,
    })
    reranker.card = {"name": "stand-in", "data": {"rationale_groups": 935}} if trained_on_sentences else {"name": "stand-in", "data": {}}
    stages = LocalStages(index_dir, pipeline, IndexDirectory(index_dir).current_version(), reranker=reranker)
    with TestClient(create_app(RagService(stages, settings.params().service), ApiKeys.from_settings(settings))) as c:
        kept = compressed_pieces(search(c, query=query, top_k=3, retrieval_strategy="compressed")["hits"])
    if trained_on_sentences and rule == "auto":
        # second[0] (5.0) is the best sentence. The evidence model (CROSS_ENCODER) of first[2]:
        # -5.4059 + 0.2867 x 2.0 + 0.3135 x (2.0 - 5.0) + 0.2783 x (4.5 - 5.0) = -5.912, a
        # probability of 0.0027 >= 0.002: kept (first[3:], at the stand-in's -10.0, are not);
        # hybrid[2]'s one sentence (0.0, rank 2) is far below: it leaves the list. Only the
        # sentences are scored: no whole passage is sent beside them
        assert kept == [[" ".join(first[:3])], second]
        split = Split.of_hits(hybrid)
        assert reranker.asked == [[texts(hybrid[p], s) for p, s in zip(split.owner, split.sentences)]]
    elif not trained_on_sentences and rule == "auto":
        assert reranker.asked == []
        stages = LocalStages(index_dir, pipeline, IndexDirectory(index_dir).current_version())
        with TestClient(create_app(RagService(stages, settings.params().service), ApiKeys.from_settings(settings))) as c:
            alone = compressed_pieces(search(c, query=query, top_k=3, retrieval_strategy="compressed")["hits"])
        assert kept == alone  # what the embedder's evidence rule keeps without a reranker
        # a request's budget leaves the evidence rule: the reranker's scores, its margin, the budget
        stages = LocalStages(index_dir, pipeline, IndexDirectory(index_dir).current_version(), reranker=reranker)
        with TestClient(create_app(RagService(stages, settings.params().service), ApiKeys.from_settings(settings))) as c:
            budgeted = compressed_pieces(search(c, query=query, top_k=3, retrieval_strategy="compressed",
                                                compression_budget_tokens=1)["hits"])
        assert len(reranker.asked) == 1
        assert budgeted[0] == first[:1] and budgeted[1] == second and len(budgeted[2]) == 1
    elif trained_on_sentences:
        # the one-sentence hybrid[1] is scored as its sentence (5.0): the best passage. Prior 1.0:
        # first[0] 0.5 and first[1] 0.0 are within 6.25 of second[0] (5.0), first[2] -2.0 is not;
        # hybrid[2], one sentence scored as its passage (0.0, -5.0 with the prior), is further than
        # 6.25 + 2.0 (the passage drop) below the best: it keeps nothing and leaves the list
        assert kept == [[" ".join(first[:2])], second]
    else:
        # margin 1.0: only hybrid[1] (5.0) is whole; the budget of one token adds nothing to the bests
        assert kept[0] == first[:1] and kept[1] == second and len(kept[2]) == 1


@pytest.mark.parametrize("embedder_evidence", [True, False])
def test_a_reranker_card_that_cannot_be_read_is_told(index_dir, embedder, embedder_evidence):
    """The embedder's evidence rule then (it does not depend on the reranker), or, with
    LLMFRAME_COMPRESSION_EVIDENCE=none, the budget rule."""
    class CardlessReranker(PassageReranker):
        @property
        def card(self):
            raise RuntimeError("card store down")

    query = "When did astronauts walk on the Moon?"
    settings = load_settings(chunk_size=128, chunk_overlap=8, fusion_depth=8, api_secret_key=KEY, compression_passage_margin="none",
                             compression_budget_tokens=1, compression_evidence=0.0068 if embedder_evidence else "none")
    pipeline = Pipeline.open(index_dir, embedder, settings.params().retrieval)
    hybrid = pipeline.search(query, "hybrid", 3)
    reranker = CardlessReranker({})
    stages = LocalStages(index_dir, pipeline, IndexDirectory(index_dir).current_version(), reranker=reranker)
    with TestClient(create_app(RagService(stages, settings.params().service), ApiKeys.from_settings(settings))) as c:
        body = search(c, query=query, top_k=3, retrieval_strategy="compressed")
    if embedder_evidence:
        assert body["warnings"] == ["the reranker's model card could not be read: the reranker did not score the sentences"]
        assert reranker.asked == []
        assert len(body["hits"]) < len(hybrid) or any(h["text"] != full.text for h, full in zip(body["hits"], hybrid))
    else:
        assert body["warnings"] == ["the reranker's model card could not be read: compressed by the budget rule"]
        # the budget rule, one token: every hit keeps its best sentence alone
        assert [h["chunk_id"] for h in body["hits"]] == [h.chunk_id for h in hybrid]
        assert all(len(pieces) == 1 for pieces in compressed_pieces(body["hits"]))
