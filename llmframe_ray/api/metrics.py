"""Prometheus metrics of the HTTP app: `GET /metrics` (text format, every name `llmframe_...`).

    llmframe_http_requests_total{route, method, status}   requests answered (route: the path
                                                          template, "unmatched" for no route)
    llmframe_http_request_seconds{route, method}          latency, to the last byte (a stream's whole length)
    llmframe_http_requests_in_flight                      requests being answered now
    llmframe_stage_seconds{stage}                         each pipeline stage of a request, as its
                                                          `timings_ms` reports it: rewrite, retrieve,
                                                          rerank, compress, communities, generate
    llmframe_retrievals_total{mode, strategy}             ranked requests by mode and strategy
    llmframe_llm_tokens_total{provider, model, kind}      tokens of answers (kind: input, output)
    llmframe_llm_cost_usd_total{provider, model}          their cost (LLMFRAME_LLM_PRICES)
    llmframe_answers_total{provider, finish_reason}       answers by the provider that wrote them
    llmframe_index_version_info{version}                  1 for the index version last served
    and those of telemetry.py: provider attempts, fallbacks and breakers; retrieval plan steps
    (encode, search, graph, read, fusion); batch sizes and queue lengths of the batching stages.

The metrics live in one registry per process (telemetry.REGISTRY). In the app in process,
/metrics shows it; under Serve, the scrape shows the sum over every replica of the app
(serve/metrics_hub.py). The route is served without a key, like /healthz; it shows counts and
timings, never texts or keys.
"""

from __future__ import annotations

import time
from typing import Any, Mapping

from prometheus_client import Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

from llmframe_ray.telemetry import REGISTRY
LATENCY_BUCKETS = (0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

REQUESTS = Counter("llmframe_http_requests", "HTTP requests answered", ["route", "method", "status"], registry=REGISTRY)
LATENCY = Histogram("llmframe_http_request_seconds", "HTTP request latency to the last byte", ["route", "method"],
                    buckets=LATENCY_BUCKETS, registry=REGISTRY)
IN_FLIGHT = Gauge("llmframe_http_requests_in_flight", "HTTP requests being answered", registry=REGISTRY)
STAGE = Histogram("llmframe_stage_seconds", "Time of each pipeline stage of a request", ["stage"],
                  buckets=LATENCY_BUCKETS, registry=REGISTRY)
RETRIEVALS = Counter("llmframe_retrievals", "Ranked requests by mode and strategy", ["mode", "strategy"], registry=REGISTRY)
TOKENS = Counter("llmframe_llm_tokens", "LLM tokens of answers", ["provider", "model", "kind"], registry=REGISTRY)
COST = Counter("llmframe_llm_cost_usd", "LLM cost of answers in US dollars", ["provider", "model"], registry=REGISTRY)
ANSWERS = Counter("llmframe_answers", "Answers by provider and finish reason", ["provider", "finish_reason"], registry=REGISTRY)
VERSION = Gauge("llmframe_index_version_info", "The index version last served (value 1)", ["version"], registry=REGISTRY)

_served: list[str] = []


def observe_ranking(version: str, mode: str, strategy: str, timings_ms: Mapping[str, float]) -> None:
    RETRIEVALS.labels(mode, strategy).inc()
    for stage, value in timings_ms.items():
        if stage != "total":
            STAGE.labels(stage).observe(value / 1000.0)
    if not _served or _served[0] != version:
        if _served:
            VERSION.remove(_served.pop())
        _served.append(version)
        VERSION.labels(version).set(1)


def observe_stage(stage: str, seconds: float) -> None:
    STAGE.labels(stage).observe(seconds)


def observe_answer(provider: str, model: str, finish_reason: str, input_tokens: int, output_tokens: int,
                   cost_usd: float | None) -> None:
    ANSWERS.labels(provider, finish_reason).inc()
    TOKENS.labels(provider, model, "input").inc(input_tokens)
    TOKENS.labels(provider, model, "output").inc(output_tokens)
    if cost_usd:
        COST.labels(provider, model).inc(cost_usd)


CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4  # the classic text format every Prometheus reads


def exposition() -> bytes:
    return generate_latest(REGISTRY)


class RequestMetrics:
    """ASGI middleware: counts and times every HTTP request by its route template and status.
    A request refused before routing (a bad key, a body over the limit) is matched against
    `routes` here, so it counts under its route too."""

    def __init__(self, app: Any, routes: Any = ()) -> None:
        self.app, self.routes = app, routes

    def _route(self, scope: dict) -> str:
        found = getattr(scope.get("route"), "path", None)
        if found:
            return found
        from starlette.routing import Match

        for route in self.routes:
            if route.matches(scope)[0] is Match.FULL:
                return route.path
        return "unmatched"

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started, status = time.perf_counter(), [500]

        async def sending(message: dict) -> None:
            if message["type"] == "http.response.start":
                status[0] = int(message["status"])
            await send(message)

        IN_FLIGHT.inc()
        try:
            await self.app(scope, receive, sending)
        finally:
            IN_FLIGHT.dec()
            route, method = self._route(scope), scope.get("method", "")
            REQUESTS.labels(route, method, str(status[0])).inc()
            LATENCY.labels(route, method).observe(time.perf_counter() - started)
