"""What every Serve replica needs: its settings, its thread count, batch statistics, and
errors from other replicas unwrapped to the typed error that was raised there."""

from __future__ import annotations

import math
from typing import Any, Mapping

from llmframe_ray.config import Settings, load_settings


def replica_settings(overrides: Mapping[str, Any]) -> Settings:
    """LLMFRAME_* settings from this replica's environment, with the app's overrides, and the
    thread count set to the CPUs Ray gave the replica (unless LLMFRAME_NUM_THREADS says)."""
    import ray

    settings = load_settings(**dict(overrides))
    if settings.num_threads is not None:
        return settings
    cpus = ray.get_runtime_context().get_assigned_resources().get("CPU", 1.0)
    return load_settings(**{**dict(overrides), "num_threads": max(1, math.ceil(cpus))})


class BatchStats:
    """How many calls each batch held (and items, where a call carries several)."""

    def __init__(self) -> None:
        self.batches = 0
        self.calls = 0
        self.items = 0
        self.largest = 0

    def record(self, calls: int, items: int | None = None) -> None:
        self.batches += 1
        self.calls += calls
        self.items += calls if items is None else items
        self.largest = max(self.largest, calls)

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
