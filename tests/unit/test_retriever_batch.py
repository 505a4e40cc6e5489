"""The Retriever's batch path without a cluster: one plan for many requests, each answered as
the in-process pipeline answers it alone, and a request that fails inside a batch fails alone."""

import asyncio

import pytest

from llmframe_ray.config import load_settings
from llmframe_ray.errors import QueryTooLongError
from llmframe_ray.ingest.build import build_index
from llmframe_ray.models.embedder import OnnxEmbedder
from llmframe_ray.retrieve import joint
from llmframe_ray.retrieve.pipeline import Pipeline
from llmframe_ray.retrieve.plan import ResultLevel
from llmframe_ray.telemetry import REGISTRY
from llmframe_ray.types import INDEX_MODES, Document, SearchMode

retriever = pytest.importorskip("llmframe_ray.serve.retriever")

DOCS = [
    Document("tides", "Ocean tides are driven by the gravitational pull of the Moon and the Sun."),
    Document("bees", "Honey bees tell the direction of flowers with a waggle dance."),
    Document("rust", "Iron rusts when it reacts with oxygen and water."),
    Document("tea", "Green tea leaves are steamed soon after picking to stop oxidation."),
    Document("lava", "Basaltic lava erupts from shield volcanoes such as Mauna Loa."),
]
QUERIES = ["what causes tides", "bee dance", "why iron rusts", "volcano lava", "green tea"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory, model_dir):
    settings = load_settings(fusion_depth=10)
    params = settings.params()
    root = tmp_path_factory.mktemp("retriever") / "index"
    build_index(DOCS, root, params.index, OnnxEmbedder(model_dir, threads=1), shards=2)
    embedder = params.embedder.with_threads(1)

    async def start():
        args = retriever.RetrieverArgs(embedder, [((0, 1), None)], str(root), params.retrieval, 0, 1)
        return await retriever.RetrieverCore(args).start()

    core = asyncio.run(start())
    pipeline = Pipeline.open(root, OnnxEmbedder(model_dir, threads=1), params.retrieval)
    return core, pipeline


def key(hits):
    return [(h.doc_id, h.chunk_id, h.rank, dict(h.ranks), round(h.score, 6)) for h in hits]


@pytest.mark.parametrize("mode", INDEX_MODES)
def test_one_plan_for_a_batch_answers_each_request_as_the_pipeline_does_alone(setup, mode):
    core, pipeline = setup
    asks = [retriever.Ask(q, mode, ResultLevel.DOCUMENT, 3) for q in QUERIES]
    results = asyncio.run(core._answer(core.served, asks))
    assert [key(r.hits) for r in results] == [key(pipeline.search(q, mode, 3)) for q in QUERIES]
    assert {r.version for r in results} == {core.served.version}


class Searches:
    """MachineSearches with what `alone()` answers set by the test."""

    def __init__(self, alone):
        self.answer = alone

    def alone(self):
        return self.answer


@pytest.mark.parametrize("alone, queries, solo", [(True, 1, True), (False, 1, False), (True, 2, False)])
def test_a_query_alone_on_the_machine_runs_through_the_solo_session(setup, monkeypatch, alone, queries, solo):
    core, pipeline = setup
    assert core.embedder.solo_threads == 2 and core.searches is not None  # 2 cores, one thread per replica
    calls = []
    embed = core.embedder.embed
    monkeypatch.setattr(core.embedder, "embed", lambda texts, solo=False: calls.append(solo) or embed(texts, solo=solo))
    monkeypatch.setattr(core, "searches", Searches(alone))
    asks = [retriever.Ask(q, SearchMode.HYBRID, ResultLevel.DOCUMENT, 3) for q in QUERIES[:queries]]
    before = core.batch_stats()["solo"]
    results = asyncio.run(core._answer(core.served, asks))
    assert calls == [solo]  # the batch's queries go through the embedder in one call (its small batches)
    assert core.batch_stats()["solo"] == before + solo
    assert [key(r.hits) for r in results] == [key(pipeline.search(q, SearchMode.HYBRID, 3)) for q in QUERIES[:queries]]


def test_a_search_counts_in_the_machine_table_while_it_runs(setup, monkeypatch):
    core, _ = setup
    seen = []

    async def batch(ask):  # serve.batch needs a replica: answer the ask as a batch of one
        seen.append(core.searches.in_flight() - before)
        return (await core._answer(core.served, [ask]))[0]

    before = core.searches.in_flight()
    monkeypatch.setattr(core, "_batch", batch)
    asyncio.run(core.retrieve("bee dance", SearchMode.HYBRID, ResultLevel.DOCUMENT, 3))
    assert seen == [1] and core.searches.in_flight() == before


def test_a_query_too_long_for_the_model_fails_alone(setup):
    core, pipeline = setup
    texts = [QUERIES[0], "tide " * 400, QUERIES[2]]
    asks = [retriever.Ask(q, SearchMode.HYBRID, ResultLevel.DOCUMENT, 3) for q in texts]
    first, bad, last = asyncio.run(core._answer(core.served, asks))
    assert isinstance(bad, QueryTooLongError) and "accepts at most 256" in str(bad)
    assert key(first.hits) == key(pipeline.search(QUERIES[0], "hybrid", 3))
    assert key(last.hits) == key(pipeline.search(QUERIES[2], "hybrid", 3))


def test_a_request_that_breaks_the_shared_plan_fails_alone(setup, monkeypatch):
    core, pipeline = setup
    real = joint.search_together

    def search_together(held, bm25, inputs, k, where=None):  # the setup's two shards are one group
        if any("poison" in text for text in inputs if isinstance(text, str)):
            raise RuntimeError("the analyzer choked on this text")
        return real(held, bm25, inputs, k, where)

    monkeypatch.setattr("llmframe_ray.retrieve.shard_cache.search_together", search_together)
    texts = [QUERIES[1], "poison pill", QUERIES[3]]
    asks = [retriever.Ask(q, SearchMode.BM25, ResultLevel.DOCUMENT, 3) for q in texts]
    first, bad, last = asyncio.run(core._answer(core.served, asks))
    assert isinstance(bad, RuntimeError) and str(bad) == "the analyzer choked on this text"
    assert key(first.hits) == key(pipeline.search(QUERIES[1], "bm25", 3))
    assert key(last.hits) == key(pipeline.search(QUERIES[3], "bm25", 3))


class PickyCrossEncoder:
    """Scores a pair by its passage's length; the tokenizer's TypeError for a lone surrogate."""

    def __init__(self):
        self.calls = 0

    def score_pairs(self, pairs):
        import numpy as np

        self.calls += 1
        if any("\ud800" in q for q, _ in pairs):
            raise TypeError("TextEncodeInput must be Union[TextInputSequence, Tuple[InputSequence, InputSequence]]")
        return np.array([float(len(p)) for _, p in pairs], dtype=np.float32)


def test_a_request_the_reranker_cannot_score_fails_alone_in_its_batch():
    from llmframe_ray.serve.reranker import score_each

    encoder = PickyCrossEncoder()
    items = [("tides", ("ab", "abcd")), ("a \ud800", ("abc",)), ("bees", ("a",))]
    out = score_each(encoder, items)
    assert out[0] == [2.0, 4.0] and out[2] == [1.0]
    assert isinstance(out[1], TypeError)
    assert encoder.calls == 4  # the whole batch once, then each request alone
    assert score_each(encoder, [items[0], items[2]]) == [[2.0, 4.0], [1.0]]
    with pytest.raises(TypeError):
        score_each(encoder, [items[1]])


def test_a_replica_that_starts_after_a_broken_publish_serves_the_newest_version_that_loads(tmp_path, model_dir):
    from llmframe_ray.index.versions import IndexDirectory

    settings = load_settings(fusion_depth=10)
    params = settings.params()
    root = tmp_path / "index"
    good = build_index(DOCS, root, params.index, OnnxEmbedder(model_dir, threads=1))
    broken = build_index(DOCS[:2], root, params.index, OnnxEmbedder(model_dir, threads=1))
    faiss_file = next((root / "versions" / broken).rglob("*.faiss"))
    faiss_file.write_bytes(faiss_file.read_bytes()[:100])  # a bad disk, a bad copy
    assert IndexDirectory(root).current_version() == broken

    async def start():
        args = retriever.RetrieverArgs(params.embedder.with_threads(1), [((0,), None)], str(root), params.retrieval, 0, 1)
        return await retriever.RetrieverCore(args).start()

    core = asyncio.run(start())
    assert core.served.version == good
    assert core.problem.startswith(f"version {broken} is not served: ") and core.problem.endswith(
        f"; serving {good}, the newest version that loads")
    (result,) = asyncio.run(core._answer(core.served, [retriever.Ask("why iron rusts", SearchMode.HYBRID, ResultLevel.DOCUMENT, 1)]))
    assert result.version == good and result.hits[0].doc_id == "rust"


def test_searches_past_the_pending_limit_are_refused_at_once(tmp_path, model_dir):
    settings = load_settings(fusion_depth=10, max_pending_searches=2)
    params = settings.params()
    root = tmp_path / "index"
    build_index(DOCS, root, params.index, OnnxEmbedder(model_dir, threads=1))

    async def scenario():
        args = retriever.RetrieverArgs(params.embedder.with_threads(1), [((0,), None)], str(root), params.retrieval, 0, 1)
        core = await retriever.RetrieverCore(args).start()

        async def one_at_a_time(ask):  # Serve's batcher needs a replica; a search per call here
            await asyncio.sleep(0.01)
            return (await core._answer(core.served, [ask]))[0]

        core._batch = one_at_a_time
        queued = []
        watched = core._answer

        async def answer(served, asks):  # /metrics' queue length while two searches wait or run
            queued.append(REGISTRY.get_sample_value("llmframe_queue_length", {"stage": "retrieve"}))
            return await watched(served, asks)

        core._answer = answer
        first = await asyncio.gather(
            *(core.retrieve(q, SearchMode.BM25, ResultLevel.DOCUMENT, 3) for q in QUERIES), return_exceptions=True
        )
        later = await core.retrieve(QUERIES[4], SearchMode.BM25, ResultLevel.DOCUMENT, 3)
        assert (queued[0], queued[-1]) == (2.0, 1.0)  # the two admitted ones waiting together; the later one alone
        assert REGISTRY.get_sample_value("llmframe_queue_length", {"stage": "retrieve"}) == 0.0
        return first, later, core.batch_stats()

    first, later, stats = asyncio.run(scenario())
    assert [type(r).__name__ for r in first] == ["Retrieved", "Retrieved"] + ["StageUnavailableError"] * 3
    assert str(first[2]) == (
        "the retriever stage is overloaded (2 searches waiting or running in this replica, "
        "LLMFRAME_MAX_PENDING_SEARCHES=2); retry shortly"
    )
    assert [h.doc_id for h in first[1].hits][:1] == ["bees"]
    assert [h.doc_id for h in later.hits][:1] == ["tea"]  # served again once the two were answered
    assert (stats["pending"], stats["shed"]) == (0, 3)


@pytest.mark.parametrize("local, bm25_problem, mode", [
    (True, None, SearchMode.HYBRID), (True, "stats differ", SearchMode.DENSE),
    (False, None, SearchMode.BM25), (False, "stats differ", None),
])
def test_a_replica_warms_up_with_one_search_before_its_first_request(setup, monkeypatch, local, bm25_problem, mode):
    core, _ = setup
    asked = []
    answer = core._answer

    async def spy(served, asks):
        asked.extend(asks)
        return await answer(served, asks)

    monkeypatch.setattr(core, "_answer", spy)
    monkeypatch.setattr(core, "served", retriever.Served(core.served.version, core.served.facts, bm25_problem))
    monkeypatch.setattr(core.embedder, "provider", "local" if local else "openai")
    core.solo = 5
    asyncio.run(core._warm_up())
    expected = [] if mode is None else [retriever.Ask("warm up", mode, ResultLevel.DOCUMENT, 1)]
    assert asked == expected
    assert core.solo == (5 if mode is None else 0)


def test_a_failed_warm_up_is_logged_and_the_replica_still_starts(setup, monkeypatch, caplog):
    core, _ = setup

    async def broken(served, asks):
        raise RuntimeError("no disk")

    monkeypatch.setattr(core, "_answer", broken)
    asyncio.run(core._warm_up())
    assert "the warm-up search failed: no disk" in caplog.text


def test_a_batch_plan_observes_its_steps_for_metrics(setup):
    core, _ = setup

    def counts():
        return {step: REGISTRY.get_sample_value("llmframe_retrieval_step_seconds_count", {"step": step}) or 0.0
                for step in ("encode", "search", "read", "fusion", "graph")}

    before = counts()
    asks = [retriever.Ask(q, SearchMode.HYBRID, ResultLevel.DOCUMENT, 3) for q in QUERIES]
    asyncio.run(core._answer(core.served, asks))
    moved = {step: counts()[step] - before[step] for step in before}
    # one batch of five: encoded before its plan, one round of searches (both rankers), one read
    assert moved == {"encode": 1.0, "search": 1.0, "read": 1.0, "fusion": 1.0, "graph": 0.0}


def test_batch_sizes_are_observed_in_requests_and_items():
    from llmframe_ray.serve.replica import BatchStats

    def sample(suffix, unit):
        return REGISTRY.get_sample_value(f"llmframe_batch_size_{suffix}", {"stage": "rerank", "unit": unit}) or 0.0

    before = {(s, u): sample(s, u) for s in ("sum", "count") for u in ("requests", "pairs")}
    stats = BatchStats("rerank", "pairs")
    stats.record(3, 40)
    stats.record(1, 7)
    after = {(s, u): sample(s, u) - before[s, u] for s, u in before}
    assert after == {("sum", "requests"): 4.0, ("count", "requests"): 2.0, ("sum", "pairs"): 47.0, ("count", "pairs"): 2.0}
    assert stats.as_dict()["largest_batch_calls"] == 3
