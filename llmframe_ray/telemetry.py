"""The process's Prometheus registry (served at GET /metrics by the HTTP app, api/metrics.py),
and the metrics of core parts that are not HTTP: the provider chain's attempts, fall-throughs and
circuit breakers (generate/fallback.py). Counted in the process that runs the chain: the app in
process, or the Generator replica under Serve."""

from __future__ import annotations

from typing import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge

REGISTRY = CollectorRegistry(auto_describe=True)

PROVIDER_ATTEMPTS = Counter("llmframe_provider_attempts", "Calls to each provider of the chain by outcome (ok, failed, skipped)",
                            ["provider", "outcome"], registry=REGISTRY)
FALLBACKS = Counter("llmframe_provider_fallbacks", "Answers written by a provider after an earlier one in the chain failed",
                    ["provider"], registry=REGISTRY)
BREAKER_OPEN = Gauge("llmframe_provider_breaker_open", "1 while the provider's circuit breaker is open (skipping calls)",
                     ["provider"], registry=REGISTRY)


def observe_chain_call(attempts: Iterable[tuple[str, str]], answered_index: int | None, answered_by: str | None,
                       breakers: Iterable[tuple[str, bool]]) -> None:
    """One call through the chain: its attempts as (provider, outcome), which provider answered
    (its position; None: none did), and each provider's breaker (name, open)."""
    for provider, outcome in attempts:
        PROVIDER_ATTEMPTS.labels(provider, outcome).inc()
    if answered_index is not None and answered_index > 0 and answered_by is not None:
        FALLBACKS.labels(answered_by).inc()
    for provider, is_open in breakers:
        BREAKER_OPEN.labels(provider).set(1 if is_open else 0)
