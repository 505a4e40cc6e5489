"""Query rewriting: the offline rewriters, PRF term selection, fusing several queries' lists, and
LLM rewrites through the real SDKs against the fake vendor servers (exact prompts, parsed
rewrites, fallbacks)."""

from __future__ import annotations

import asyncio

import pytest

from llmframe_ray.generate.base import Message
from llmframe_ray.generate.chain import ProviderParams, provider_chain
from llmframe_ray.generate.rewriting import (
    MULTI_SYSTEM,
    STANDALONE_SCHEMA,
    STANDALONE_SYSTEM,
    queries_schema,
    rewrite_query,
)
from llmframe_ray.retrieve.rewrite import (
    QueryRewrite,
    RewriteParams,
    decompose,
    expand,
    feedback_terms,
    fuse_hit_lists,
    needs_context,
    standalone_offline,
)
from llmframe_ray.types import Hit
from tests.fakes.vendors import Fail, FakeAnthropic, FakeOpenAI, ToolCall

TOPIC = "Does vitamin D supplementation reduce fracture risk in the elderly?"
HISTORY = [Message("user", TOPIC), Message("assistant", "Trials show a small reduction [1].")]

# Follow-ups written for this test, with the standalone query the offline rewriter must give.
FOLLOW_UPS = [
    ("and in mice?", "vitamin D supplementation reduce fracture risk elderly in mice?"),
    ("What about calcium?", "vitamin D supplementation reduce fracture risk elderly calcium?"),
    ("Does it lower bone density?", "vitamin D supplementation reduce fracture risk elderly Does it lower bone density?"),
    ("How about fall risk?", "vitamin D supplementation reduce fracture elderly fall risk?"),
    ("How is insulin resistance measured in type 2 diabetes?", "How is insulin resistance measured in type 2 diabetes?"),
]


@pytest.mark.parametrize(("question", "standalone"), FOLLOW_UPS)
def test_offline_conversational_rewrite_carries_the_topic(question, standalone):
    assert standalone_offline(question, HISTORY) == standalone


def test_a_chain_of_follow_ups_keeps_the_topic_and_replaces_the_last_constraint():
    history = [*HISTORY, Message("user", "and in mice?"), Message("assistant", "In mice, yes [2].")]
    assert standalone_offline("what about rats?", history) == "vitamin D supplementation reduce fracture risk elderly rats?"


def test_without_history_or_need_the_question_is_unchanged():
    assert standalone_offline("  and in mice? ", []) == "and in mice?"
    assert not needs_context("How is insulin resistance measured in type 2 diabetes?")
    assert needs_context("and in mice?") and needs_context("Is it safe?") and needs_context("side effects")


def test_decompose_splits_comparisons_into_parts():
    assert decompose("Which magazine was started first, Arthur's Magazine or First for Women?", 3) == [
        "Which magazine was started first", "Arthur's Magazine", "First for Women",
    ]
    assert decompose("Arthur's Magazine or First for Women?", 1) == ["Arthur's Magazine"]
    assert decompose("ALDH1 expression is associated with poorer prognosis in breast cancer.", 3) == []


def hit(doc: str, text: str, score: float, rank: int, title: str = "", ranks=None) -> Hit:
    return Hit(doc_id=doc, chunk_id=f"{doc}#0", text=text, title=title, score=score, rank=rank, ranks=ranks or {"bm25": rank})


def test_feedback_terms_weigh_documents_by_score_and_need_two_of_them():
    hits = [
        hit("a", "Calcium intake and bone mineral density in older women.", 3.0, 1, title="Bone health"),
        hit("b", "Bone mineral density fell; calcium absorption was measured.", 2.0, 2),
        hit("c", "Hip fractures in nursing homes; bone loss with age.", 1.0, 3),
        hit("a", "A second chunk of document a: calcium calcium.", 0.5, 4),  # same document: skipped
        hit("d", "Unrelated zebrafish fins.", 0.1, 5),
    ]
    terms = feedback_terms("vitamin D and fractures", hits, n_docs=3, n_terms=4)
    # bone: in a (title + text), b and c; calcium and mineral/density in a and b; "fractures" is the query's
    assert terms == ["bone", "calcium", "density", "mineral"]
    assert feedback_terms("x", hits[:2], n_docs=2, n_terms=2) == ["bone", "calcium"]  # fewer than 3 documents: one suffices
    assert feedback_terms("x", [], 3, 5) == []
    assert expand(" vitamin D ", terms) == "vitamin D bone calcium density mineral"


def test_fuse_hit_lists_is_rrf_by_document_with_each_querys_rank():
    first = [hit("a", "A", 1.0, 1, ranks={"bm25": 1, "dense": 2}), hit("b", "B", 0.9, 2, ranks={"dense": 1})]
    second = [hit("b", "B2", 0.8, 1, ranks={"bm25": 1}), hit("c", "C", 0.7, 2, ranks={"bm25": 2})]
    fused = fuse_hit_lists([first, second], [1.0, 1.0], k=60, top_k=10)
    assert [(h.doc_id, h.rank) for h in fused] == [("b", 1), ("a", 2), ("c", 3)]
    assert fused[0].score == pytest.approx(1 / 62 + 1 / 61)
    assert dict(fused[0].ranks) == {"dense": 1, "q0": 2, "q1": 1}  # the first list's ranker ranks, and each query's
    assert dict(fused[2].ranks) == {"q1": 2}
    assert fused[0].text == "B"  # the first list's copy
    weighted = fuse_hit_lists([first, second], [1.0, 0.0], k=60, top_k=2)
    assert [h.doc_id for h in weighted] == ["a", "b"]


def run(coro):
    return asyncio.run(coro)


def anthropic_chain(fake) -> object:
    return provider_chain(ProviderParams(
        providers="anthropic,extractive", anthropic_api_key="k", anthropic_base_url=fake.base_url,
        anthropic_model="claude-test", max_attempts=1, backoff_s=0,
    ))


def test_conversational_rewrite_by_claude_sends_the_conversation_and_parses_the_query():
    with FakeAnthropic() as fake:
        fake.script.append(ToolCall("standalone_query", {"query": "  vitamin D and fracture risk   in mice "}, input_tokens=40, output_tokens=8))
        rewrite = run(rewrite_query(anthropic_chain(fake), QueryRewrite.CONVERSATIONAL, "and in mice?", HISTORY, RewriteParams()))
        body = fake.requests[0].body
    assert rewrite.queries == ("vitamin D and fracture risk in mice",)
    assert (rewrite.source, rewrite.model, rewrite.warning) == ("llm:anthropic", "claude-test", None)
    assert (rewrite.usage.input_tokens, rewrite.usage.output_tokens) == (40, 8)
    assert body["system"] == STANDALONE_SYSTEM
    assert body["messages"] == [{"role": "user", "content": (
        f"Conversation so far:\nuser: {TOPIC}\nassistant: Trials show a small reduction [1].\n\nQuestion: and in mice?"
    )}]
    assert body["tools"][0]["name"] == "standalone_query" and body["tools"][0]["input_schema"] == STANDALONE_SCHEMA
    assert body["tool_choice"] == {"type": "tool", "name": "standalone_query"}


def test_multi_query_by_openai_keeps_the_question_first_and_drops_repeats():
    with FakeOpenAI() as fake:
        fake.script.append(ToolCall("search_queries", {"queries": [
            "vitamin D fracture prevention", "DOES VITAMIN D SUPPLEMENTATION REDUCE FRACTURE RISK IN THE ELDERLY?",
            "vitamin D fracture prevention", "", "cholecalciferol hip fracture older adults", "one too many",
        ]}))
        chain = provider_chain(ProviderParams(
            providers="openai", openai_api_key="k", openai_base_url=fake.base_url, openai_model="gpt-test", max_attempts=1,
        ))
        rewrite = run(rewrite_query(chain, "multi-query", TOPIC, [], RewriteParams(queries=2)))
        body = fake.requests[0].body
    assert rewrite.queries == (TOPIC, "vitamin D fracture prevention", "cholecalciferol hip fracture older adults")
    assert rewrite.source == "llm:openai"
    assert body["messages"][0] == {"role": "system", "content": MULTI_SYSTEM.format(n=2)}
    assert body["messages"][1] == {"role": "user", "content": f"Question: {TOPIC}"}
    assert body["tools"][0]["function"]["parameters"] == queries_schema(2)


@pytest.mark.parametrize(("behaviour", "reason"), [
    (Fail(500, "boom"), "the extractive answerer cannot produce structured output"),  # Claude failed, then the offline answerer
    (ToolCall("standalone_query", {"query": "   "}), "the model's answer holds no query"),
    (ToolCall("standalone_query", {"query": 7}), "the answer's 'query' is not a string"),
])
def test_a_failed_llm_rewrite_falls_back_to_the_original_query(behaviour, reason):
    with FakeAnthropic() as fake:
        fake.script.append(behaviour)
        rewrite = run(rewrite_query(anthropic_chain(fake), QueryRewrite.CONVERSATIONAL, "and in mice?", HISTORY, RewriteParams()))
    assert rewrite.queries == ("and in mice?",)
    assert rewrite.source == "original"
    assert rewrite.warning.startswith("query rewriting (conversational) failed, the original query was used: ")
    assert reason in rewrite.warning


def test_a_slow_llm_rewrite_times_out_to_the_original_query():
    from tests.fakes.vendors import Delay

    with FakeAnthropic() as fake:
        fake.script.append(Delay(2.0))
        rewrite = run(rewrite_query(
            anthropic_chain(fake), QueryRewrite.CONVERSATIONAL, "and in mice?", HISTORY, RewriteParams(timeout_s=0.3),
        ))
    assert rewrite.queries == ("and in mice?",)
    assert rewrite.warning.endswith("timed out after 0.3 s")


def test_without_a_key_the_offline_rewriters_answer():
    chain = provider_chain(ProviderParams())  # auto without keys: the extractive answerer alone
    conv = run(rewrite_query(chain, QueryRewrite.CONVERSATIONAL, "and in mice?", HISTORY, RewriteParams()))
    assert (conv.queries, conv.source) == (("vitamin D supplementation reduce fracture risk elderly in mice?",), "offline")
    multi = run(rewrite_query(chain, QueryRewrite.MULTI_QUERY, "Arthur's Magazine or First for Women?", [], RewriteParams()))
    assert multi.queries == ("Arthur's Magazine or First for Women?", "Arthur's Magazine", "First for Women")
    assert run(rewrite_query(chain, "prf", "q", [], RewriteParams())).queries == ("q",)


def test_a_conversational_rewrite_without_history_asks_no_model():
    with FakeAnthropic() as fake:
        rewrite = run(rewrite_query(anthropic_chain(fake), QueryRewrite.CONVERSATIONAL, "and in mice?", [], RewriteParams()))
        assert fake.requests == []
    assert (rewrite.queries, rewrite.source) == (("and in mice?",), "none")
