"""The one-machine layout (`llmframe-ray serve`, deployments/local.yaml): retrieval inside each
of two Ingress replicas, no hop between replicas. Same answers as the in-process pipeline, and
concurrent requests in one batch that hold a bad query get their own answers."""

from __future__ import annotations

import concurrent.futures
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from llmframe_ray.config import load_settings
from llmframe_ray.graph.build import ensure_graph
from llmframe_ray.index.versions import IndexDirectory
from llmframe_ray.ingest.build import build_index
from llmframe_ray.models.embedder import OnnxEmbedder
from llmframe_ray.retrieve import compress
from llmframe_ray.retrieve.pipeline import Pipeline
from tests.integration.test_serve_app import AUTH, DOCS, KEY, QUERIES, local_hits, served_hits
from tests.serving import running_app

ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def served(tmp_path_factory, model_dir):
    overrides = {"api_secret_key": KEY, "fusion_depth": 10, "index_watch_interval_s": 0, "metrics_push_interval_s": 0.2}
    index_dir = tmp_path_factory.mktemp("local") / "index"
    build_index(DOCS, index_dir, load_settings(**overrides).params().index, OnnxEmbedder(model_dir, threads=2), shards=2)
    ensure_graph(index_dir)  # the graph strategies, answered where every shard is held
    with running_app(index_dir, overrides, local=True) as url, httpx.Client(base_url=url, timeout=60) as client:
        yield client, index_dir, overrides


def test_two_ingress_replicas_hold_the_retriever(served):
    client, _, _ = served
    ready = client.get("/readyz")
    assert ready.status_code == 200 and set(ready.json()["stages"]) == {"Retriever", "Generator", "Sessions", "Writer"}
    replicas = [a for a in ray.util.list_named_actors(all_namespaces=True) if "Ingress" in a["name"]]
    assert len(replicas) == 2, replicas


def test_search_equals_in_process_pipeline(served, model_dir):
    client, index_dir, overrides = served
    loaded = IndexDirectory(index_dir).load()
    pipeline = Pipeline(loaded.shards, OnnxEmbedder(model_dir, threads=1), load_settings(**overrides).params().retrieval)
    pipeline.load_graph(loaded.path, loaded.shard_ids)
    for mode in ("bm25", "dense", "hybrid"):
        for query in QUERIES:
            response = client.post("/v1/search", headers=AUTH, json={"query": query, "mode": mode, "top_k": 5})
            assert response.json()["version"] == loaded.version
            assert served_hits(response) == local_hits(pipeline.search(query, mode, 5)), (mode, query)
    for strategy in ("graph", "hybrid-graph"):
        for query in QUERIES:
            response = client.post("/v1/search", headers=AUTH, json={"query": query, "retrieval_strategy": strategy, "top_k": 5})
            assert served_hits(response) == local_hits(pipeline.search(query, strategy, 5)), (strategy, query)
    assert any(pipeline.search(q, "graph", 5) for q in QUERIES)  # some queries name entities
    found = client.get("/v1/graph/entities", headers=AUTH, params={"q": "Gulf Stream"}).json()["entities"]
    assert found[0]["name"] == "Gulf Stream"


def test_concurrent_requests_with_a_bad_query_among_them(served):
    client, _, _ = served
    bodies = [{"query": q, "mode": "dense", "top_k": 3} for q in QUERIES[:12]]
    bodies.insert(6, {"query": "tide " * 400, "mode": "dense", "top_k": 3})
    expected = {b["query"]: client.post("/v1/search", headers=AUTH, json=b) for b in bodies}
    with concurrent.futures.ThreadPoolExecutor(len(bodies)) as pool:
        for _ in range(3):
            answers = list(pool.map(lambda b: client.post("/v1/search", headers=AUTH, json=b), bodies))
            for body, response in zip(bodies, answers):
                alone = expected[body["query"]]
                assert response.status_code == alone.status_code, (body["query"][:20], response.text[:200])
                if response.status_code == 200:
                    assert served_hits(response) == served_hits(alone)
    assert expected["tide " * 400].status_code == 422
    stats = client.get("/v1/stats", headers=AUTH).json()
    assert stats["Retriever"]["largest_batch_calls"] >= 1


def test_compressed_scores_sentences_with_the_replicas_encoder(served, model_dir):
    """No Reranker here: compression embeds the sentences with the Ingress replica's own query
    encoder (RetrieverCore.embed_texts) and keeps them by the evidence rule, as the in-process
    stage functions do with the same model. Each passage is one sentence: it is kept whole or
    leaves the list; with a request's budget each keeps its one sentence."""
    client, index_dir, overrides = served
    settings = load_settings(**overrides)
    loaded = IndexDirectory(index_dir).load()
    embedder = OnnxEmbedder(model_dir, threads=1)
    hits = Pipeline(loaded.shards, embedder, settings.params().retrieval).search(QUERIES[0], "hybrid", 4)
    split = compress.Split.of_hits(hits)
    vectors = embedder.embed([QUERIES[0], *(compress.scoring_text(hits[p].title, s) for p, s in zip(split.owner, split.sentences))])
    params = settings.params().service.compression
    scores, rule = compress.sentence_scores(
        compress.cosines(vectors[0], vectors[1:]), compress.lexical_overlap(QUERIES[0], split.sentences), params, split.owner)
    assert rule
    expected = [(h.chunk_id, h.text) for h in compress.apply(hits, split, compress.select(split, scores, params, evidence=rule))]
    assert 0 < len(expected) <= len(hits)
    for budget, wanted in ((None, expected), (1, [(h.chunk_id, h.text) for h in hits])):
        body = {"query": QUERIES[0], "top_k": 4, "retrieval_strategy": "compressed", "compression_budget_tokens": budget}
        squeezed = client.post("/v1/search", headers=AUTH, json={k: v for k, v in body.items() if v is not None})
        assert squeezed.status_code == 200, squeezed.text
        answer = squeezed.json()
        assert answer["warnings"] == [] and "compress" in answer["timings_ms"]
        assert [(h["chunk_id"], h["text"]) for h in answer["hits"]] == wanted, budget


def scraped(client) -> dict[tuple[str, tuple], float]:
    families = text_string_to_metric_families(client.get("/metrics").text)
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for family in families for s in family.samples}


def test_one_scrape_adds_up_both_ingress_replicas_and_the_generator(served):
    """Whichever Ingress replica answers /metrics, it counts the requests of both, and the
    provider calls made in the Generator's process (serve/metrics_hub.py)."""
    client, _, _ = served
    searches = ("llmframe_http_requests_total", (("method", "POST"), ("route", "/v1/search"), ("status", "200")))
    attempts = ("llmframe_provider_attempts_total", (("outcome", "ok"), ("provider", "extractive")))
    retrieved = ("llmframe_batch_size_sum", (("stage", "retrieve"), ("unit", "requests")))
    time.sleep(1.0)  # every replica has pushed what the earlier tests sent
    before = scraped(client)
    n = 24
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda q: client.post("/v1/search", headers=AUTH, json={"query": q, "top_k": 3}),
                                [QUERIES[i % len(QUERIES)] for i in range(n)]))
    assert [a.status_code for a in answers] == [200] * n
    asked = client.post("/v1/query", headers=AUTH, json={"question": QUERIES[0], "top_k": 3})
    assert asked.status_code == 200, asked.text
    deadline, seen = time.monotonic() + 30, []
    while time.monotonic() < deadline:
        now = scraped(client)
        seen.append((now.get(searches, 0.0) - before.get(searches, 0.0), now.get(attempts, 0.0) - before.get(attempts, 0.0)))
        if seen[-1] == (n, 1):
            break
        time.sleep(0.2)
    assert seen[-1] == (n, 1), seen[-5:]
    for _ in range(4):  # the same totals from whichever replica answers
        again = scraped(client)
        assert (again[searches] - before.get(searches, 0.0), again[attempts] - before.get(attempts, 0.0)) == (n, 1)
    assert again[retrieved] - before.get(retrieved, 0.0) == n + 1  # the question's search too
    replicas = {labels[0][1]: value for (name, labels), value in again.items() if name == "llmframe_metrics_replicas"}
    assert replicas["Ingress"] == 2 and replicas["Generator"] == 1
    steps = {dict(labels)["step"] for (name, labels) in again if name == "llmframe_retrieval_step_seconds_count"}
    assert {"encode", "search", "read", "fusion"} <= steps
    assert again["llmframe_queue_length", (("stage", "retrieve"),)] == 0.0
