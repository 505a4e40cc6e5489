"""GET /metrics (Prometheus text, api/metrics.py) and the playground page's files (api/page.py),
over the HTTP app with in-process stages. The page in a real browser: tests/browser/."""

from __future__ import annotations

import re

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from llmframe_ray.api.page import STATIC
from llmframe_ray.config import load_settings
from llmframe_ray.index.versions import IndexDirectory
from llmframe_ray.ingest.build import publish_shards
from tests.unit.test_graph import AUTH, DIM, chunks, http_client


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    """test_graph's corpus with random vectors (no embedder: the requests use bm25)."""
    vectors = np.random.default_rng(3).normal(size=(len(chunks()), DIM)).astype(np.float32)
    root = tmp_path_factory.mktemp("metrics") / "index"
    publish_shards(IndexDirectory(root), chunks(), vectors, load_settings().params().index,
                   {"name": "random", "provider": "test", "dim": DIM, "max_length": 64}, shards=2)
    return root


def sample(client, name, **labels):
    """The value of one sample of /metrics (0.0 when it is not there yet)."""
    body = client.get("/metrics").text
    for family in text_string_to_metric_families(body):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return 0.0


def test_metrics_are_prometheus_text_with_llmframe_names(index):
    client, _ = http_client(index)
    client.post("/v1/search", json={"query": "Kiss and Tell", "mode": "bm25"}, headers=AUTH)
    response = client.get("/metrics")  # no key needed, like /healthz
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    names = {s.name for family in text_string_to_metric_families(response.text) for s in family.samples}
    assert names and all(name.startswith("llmframe_") for name in names)
    assert {"llmframe_http_requests_total", "llmframe_http_request_seconds_bucket", "llmframe_stage_seconds_count",
            "llmframe_retrievals_total", "llmframe_index_version_info", "llmframe_http_requests_in_flight"} <= names


def test_the_numbers_move_with_requests(index):
    client, pipeline = http_client(index)
    search = dict(route="/v1/search", method="POST", status="200")
    before = {
        "ok": sample(client, "llmframe_http_requests_total", **search),
        "denied": sample(client, "llmframe_http_requests_total", route="/v1/search", method="POST", status="401"),
        "latency": sample(client, "llmframe_http_request_seconds_count", route="/v1/search", method="POST"),
        "retrieve": sample(client, "llmframe_stage_seconds_count", stage="retrieve"),
        "bm25": sample(client, "llmframe_retrievals_total", mode="bm25", strategy="sparse"),
        "unmatched": sample(client, "llmframe_http_requests_total", route="unmatched", method="GET", status="404"),
        "answers": sample(client, "llmframe_answers_total", provider="extractive", finish_reason="stop"),
        "generate": sample(client, "llmframe_stage_seconds_count", stage="generate"),
        "search": sample(client, "llmframe_retrieval_step_seconds_count", step="search"),
        "encode": sample(client, "llmframe_retrieval_step_seconds_count", step="encode"),
        "attempts": sample(client, "llmframe_provider_attempts_total", provider="extractive", outcome="ok"),
    }
    for _ in range(3):
        assert client.post("/v1/search", json={"query": "Shirley Temple", "mode": "bm25"}, headers=AUTH).status_code == 200
    assert client.post("/v1/search", json={"query": "x"}, headers={"X-API-Key": "wrong-key-0123456789"}).status_code == 401
    assert client.get("/no/such/path").status_code == 404
    answer = client.post("/v1/query", json={"question": "Who played Corliss Archer?", "mode": "bm25"}, headers=AUTH)
    assert answer.status_code == 200, answer.text
    assert sample(client, "llmframe_http_requests_total", **search) == before["ok"] + 3
    assert sample(client, "llmframe_http_requests_total", route="/v1/search", method="POST", status="401") == before["denied"] + 1
    assert sample(client, "llmframe_http_request_seconds_count", route="/v1/search", method="POST") == before["latency"] + 4
    assert sample(client, "llmframe_stage_seconds_count", stage="retrieve") == before["retrieve"] + 4  # 3 searches, 1 answer
    assert sample(client, "llmframe_retrievals_total", mode="bm25", strategy="sparse") == before["bm25"] + 4
    assert sample(client, "llmframe_http_requests_total", route="unmatched", method="GET", status="404") == before["unmatched"] + 1
    assert sample(client, "llmframe_answers_total", provider="extractive", finish_reason="stop") == before["answers"] + 1
    assert sample(client, "llmframe_stage_seconds_count", stage="generate") == before["generate"] + 1
    # each BM25 retrieval is one plan with one round of shard searches and no encoding
    assert sample(client, "llmframe_retrieval_step_seconds_count", step="search") == before["search"] + 4
    assert sample(client, "llmframe_retrieval_step_seconds_count", step="encode") == before["encode"]
    assert sample(client, "llmframe_provider_attempts_total", provider="extractive", outcome="ok") == before["attempts"] + 1
    version = answer.json()["version"]
    assert sample(client, "llmframe_index_version_info", version=version) == 1.0
    assert sample(client, "llmframe_http_requests_in_flight") == 1.0  # the scrape itself


def test_the_page_and_its_files_need_no_key_and_load_nothing_from_elsewhere(index):
    client, _ = http_client(index)
    page = client.get("/")
    assert page.status_code == 200 and page.headers["content-type"] == "text/html; charset=utf-8"
    assert "default-src 'self'" in page.headers["content-security-policy"]
    assert re.findall(r'(?:src|href)="([^"]+)"', page.text) == ["/static/style.css", "/static/app.js"]
    for name, kind in (("app.js", "text/javascript"), ("style.css", "text/css")):
        response = client.get(f"/static/{name}")
        assert response.status_code == 200 and response.headers["content-type"].startswith(kind)
    for path in sorted(STATIC.iterdir()):
        assert not re.search(r"https?://", path.read_text()), f"{path.name} names another origin"
    for bad in ("/static/missing.js", "/static/..%2Fpage.py", "/static/.hidden.js", "/static/page.py"):
        response = client.get(bad)
        assert response.status_code == 404, bad
    assert client.get("/static/missing.js").json()["error"] == {"type": "not_found", "message": "no static file 'missing.js'", "field": None}


def test_the_grafana_dashboard_queries_only_metrics_the_app_exports(index):
    import json
    from pathlib import Path

    client, _ = http_client(index)
    client.post("/v1/search", json={"query": "Kiss and Tell", "mode": "bm25"}, headers=AUTH)
    asked = client.post("/v1/query", json={"question": "Who starred in Kiss and Tell?", "mode": "bm25"}, headers=AUTH)
    assert asked.status_code == 200, asked.text
    exported = {s.name for family in text_string_to_metric_families(client.get("/metrics").text) for s in family.samples}
    exported |= {"llmframe_llm_cost_usd_total",  # with a priced model
                 "llmframe_provider_fallbacks_total",  # after a provider failed
                 "llmframe_batch_size_sum", "llmframe_batch_size_count", "llmframe_queue_length",  # Serve's batching stages
                 "llmframe_metrics_replicas"}  # under Serve (serve/metrics_hub.py; tests/integration/test_serve_local_layout.py)
    dashboard = json.loads((Path(__file__).resolve().parents[2] / "deployments" / "grafana-dashboard.json").read_text())
    used = {name for panel in dashboard["panels"] for target in panel["targets"]
            for name in re.findall(r"llmframe_[a-z_]+", target["expr"])}
    assert used and used <= exported, sorted(used - exported)
