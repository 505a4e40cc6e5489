"""Faults under load on a real two-node Ray cluster (ray.cluster_utils.Cluster; marker `faults`,
about three minutes): the app runs as its DAG of deployments, every stage on the head node except
the shard groups, which keep one replica on each node. Under steady search load:

- the worker node (with a shard replica on it) is removed: no search fails;
- the Reranker is killed: no search fails; those answered while it is down say reranked: false;
- the Generator is killed mid-stream: that stream ends with a clean error event, and the next
  question is answered once Serve has replaced it.

Each case prints its counts and its time to recover (to the README's table); times are not
asserted."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

from llmframe_ray.config import load_settings
from llmframe_ray.ingest.build import build_index
from llmframe_ray.models.embedder import OnnxEmbedder
from llmframe_ray.types import Document
from tests.fakes.vendors import FakeOpenAI, Trickle
from tests.serving import free_port, running_replicas as running

ray = pytest.importorskip("ray")
from ray import serve  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402

pytestmark = pytest.mark.faults

KEY = "faults-key"
DOCS = [
    Document(f"doc-{i}", title=f"Note {i}", text=f"Note {i} is about {topic} and how {topic} works in practice.")
    for i, topic in enumerate(["tides", "bread", "lava", "glaciers", "coffee", "bees", "chess", "rust", "sleep", "tea"])
]
HEAD = {"resources": {"head": 0.01}}


def wait_until(predicate, timeout: float, what: str) -> float:
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.2)
    return time.monotonic() - start


def kill_replica(deployment: str) -> None:
    names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if f":{deployment}#" in a["name"] or f"{deployment}#" in a["name"]]
    assert names, f"no replica of {deployment}"
    ray.kill(ray.get_actor(names[0], namespace="serve"), no_restart=True)


class Load:
    """Clients sending searches back to back until stopped; every answer is kept."""

    def __init__(self, url: str, body: dict, clients: int = 3) -> None:
        self.url, self.body, self.results = url, body, []
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(clients)]

    def _run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=60) as client:
            while not self.stop.is_set():
                try:
                    r = client.post("/v1/search", headers={"X-API-Key": KEY}, json=self.body)
                    self.results.append((r.status_code, r.json() if r.status_code == 200 else r.text, time.monotonic()))
                except httpx.HTTPError as exc:
                    self.results.append((type(exc).__name__, str(exc), time.monotonic()))

    def __enter__(self) -> Load:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=120)

    def wait_for(self, n: int, timeout: float = 90) -> None:
        goal = len(self.results) + n
        wait_until(lambda: len(self.results) >= goal, timeout, f"{n} more answers")

    def failed(self) -> list:
        return [r for r in self.results if r[0] != 200]


@pytest.fixture(scope="module")
def app(tmp_path_factory, model_dir, tiny_reranker_dir):
    from llmframe_ray.serve.app import AppArgs, build_app

    index = tmp_path_factory.mktemp("faults") / "index"
    build_index(DOCS, index, load_settings().params().index, OnnxEmbedder(model_dir, threads=1))
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "resources": {"head": 1}, "include_dashboard": False})
    worker = cluster.add_node(num_cpus=2)
    ray.init(address=cluster.address, log_to_driver=False)
    vendor = FakeOpenAI().__enter__()
    try:
        port = free_port()
        serve.start(proxy_location="HeadOnly", http_options={"host": "127.0.0.1", "port": port})
        on_head = {"ray_actor_options": {"num_cpus": 0.1, **HEAD}}
        args = AppArgs(
            index_dir=str(index),
            reranker=True,
            settings={
                "api_secret_key": KEY, "reranker_model": str(tiny_reranker_dir), "reranker_depth": 10,
                "llm_providers": "openai", "openai_api_key": "sk-faults", "openai_base_url": vendor.base_url,
                "llm_max_attempts": 1,
            },
            shards_per_group=1,
            deployment_options={
                "Ingress": on_head, "Retriever": on_head, "QueryEncoder": on_head, "Generator": on_head,
                "Sessions": on_head, "Writer": on_head, "Reranker": {"ray_actor_options": {"num_cpus": 0.5, **HEAD}},
                "ShardGroup": {"num_replicas": 2, "max_replicas_per_node": 1, "ray_actor_options": {"num_cpus": 0.1}},
            },
        )
        serve.run(build_app(args), name="llmframe", route_prefix="/")
        yield {"url": f"http://127.0.0.1:{port}", "cluster": cluster, "worker": worker, "vendor": vendor}
    finally:
        serve.shutdown()
        ray.shutdown()
        cluster.shutdown()
        vendor.__exit__(None, None, None)


def test_a_killed_reranker_degrades_searches_instead_of_failing_them(app):
    with Load(app["url"], {"query": "how does lava flow", "rerank": True, "top_k": 3}) as load:
        load.wait_for(10)
        killed_at = time.monotonic()
        kill_replica("Reranker")
        recovered = wait_until(lambda: running("Reranker") == 1 and any(
            r[0] == 200 and r[1]["reranked"] and r[2] > killed_at + 0.5 for r in load.results), 120, "reranked answers again")
        load.wait_for(10)
    degraded = [r for r in load.results if r[0] == 200 and not r[1]["reranked"]]
    print(f"Reranker killed: {len(load.results)} searches, {len(load.failed())} failed, {len(degraded)} answered "
          f"unreranked, reranked again after {recovered:.1f} s")
    assert load.failed() == []


def test_losing_the_worker_node_with_a_shard_replica_fails_no_search(app):
    assert running("ShardGroup-0") == 2
    with Load(app["url"], {"query": "why iron rusts", "mode": "hybrid", "top_k": 3}) as load:
        load.wait_for(10)
        app["cluster"].remove_node(app["worker"])
        lost_at = time.monotonic()
        load.wait_for(30, timeout=180)
        served = time.monotonic() - lost_at
    print(f"worker node removed: {len(load.results)} searches, {len(load.failed())} failed; "
          f"30 more answered {served:.1f} s after the loss, {running('ShardGroup-0')} shard replica(s) running")
    assert load.failed() == []
    assert all(r[1]["hits"][0]["doc_id"] == "doc-7" for r in load.results)


def test_a_generator_killed_mid_stream_ends_the_stream_cleanly(app):
    vendor = app["vendor"]
    vendor.script.append(Trickle(tuple(f" w{i}" for i in range(200)), interval_s=0.05))
    events = []
    with httpx.Client(base_url=app["url"], timeout=60) as client:
        body = {"question": "What is note 2 about?", "stream": True}
        with client.stream("POST", "/v1/query", headers={"X-API-Key": KEY}, json=body) as response:
            assert response.status_code == 200
            name = None
            for line in response.iter_lines():
                if line.startswith("event: "):
                    name = line.removeprefix("event: ")
                elif line.startswith("data: "):
                    events.append((name, json.loads(line.removeprefix("data: "))))
                    if len(events) == 3:
                        kill_replica("Generator")
        killed_at = time.monotonic()
        names = [n for n, _ in events]
        assert names[:3] == ["delta"] * 3 and names[-1] == "error", names[-5:]
        assert events[-1][1] == {"type": "stream_failed", "message": "the generator stream failed"}

        def answered() -> bool:
            r = client.post("/v1/query", headers={"X-API-Key": KEY}, json={"question": "What is note 2 about?"})
            return r.status_code == 200

        wait_until(answered, 120, "an answer after the Generator was replaced")
    print(f"Generator killed mid-stream: the stream ended with an error event after {len(names) - 1} deltas; "
          f"answers again {time.monotonic() - killed_at:.1f} s after the kill")
