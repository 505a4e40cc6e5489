"""Reranker: the ONNX cross-encoder, batching (query, passage) pairs across requests."""

from __future__ import annotations

import asyncio
from typing import Any, Mapping, Sequence

from ray import serve

from llmframe_ray.models.sources import RerankerModelParams, load_reranker
from llmframe_ray.serve.metrics_hub import start_pushing
from llmframe_ray.serve.replica import BatchStats, with_replica_threads
from llmframe_ray.telemetry import watch_queue

# A batch is capped by pairs (a request carries up to LLMFRAME_RERANKER_DEPTH of them).
MAX_BATCH_PAIRS = 256


def _pairs(items: list[tuple[str, tuple[str, ...]]]) -> int:
    return sum(len(passages) for _, passages in items)


def score_each(encoder: Any, items: list[tuple[str, tuple[str, ...]]]) -> list[list[float] | Exception]:
    """Each request's scores, or the error that request alone raises: the batch's pairs go
    through the model together; if that fails, each request is scored alone, so one bad
    request never fails the others of its batch."""
    pairs = [(query, passage) for query, passages in items for passage in passages]
    try:
        scores = encoder.score_pairs(pairs).tolist()
    except Exception:  # noqa: BLE001 - find the request that caused it
        if len(items) == 1:
            raise
        out: list[list[float] | Exception] = []
        for query, passages in items:
            try:
                out.append(encoder.score_pairs([(query, p) for p in passages]).tolist())
            except Exception as exc:  # noqa: BLE001 - that request's own answer
                out.append(exc)
        return out
    out, start = [], 0
    for _, passages in items:
        out.append(scores[start : start + len(passages)])
        start += len(passages)
    return out


@serve.deployment(ray_actor_options={"num_cpus": 1}, max_ongoing_requests=32, max_queued_requests=64)
class Reranker:
    def __init__(self, params: RerankerModelParams, depth: int) -> None:
        self.encoder = load_reranker(with_replica_threads(params))
        self.depth = depth  # a batch always has room for one request's pairs
        self.stats = BatchStats("rerank", "pairs")
        self.waiting = 0  # score calls waiting for or in a batch
        watch_queue("rerank", lambda: self.waiting)
        self._score_batch.set_max_batch_size(max(MAX_BATCH_PAIRS, depth))
        self.encoder.score("warm up", ["warm up"] * self.encoder.batch_size)
        start_pushing()

    async def score(self, query: str, passages: Sequence[str]) -> list[float]:
        """The cross-encoder's score of each passage for the query, in order."""
        if not passages:
            return []
        self.waiting += 1
        try:
            result = await self._score_batch((query, tuple(passages)))
        finally:
            self.waiting -= 1
        if isinstance(result, Exception):
            raise result
        return result

    @serve.batch(max_batch_size=MAX_BATCH_PAIRS, batch_wait_timeout_s=0.005, batch_size_fn=_pairs)
    async def _score_batch(self, items: list[tuple[str, tuple[str, ...]]]) -> list[list[float] | Exception]:
        pairs = [(query, passage) for query, passages in items for passage in passages]
        self.stats.record(len(items), len(pairs))
        return await asyncio.to_thread(score_each, self.encoder, items)

    def reconfigure(self, config: Mapping[str, Any]) -> None:
        """user_config: {max_batch_pairs, batch_wait_timeout_s}."""
        if "max_batch_pairs" in config:
            self._score_batch.set_max_batch_size(max(int(config["max_batch_pairs"]), self.depth))
        if "batch_wait_timeout_s" in config:
            self._score_batch.set_batch_wait_timeout_s(float(config["batch_wait_timeout_s"]))

    def card(self) -> dict[str, Any]:
        """The model card (its training corpus's centroid sets its fusion weight)."""
        return dict(self.encoder.card)

    def batch_stats(self) -> dict[str, float]:
        """Batch sizes, and the score cache's hits and misses (pairs) where it has one."""
        cache = self.encoder.cache
        return {**self.stats.as_dict(), **(cache.stats() if cache is not None else {})}

    def ready(self) -> str:
        return "ready"
