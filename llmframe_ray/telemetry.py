"""The process's Prometheus registry (served at GET /metrics by the HTTP app, api/metrics.py),
and the metrics of core parts that are not HTTP:

    llmframe_provider_attempts_total{provider, outcome}   the provider chain's calls (generate/fallback.py)
    llmframe_provider_fallbacks_total{provider}           answers written after an earlier provider failed
    llmframe_provider_breaker_open{provider}              1 while a provider's circuit breaker is open
    llmframe_retrieval_step_seconds{step}                 one retrieval plan's time by step (a plan
                                                          answers a batch of queries): encode,
                                                          search (shard searches), graph, read
                                                          (chunk reads), fusion (the plan's own work:
                                                          merging, fusion, ranking, hits)
    llmframe_batch_size{stage, unit}                      items per batch of a batching stage:
                                                          retrieve / encode / rerank, in requests,
                                                          and queries (encode) or pairs (rerank)
    llmframe_queue_length{stage}                          requests waiting for or in a stage's batch
                                                          in this process: retrieve, encode, rerank

Counted in the process that does the work: the app in process; under Serve each replica, whose
registries the Sessions replica adds up (serve/metrics_hub.py)."""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Any, Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

REGISTRY = CollectorRegistry(auto_describe=True)

PROVIDER_ATTEMPTS = Counter("llmframe_provider_attempts", "Calls to each provider of the chain by outcome (ok, failed, skipped)",
                            ["provider", "outcome"], registry=REGISTRY)
FALLBACKS = Counter("llmframe_provider_fallbacks", "Answers written by a provider after an earlier one in the chain failed",
                    ["provider"], registry=REGISTRY)
BREAKER_OPEN = Gauge("llmframe_provider_breaker_open", "1 while the provider's circuit breaker is open (skipping calls)",
                     ["provider"], registry=REGISTRY)
STEP_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0)
RETRIEVAL_STEP = Histogram("llmframe_retrieval_step_seconds", "Time of one retrieval plan (a batch of queries) by step",
                           ["step"], buckets=STEP_BUCKETS, registry=REGISTRY)
BATCH_SIZE = Histogram("llmframe_batch_size", "Items per batch of a batching stage", ["stage", "unit"],
                       buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512), registry=REGISTRY)
QUEUE = Gauge("llmframe_queue_length", "Requests waiting for or in a stage's batch in this process", ["stage"],
              registry=REGISTRY)


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


def watch_queue(stage: str, length: Callable[[], float]) -> None:
    """Report `length()` as the stage's queue length, read when the metrics are collected (no
    cost per request)."""
    QUEUE.labels(stage).set_function(length)


@contextmanager
def timed_step(step: str) -> Iterator[None]:
    """Observe the time of a retrieval step done outside a plan (a batch's queries encoded first)."""
    started = time.perf_counter()
    try:
        yield
    finally:
        RETRIEVAL_STEP.labels(step).observe(time.perf_counter() - started)


class StepClock:
    """Times a retrieval plan by step: `asked()` when the plan hands out requests (the time
    since the last mark was the plan's own work), `answered(step)` when their answers are in."""

    __slots__ = ("spent", "mark")

    def __init__(self) -> None:
        self.spent: dict[str, float] = {}
        self.mark = time.perf_counter()

    def _add(self, step: str) -> None:
        now = time.perf_counter()
        self.spent[step] = self.spent.get(step, 0.0) + now - self.mark
        self.mark = now

    def asked(self) -> None:
        self._add("fusion")

    def answered(self, step: str) -> None:
        self._add(step)

    def done(self) -> None:
        self._add("fusion")
        for step, seconds in self.spent.items():
            RETRIEVAL_STEP.labels(step).observe(seconds)


# A registry's state as plain data, for adding up the registries of several processes
# (serve/metrics_hub.py): [(name, type, help, [(sample name, ((label, value), ...), value), ...]), ...]
Snapshot = list[tuple[str, str, str, list[tuple[str, tuple[tuple[str, str], ...], float]]]]


def snapshot(registry: CollectorRegistry = REGISTRY) -> Snapshot:
    """Every sample of the registry except the `_created` timestamps (which do not add up)."""
    out: Snapshot = []
    for family in registry.collect():
        samples = [(s.name, tuple(sorted(s.labels.items())), float(s.value)) for s in family.samples
                   if not s.name.endswith("_created")]
        out.append((family.name, family.type, family.documentation, samples))
    return out


def describe(snapshots: Iterable[Snapshot]) -> Any:
    """A collector of the sum of several snapshots, sample by sample (counters, histograms and
    gauges alike: a gauge of several processes is their total)."""
    from prometheus_client.metrics_core import Metric

    families: dict[str, tuple[str, str, dict[tuple[str, tuple], float]]] = {}
    for shot in snapshots:
        for name, kind, documentation, samples in shot:
            _, _, values = families.setdefault(name, (kind, documentation, {}))
            for sample, labels, value in samples:
                values[sample, labels] = values.get((sample, labels), 0.0) + value

    class Sum:
        def collect(self) -> Iterable[Metric]:
            for name, (kind, documentation, values) in sorted(families.items()):
                metric = Metric(name, documentation, kind)
                for (sample, labels), value in sorted(values.items(), key=_sample_order):
                    metric.add_sample(sample, dict(labels), value)
                yield metric

    return Sum()


def _sample_order(item: tuple[tuple[str, tuple], float]) -> tuple:
    """A histogram's samples grouped by label set, buckets by bound, then count and sum."""
    (sample, labels), _ = item
    le = dict(labels).get("le")
    return (tuple(kv for kv in labels if kv[0] != "le"), sample.endswith("_sum"), sample.endswith("_count"),
            float(le) if le is not None else 0.0, sample)
