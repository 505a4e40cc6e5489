"""What every Serve replica needs: its thread count, batch statistics, and errors from other
replicas unwrapped to the typed error that was raised there."""

from __future__ import annotations

import math
from typing import Protocol, TypeVar

from llmframe_ray.telemetry import BATCH_SIZE


class Threaded(Protocol):
    threads: int | None

    def with_threads(self, threads: int): ...


P = TypeVar("P", bound=Threaded)


def replica_threads() -> int:
    """The CPUs Ray gave this replica, rounded up (at least 1)."""
    import ray

    cpus = ray.get_runtime_context().get_assigned_resources().get("CPU", 1.0)
    return max(1, math.ceil(cpus))


def with_replica_threads(params: P) -> P:
    """`params` with its thread count set to this replica's CPUs, unless LLMFRAME_NUM_THREADS
    set it."""
    return params if params.threads is not None else params.with_threads(replica_threads())


class BatchStats:
    """How many calls each batch of a stage held (and items, where a call carries several, in
    `unit`s); also observed as /metrics' llmframe_batch_size."""

    def __init__(self, stage: str, unit: str | None = None) -> None:
        self.sizes = BATCH_SIZE.labels(stage, "requests")
        self.item_sizes = None if unit is None else BATCH_SIZE.labels(stage, unit)
        self.batches = 0
        self.calls = 0
        self.items = 0
        self.largest = 0

    def record(self, calls: int, items: int | None = None) -> None:
        self.batches += 1
        self.calls += calls
        self.items += calls if items is None else items
        self.largest = max(self.largest, calls)
        self.sizes.observe(calls)
        if self.item_sizes is not None:
            self.item_sizes.observe(calls if items is None else items)

    def as_dict(self) -> dict[str, float]:
        mean = self.calls / self.batches if self.batches else 0.0
        return {
            "batches": self.batches,
            "calls": self.calls,
            "items": self.items,
            "mean_batch_calls": round(mean, 3),
            "mean_batch_items": round(self.items / self.batches, 3) if self.batches else 0.0,
            "largest_batch_calls": self.largest,
        }


def unwrap(exc: BaseException) -> BaseException:
    """The error a remote replica raised, without Ray's task-error wrappers around it."""
    from ray.exceptions import RayTaskError

    while isinstance(exc, RayTaskError) and isinstance(exc.cause, BaseException):
        exc = exc.cause
    return exc
