"""Parity on SciFact: the served app's /v1/search returns exactly the in-process pipeline's
top 100 (documents, chunks, ranks per ranker, scores) for all 300 test queries in every mode,
in both layouts: the DAG of deployments, and retrieval inside the Ingress replicas (the layout
of `llmframe-ray serve`).

Requests go one at a time, so each query is embedded alone, as the in-process embedder does
(1 thread, as a replica's CPU share gives it)."""

import httpx
import pytest

from llmframe_ray.config import load_settings
from llmframe_ray.eval.beir import load_beir
from llmframe_ray.eval.runner import cached_index
from llmframe_ray.models.embedder import OnnxEmbedder
from llmframe_ray.retrieve.pipeline import Pipeline
from tests.conftest import SHARED_EVAL
from tests.serving import running_app

SCIFACT = SHARED_EVAL / "scifact"
KEY = "scifact-parity"


@pytest.mark.quality
@pytest.mark.parametrize("local", [False, True], ids=["dag", "local"])
def test_served_search_equals_pipeline_on_scifact(model_dir, embedder, local):
    if not SCIFACT.is_dir():
        pytest.fail(f"{SCIFACT} is missing: the quality test needs ../shared/eval beside the checkout")
    settings = load_settings()
    dataset = load_beir(SCIFACT)
    index = cached_index(dataset, settings.params().index, embedder, settings.indexes_dir)
    pipeline = Pipeline.open(index, OnnxEmbedder(model_dir, threads=1), settings.params().retrieval)
    mismatches = []
    with running_app(index, {"api_secret_key": KEY}, local=local) as url, httpx.Client(base_url=url, timeout=120) as client:
        for mode in ("bm25", "dense", "hybrid"):
            for qid, query in dataset.queries.items():
                response = client.post("/v1/search", headers={"X-API-Key": KEY}, json={"query": query, "mode": mode, "top_k": 100})
                assert response.status_code == 200, response.text
                served = [(h["doc_id"], h["chunk_id"], h["rank"], h["ranks"]) for h in response.json()["hits"]]
                local_hits = pipeline.search(query, mode, 100)
                local = [(h.doc_id, h.chunk_id, h.rank, dict(h.ranks)) for h in local_hits]
                scores_equal = [h["score"] for h in response.json()["hits"]] == pytest.approx([h.score for h in local_hits], rel=1e-6, abs=1e-6)
                if served != local or not scores_equal:
                    mismatches.append((mode, qid))
    assert mismatches == []
