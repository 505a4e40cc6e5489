"""Autoscaling on a real two-node Ray cluster (ray.cluster_utils.Cluster): under load the
Serve autoscaler adds Reranker replicas, and removes them once the load stops.

The load must keep requests at the Reranker, whatever the machine's speed: the tiny test
model scores ten pairs in about a millisecond, and the score cache would answer a repeated
query without the model. So every request asks a new question, the cache is off, and the
Reranker's batch window (user_config batch_wait_timeout_s, a setting users have) holds each
request for 0.1 s: six clients then keep several requests at the Reranker at any time."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from llmframe_ray.config import load_settings
from llmframe_ray.ingest.build import build_index
from llmframe_ray.models.embedder import OnnxEmbedder
from llmframe_ray.types import Document
from tests.serving import free_port, running_replicas

ray = pytest.importorskip("ray")
from ray import serve  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402

KEY = "autoscale-key"
DOCS = [
    Document(f"doc-{i}", title=f"Note {i}", text=f"Note {i} is about {topic} and how {topic} works in practice.")
    for i, topic in enumerate(["tides", "bread", "lava", "glaciers", "coffee", "bees", "chess", "rust", "sleep", "tea"])
]
AUTOSCALING = {
    "min_replicas": 1, "max_replicas": 2, "target_ongoing_requests": 0.5,
    "metrics_interval_s": 0.5, "look_back_period_s": 2, "upscale_delay_s": 1, "downscale_delay_s": 4,
}


def wait_until(predicate, timeout: float, what: str, seen: list) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}; replicas seen: {seen}")
        time.sleep(0.5)


def test_reranker_scales_up_under_load_and_back_down(tmp_path, model_dir, tiny_reranker_dir):
    from llmframe_ray.serve.app import AppArgs, build_app

    index = tmp_path / "index"
    build_index(DOCS, index, load_settings().params().index, OnnxEmbedder(model_dir, threads=2))
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False})
    cluster.add_node(num_cpus=2)
    ray.init(address=cluster.address, log_to_driver=False)
    stop = threading.Event()
    threads: list[threading.Thread] = []
    try:
        assert len([n for n in ray.nodes() if n["Alive"]]) == 2
        port = free_port()
        serve.start(proxy_location="HeadOnly", http_options={"host": "127.0.0.1", "port": port})
        args = AppArgs(
            index_dir=str(index),
            reranker=True,
            settings={
                "api_secret_key": KEY, "reranker_model": str(tiny_reranker_dir), "reranker_depth": 10,
                "reranker_cache_size": 0,
            },
            deployment_options={"Reranker": {
                "autoscaling_config": AUTOSCALING, "ray_actor_options": {"num_cpus": 1},
                "user_config": {"batch_wait_timeout_s": 0.1},
            }},
        )
        serve.run(build_app(args), name="llmframe", route_prefix="/")
        seen = [running_replicas("Reranker")]
        assert seen == [1]

        results: list[int] = []
        asked = iter(range(10**9))

        def load() -> None:
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120) as client:
                while not stop.is_set():
                    query = f"how does lava flow, question {next(asked)}"
                    r = client.post("/v1/search", headers={"X-API-Key": KEY}, json={"query": query, "rerank": True, "top_k": 3})
                    results.append(r.status_code)

        threads = [threading.Thread(target=load, daemon=True) for _ in range(6)]
        for t in threads:
            t.start()

        def grown() -> bool:
            seen.append(running_replicas("Reranker"))
            return seen[-1] == 2

        wait_until(grown, 120, "a second Reranker replica", seen)
        stop.set()
        for t in threads:
            t.join(timeout=120)

        def shrunk() -> bool:
            seen.append(running_replicas("Reranker"))
            return seen[-1] == 1

        wait_until(shrunk, 120, "the Reranker back at one replica", seen)
        assert results and set(results) == {200}
        assert max(seen) == 2 and seen[-1] == 1
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=120)
        serve.shutdown()
        ray.shutdown()
        cluster.shutdown()
