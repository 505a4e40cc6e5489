"""The metrics hub's sum of every replica's registry (serve/metrics_hub.py), without a
cluster: registries of two "replicas" pushed, then one scrape text."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.parser import text_string_to_metric_families

from llmframe_ray.telemetry import snapshot

hub = pytest.importorskip("llmframe_ray.serve.metrics_hub")


def replica(requests: int, latencies: list[float], in_flight: float, route: str = "/v1/search"):
    registry = CollectorRegistry(auto_describe=True)
    count = Counter("llmframe_http_requests", "requests", ["route", "status"], registry=registry)
    latency = Histogram("llmframe_http_request_seconds", "latency", ["route"], buckets=(0.01, 0.1), registry=registry)
    Gauge("llmframe_http_requests_in_flight", "in flight", registry=registry).set(in_flight)
    count.labels(route, "200").inc(requests)
    for seconds in latencies:
        latency.labels(route).observe(seconds)
    return snapshot(registry)


def parse(text: bytes) -> dict[tuple[str, tuple], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text.decode()) for s in family.samples
    }


def sources(now: float, second_seen: float):
    return {
        "a": hub.Source("Ingress", now, replica(3, [0.005, 0.05], 2)),
        "b": hub.Source("Ingress", second_seen, replica(4, [0.5], 1)),
        "g": hub.Source("Generator", now, replica(0, [], 0, route="/none")),
    }


def test_a_scrape_adds_up_every_replica():
    samples = parse(hub.merged_text(sources(100.0, 99.0), 100.0, 5.0))
    route = (("route", "/v1/search"),)
    assert samples["llmframe_http_requests_total", (("route", "/v1/search"), ("status", "200"))] == 7.0
    assert samples["llmframe_http_request_seconds_count", route] == 3.0
    assert samples["llmframe_http_request_seconds_sum", route] == pytest.approx(0.555)
    buckets = {le: samples["llmframe_http_request_seconds_bucket", (("le", le), ("route", "/v1/search"))]
               for le in ("0.01", "0.1", "+Inf")}
    assert buckets == {"0.01": 1.0, "0.1": 2.0, "+Inf": 3.0}  # cumulative, as each replica's were
    assert samples["llmframe_http_requests_in_flight", ()] == 3.0
    assert samples["llmframe_metrics_replicas", (("deployment", "Generator"),)] == 1.0
    assert samples["llmframe_metrics_replicas", (("deployment", "Ingress"),)] == 2.0
    assert not any(name.endswith("_created") for name, _ in samples)


def test_a_silent_replica_keeps_its_counts_but_not_its_gauges():
    # "b" last pushed 16 s ago: over three 5-second intervals
    samples = parse(hub.merged_text(sources(100.0, 84.0), 100.0, 5.0))
    assert samples["llmframe_http_requests_total", (("route", "/v1/search"), ("status", "200"))] == 7.0
    assert samples["llmframe_http_request_seconds_count", (("route", "/v1/search"),)] == 3.0
    assert samples["llmframe_http_requests_in_flight", ()] == 2.0
    assert samples["llmframe_metrics_replicas", (("deployment", "Ingress"),)] == 1.0


def test_the_hub_keeps_the_latest_push_of_each_replica_and_names_the_interval():
    metrics = hub.MetricsHub(2.5)
    assert metrics.push("a", "Ingress", replica(1, [], 0)) == 2.5
    assert metrics.push("a", "Ingress", replica(5, [], 0)) == 2.5  # cumulative state: replaces, never adds
    text = metrics.exposition("b", "Ingress", replica(2, [], 0))
    assert parse(text)["llmframe_http_requests_total", (("route", "/v1/search"), ("status", "200"))] == 7.0


def test_outside_a_replica_nothing_is_pushed():
    hub.start_pushing()
    assert hub._tasks == []


def test_a_scrape_the_hub_cannot_answer_gets_this_replicas_own_metrics(monkeypatch):
    import asyncio
    from types import SimpleNamespace

    from llmframe_ray.telemetry import PROVIDER_ATTEMPTS

    class Down:
        class exposition:
            @staticmethod
            def remote(*args):
                raise RuntimeError("Sessions replica restarting")

    context = SimpleNamespace(replica_id=SimpleNamespace(unique_id="r1"))
    monkeypatch.setattr(hub.serve, "get_replica_context", lambda: context)
    PROVIDER_ATTEMPTS.labels("fallback-test", "ok").inc()
    text = asyncio.run(hub.scrape(Down, "Ingress")).decode()
    assert text.startswith("# the app-wide sum is unavailable (RuntimeError); these are one Ingress replica's metrics\n")
    assert parse(text.encode())["llmframe_provider_attempts_total", (("outcome", "ok"), ("provider", "fallback-test"))] >= 1.0
