"""The Serve app on a real local Ray (2 CPUs) behind real HTTP: parity with the in-process
pipeline, auth and validation errors, SSE, index version switches under load, a dying replica."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import httpx_sse
import pytest

from llmframe_ray.config import load_settings
from llmframe_ray.graph.build import ensure_graph
from llmframe_ray.index.versions import IndexDirectory
from llmframe_ray.ingest.build import build_index
from llmframe_ray.models.cross_encoder import CrossEncoder
from llmframe_ray.models.embedder import OnnxEmbedder
from llmframe_ray.retrieve.pipeline import Pipeline
from llmframe_ray.types import Document
from tests.serving import running_app

ray = pytest.importorskip("ray")

KEY = "integration-key-42"
AUTH = {"X-API-Key": KEY}
TOPICS = {
    "tides": "Ocean tides are driven mainly by the gravitational pull of the Moon and, less, the Sun.",
    "lunar": "The Moon's phases follow its orbit: new moon, waxing crescent, first quarter and full moon.",
    "currents": "Ocean currents such as the Gulf Stream move heat from the equator towards the poles.",
    "eclipse": "A solar eclipse happens when the Moon passes between Earth and the Sun and hides it.",
    "bikes": "Commuting by bicycle improves cardiovascular health and cuts urban traffic.",
    "sourdough": "A sourdough starter is a culture of wild yeast and lactic acid bacteria used to leaven bread.",
    "part": "Part ZQ7731 sits on shelf 14 next to the loading dock of the north warehouse.",
    "volcano": "Basaltic lava flows erupt from shield volcanoes such as Mauna Loa on Hawaii.",
    "glacier": "Glaciers flow slowly downhill under their own weight, carving U-shaped valleys.",
    "coffee": "Espresso is brewed by forcing hot water through finely ground coffee under pressure.",
    "tea": "Green tea leaves are steamed or pan-fired soon after picking to stop oxidation.",
    "python": "Python's json module parses JSON text into dictionaries, lists, strings and numbers.",
    "faiss": "FAISS searches dense vectors by inner product, exactly or with HNSW and IVF indexes.",
    "bm25": "BM25 ranks documents by term frequency, inverse document frequency and length.",
    "rrf": "Reciprocal rank fusion adds 1/(k + rank) over rankers to merge ranked lists.",
    "ray": "Ray Serve batches requests across callers and scales replicas with load.",
    "sleep": "Adults need seven to nine hours of sleep; deep sleep consolidates memory.",
    "bees": "Honey bees communicate the direction of flowers with a waggle dance.",
    "chess": "In chess, castling moves the king two squares towards a rook, which jumps over it.",
    "rust": "Iron rusts when it reacts with oxygen and water to form hydrated iron oxides.",
}
DOCS = [Document(doc_id, text=text, title=doc_id.capitalize()) for doc_id, text in TOPICS.items()]
QUERIES = [
    "what causes tides", "phases of the moon", "Gulf Stream heat", "solar eclipse", "cycling health",
    "wild yeast bread", "ZQ7731", "lava shield volcano", "how do glaciers move", "espresso pressure",
    "green tea oxidation", "parse JSON in Python", "vector search HNSW", "inverse document frequency",
    "merge ranked lists", "batching requests", "how much sleep", "bee dance", "castling rules", "why iron rusts",
]
NEW_DOC = Document("kelp", title="Kelp", text="Kelp forests grow along cold rocky coasts, up to half a metre a day.")


@dataclass
class App:
    url: str
    index_dir: Path
    overrides: dict


@pytest.fixture(scope="module")
def app(tmp_path_factory, model_dir, tiny_reranker_dir):
    overrides = {
        "api_secret_key": KEY, "reranker_model": str(tiny_reranker_dir), "reranker_depth": 8, "reranker_enabled": False,
        "fusion_depth": 10, "index_watch_interval_s": 0.5,
    }
    index_dir = tmp_path_factory.mktemp("serve") / "index"
    build_index(DOCS, index_dir, load_settings(**overrides).params().index, OnnxEmbedder(model_dir, threads=2), shards=2)
    ensure_graph(index_dir)  # one shard per group: the Retriever holds the graph
    # a card whose training corpus sits at cosine 0.8 from this index: fused with weight 0.8,
    # which the served app learns from the Reranker's card and the Retriever's centroid
    overrides["reranker_model"] = str(reranker_at(tiny_reranker_dir, index_dir, 0.8, tmp_path_factory.mktemp("ce")))
    with running_app(index_dir, overrides, reranker=True, shards_per_group=1) as url:
        yield App(url, index_dir, overrides)


@pytest.fixture(scope="module")
def client(app):
    with httpx.Client(base_url=app.url, timeout=60) as c:
        yield c


def reranker_at(tiny: Path, index_dir: Path, cosine: float, folder: Path) -> Path:
    """A copy of the tiny reranker whose card puts its training corpus at `cosine` from the index."""
    import shutil

    import numpy as np

    from llmframe_ray.index.domain import card_domain, centroid

    shards = IndexDirectory(index_dir).load().shards
    home = centroid(shards)
    other = np.zeros_like(home)
    other[int(np.argmin(np.abs(home)))] = 1.0
    other -= (other @ home) * home
    vector = cosine * home + np.sqrt(1 - cosine**2) * other / np.linalg.norm(other)
    shutil.copytree(tiny, folder, dirs_exist_ok=True)
    card = {**json.loads((tiny / "reranker.json").read_text()), "domain": card_domain(vector, shards[0].manifest.model)}
    (folder / "reranker.json").write_text(json.dumps(card))
    return folder


def in_process(app, model_dir, tiny_reranker_dir) -> tuple[Pipeline, str]:
    """The in-process pipeline over the version the app serves, with replicas' thread counts."""
    settings = load_settings(**app.overrides)
    loaded = IndexDirectory(app.index_dir).load()
    embedder = OnnxEmbedder(model_dir, threads=1)  # QueryEncoder: 0.5 CPU -> 1 thread
    reranker = CrossEncoder(Path(settings.reranker_model), threads=1, batch_size=settings.reranker_batch_size)
    params = settings.params()
    return Pipeline(loaded.shards, embedder, params.retrieval, reranker, params.rerank), loaded.version


def served_hits(response: httpx.Response) -> list[tuple]:
    assert response.status_code == 200, response.text
    return [(h["doc_id"], h["chunk_id"], h["rank"], h["ranks"], h["score"]) for h in response.json()["hits"]]


def local_hits(hits) -> list[tuple]:
    return [(h.doc_id, h.chunk_id, h.rank, dict(h.ranks), pytest.approx(h.score, rel=1e-5, abs=1e-6)) for h in hits]


@pytest.mark.parametrize("rerank", [False, True])
def test_search_equals_in_process_pipeline_for_every_query_and_mode(app, client, model_dir, tiny_reranker_dir, rerank):
    pipeline, version = in_process(app, model_dir, tiny_reranker_dir)
    assert abs(pipeline.rerank_weight - 0.8) < 1e-4  # the domain weight is what both sides use
    for mode in ("bm25", "dense", "hybrid"):
        for query in QUERIES:
            response = client.post("/v1/search", headers=AUTH, json={"query": query, "mode": mode, "top_k": 5, "rerank": rerank})
            assert response.json()["version"] == version
            assert served_hits(response) == local_hits(pipeline.search(query, mode, 5, rerank=rerank)), (mode, query)


def test_chunk_level_equals_in_process(app, client, model_dir, tiny_reranker_dir):
    pipeline, _ = in_process(app, model_dir, tiny_reranker_dir)
    for query in QUERIES[:5]:
        response = client.post("/v1/search", headers=AUTH, json={"query": query, "level": "chunk", "top_k": 7})
        assert served_hits(response) == local_hits(pipeline.search(query, "hybrid", 7, "chunk"))


def test_advanced_pipeline_over_serve_equals_in_process(app, client, model_dir, tiny_reranker_dir):
    """alpha, PRF and offline multi-query through the DAG (Retriever, ShardGroups, Generator)
    rank as the in-process pipeline with the same core functions; compressed keeps the hits."""
    from llmframe_ray.generate.rewriting import offline_rewrite
    from llmframe_ray.retrieve.rewrite import QueryRewrite, expand, feedback_terms, fuse_hit_lists, query_weights

    pipeline, _ = in_process(app, model_dir, tiny_reranker_dir)
    rewrite = load_settings(**app.overrides).params().service.rewrite
    query = QUERIES[0]
    for body, local in [
        ({"retrieval_strategy": "sparse"}, pipeline.search(query, "bm25", 5)),
        ({"alpha": 0.8}, pipeline.search(query, "hybrid", 5, alpha=0.8)),
    ]:
        assert served_hits(client.post("/v1/search", headers=AUTH, json={"query": query, "top_k": 5, **body})) == local_hits(local)
    first = pipeline.search(query, "hybrid", 5)
    expanded = expand(query, feedback_terms(query, first, rewrite.prf_docs, rewrite.prf_terms))
    prf = client.post("/v1/search", headers=AUTH, json={"query": query, "top_k": 5, "query_rewrite": "prf"})
    assert prf.json()["rewrites"] == [expanded]
    expected = fuse_hit_lists([first, pipeline.search(expanded, "hybrid", 5)], [1.0, rewrite.prf_weight], rewrite.rrf_k, 5)
    assert served_hits(prf) == local_hits(expected)
    question = "ocean tides or sourdough starters?"
    variants = offline_rewrite(QueryRewrite.MULTI_QUERY, question, [], rewrite).queries
    multi = client.post("/v1/search", headers=AUTH, json={"query": question, "top_k": 5, "query_rewrite": "multi-query"})
    assert multi.json()["rewrites"] == list(variants[1:]) and len(variants) > 1
    weights = query_weights(len(variants), rewrite, offline=True)
    fused = fuse_hit_lists([pipeline.search(v, "hybrid", 5) for v in variants], weights, rewrite.rrf_k, 5)
    assert served_hits(multi) == local_hits(fused)
    squeezed = client.post("/v1/search", headers=AUTH, json={"query": query, "top_k": 5, "retrieval_strategy": "compressed",
                                                              "compression_budget_tokens": 5})
    assert squeezed.status_code == 200, squeezed.text
    assert [h["chunk_id"] for h in squeezed.json()["hits"]] == [h.chunk_id for h in first]
    assert [h["text"] for h in squeezed.json()["hits"]] == [h.text for h in first]  # one sentence each: kept whole
    assert "compress" in squeezed.json()["timings_ms"]
    follow = client.post("/v1/query", headers=AUTH, json={"question": "and its moons?", "session_id": "adv-1", "query_rewrite": "conversational"})
    assert follow.status_code == 200 and follow.json()["rewrites"] == []  # a new session: nothing to carry


def test_graph_strategies_over_serve_equal_in_process(app, client, model_dir, tiny_reranker_dir):
    """Shards spread over two ShardGroups: the Retriever answers the graph ranker itself, with
    document ids as keys, and fuses its list with the groups' lists as the in-process pipeline does."""
    pipeline, version = in_process(app, model_dir, tiny_reranker_dir)
    loaded = IndexDirectory(app.index_dir).load()
    pipeline.load_graph(loaded.path, loaded.shard_ids)
    for query in QUERIES:
        for strategy in ("graph", "hybrid-graph"):
            body = {"query": query, "retrieval_strategy": strategy, "top_k": 5}
            assert served_hits(client.post("/v1/search", headers=AUTH, json=body)) == local_hits(pipeline.search(query, strategy, 5)), (strategy, query)
    entity = client.get("/v1/graph/entities", headers=AUTH, params={"q": "Mauna Loa"}).json()["entities"][0]
    detail = client.get(f"/v1/graph/entity/{entity['id']}", headers=AUTH).json()
    assert [m["doc_id"] for m in detail["mentions"]] == ["volcano"]
    assert "Hawaii" in {n["name"] for n in detail["neighbours"]}


def test_errors_over_http(client):
    assert client.post("/v1/search", json={"query": "moon"}).status_code == 401
    assert client.post("/v1/search", headers={"Authorization": "Bearer nope"}, json={"query": "moon"}).status_code == 401
    cases = [
        ({"query": " "}, "query: must not be empty or whitespace only"),
        ({"query": "moon", "top_k": 0}, "top_k: Input should be greater than or equal to 1"),
        ({"query": "moon", "top_k": 101}, "top_k: must be at most 100 (LLMFRAME_MAX_TOP_K), got 101"),
        ({"query": "moon", "mode": "semantic"}, "mode: Input should be 'bm25', 'dense' or 'hybrid'"),
    ]
    for body, message in cases:
        response = client.post("/v1/search", headers=AUTH, json=body)
        assert (response.status_code, response.json()["error"]["message"]) == (422, message)
    too_long = client.post("/v1/search", headers=AUTH, json={"query": "tide " * 400, "mode": "dense"})
    assert too_long.status_code == 422 and too_long.json()["error"]["field"] == "query"
    assert "the embedding model accepts at most 256" in too_long.json()["error"]["message"]
    big = client.post("/v1/search", headers={**AUTH, "Content-Type": "application/json"}, content=b'{"query": "' + b"a" * 70000 + b'"}')
    assert big.status_code == 413
    assert big.json()["error"]["type"] == "request_too_large"


def test_readyz_and_index(app, client):
    ready = client.get("/readyz")
    assert ready.status_code == 200
    assert set(ready.json()["stages"]) == {
        "QueryEncoder", "Retriever", "Generator", "Sessions", "Writer", "Reranker", "ShardGroup-0", "ShardGroup-1",
    }
    info = client.get("/v1/index", headers=AUTH).json()
    assert info["version"] == IndexDirectory(app.index_dir).current_version()
    assert info["shards"] == 2 and info["problem"] is None
    assert sum(s["manifest"]["counts"]["documents"] for s in info["shard_manifests"] if not s["empty"]) >= len(DOCS)


def test_query_streams_server_sent_events(client):
    question = "What causes the ocean tides?"
    whole = client.post("/v1/query", headers=AUTH, json={"question": question, "top_k": 3})
    assert whole.status_code == 200, whole.text
    answer = whole.json()
    assert answer["cited"] and answer["citations"][0]["doc_id"] == "tides"
    with httpx_sse.connect_sse(client, "POST", "/v1/query", headers=AUTH, json={"question": question, "top_k": 3, "stream": True}) as source:
        events = [(event.event, json.loads(event.data)) for event in source.iter_sse()]
    assert [name for name, _ in events][-2:] == ["citations", "done"]
    assert "".join(data["text"] for name, data in events if name == "delta") == answer["answer"]
    assert events[-2][1]["citations"] == answer["citations"]


def run_load(url: str, body: dict, stop: threading.Event, results: list, clients: int = 4) -> list[threading.Thread]:
    def loop():
        with httpx.Client(base_url=url, timeout=60) as c:
            while not stop.is_set():
                try:
                    r = c.post("/v1/search", headers=AUTH, json=body)
                    data = r.json()
                    results.append((r.status_code, data.get("version"), [h["doc_id"] for h in data.get("hits", [])]))
                except Exception as exc:  # a dropped connection is a failed request too
                    results.append((0, None, repr(exc)))

    threads = [threading.Thread(target=loop, daemon=True) for _ in range(clients)]
    for t in threads:
        t.start()
    return threads


def wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def test_version_switch_under_load_drops_nothing(app, client, model_dir):
    settings = load_settings(**app.overrides)
    embedder = OnnxEmbedder(model_dir, threads=1)
    old = IndexDirectory(app.index_dir).current_version()
    stop, results = threading.Event(), []
    threads = run_load(app.url, {"query": "kelp forests on rocky coasts", "mode": "hybrid", "top_k": 3}, stop, results)
    try:
        wait_for(lambda: len(results) >= 20, 60, "requests on the old version")
        # a version with another shard count cannot be served by this deployment: it is refused
        wrong = build_index(DOCS + [NEW_DOC], app.index_dir, settings.params().index, embedder, shards=3)
        wait_for(lambda: (client.get("/v1/index", headers=AUTH).json()["problem"] or "").startswith(f"version {wrong} is not served"), 30, "the refusal")
        assert client.get("/v1/index", headers=AUTH).json()["version"] == old
        new = build_index(DOCS + [NEW_DOC], app.index_dir, settings.params().index, embedder, shards=2)
        wait_for(lambda: any(v == new for _, v, _ in results[-8:]), 60, "requests on the new version")
        count = len(results)
        wait_for(lambda: len(results) >= count + 20, 60, "more requests on the new version")
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)
    failed = [r for r in results if r[0] != 200]
    assert failed == []
    assert {v for _, v, _ in results} == {old, new}
    assert all("kelp" not in docs for _, v, docs in results if v == old)
    assert all(docs[0] == "kelp" for _, v, docs in results if v == new)
    info = client.get("/v1/index", headers=AUTH).json()
    assert (info["version"], info["problem"]) == (new, None)


def test_a_killed_shard_replica_is_replaced_without_failed_requests(app):
    stop, results = threading.Event(), []
    threads = run_load(app.url, {"query": "why iron rusts", "mode": "dense", "top_k": 3}, stop, results, clients=2)
    try:
        wait_for(lambda: len(results) >= 10, 60, "requests before the kill")
        names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if "ShardGroup-0" in a["name"]]
        assert len(names) == 1, names
        ray.kill(ray.get_actor(names[0], namespace="serve"), no_restart=True)
        count = len(results)
        wait_for(lambda: len(results) >= count + 20, 90, "requests after the kill")
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)
    assert [r for r in results if r[0] != 200] == []
    assert all(docs[0] == "rust" for _, _, docs in results)


def test_openai_client_against_the_served_app(app):
    import openai

    client = openai.OpenAI(base_url=f"{app.url}/v1", api_key=KEY)
    question = [{"role": "user", "content": "What causes the ocean tides?"}]
    reply = client.chat.completions.create(model="any", messages=question)
    text = reply.choices[0].message.content
    assert text.startswith("Extractive answer (no language model configured)")
    citations = reply.model_extra["citations"]
    assert citations and citations[0]["doc_id"] == "tides" and f"[{citations[0]['n']}]" in text
    assert reply.model_extra["llmframe"]["provider"] == "extractive"
    chunks = list(client.chat.completions.create(model="any", messages=question, stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    assert [c for c in chunks if c.choices and c.choices[0].finish_reason][0].model_extra["citations"] == citations
    assert chunks[-1].usage.completion_tokens == reply.usage.completion_tokens


def test_sessions_and_usage_over_serve(client):
    first = client.post("/v1/query", headers=AUTH, json={"question": "What causes the ocean tides?", "session_id": "s-1"}).json()
    follow = client.post("/v1/query", headers=AUTH, json={"question": "And the phases of the moon?", "session_id": "s-1"}).json()
    alone = client.post("/v1/query", headers=AUTH, json={"question": "And the phases of the moon?"}).json()
    assert follow["usage"]["input_tokens"] > alone["usage"]["input_tokens"]
    assert first["usage"]["cost_usd"] == 0.0 and first["provider"] == "extractive"
    stats = client.get("/v1/stats", headers=AUTH).json()
    assert stats["Generator"]["extractive/extractive-v1"]["answers"] >= 3
