"""Reranker: the ONNX cross-encoder, batching (query, passage) pairs across requests."""

from __future__ import annotations

import asyncio
from typing import Any, Mapping, Sequence

from ray import serve

from llmframe_ray.models.sources import RerankerModelParams, load_reranker
from llmframe_ray.serve.replica import BatchStats, with_replica_threads

# A batch is capped by pairs (a request carries up to LLMFRAME_RERANKER_DEPTH of them).
MAX_BATCH_PAIRS = 256


def _pairs(items: list[tuple[str, tuple[str, ...]]]) -> int:
    return sum(len(passages) for _, passages in items)


@serve.deployment(ray_actor_options={"num_cpus": 1}, max_ongoing_requests=32)
class Reranker:
    def __init__(self, params: RerankerModelParams, depth: int) -> None:
        self.encoder = load_reranker(with_replica_threads(params))
        self.depth = depth  # a batch always has room for one request's pairs
        self.stats = BatchStats()
        self._score_batch.set_max_batch_size(max(MAX_BATCH_PAIRS, depth))
        self.encoder.score("warm up", ["warm up"] * self.encoder.batch_size)

    async def score(self, query: str, passages: Sequence[str]) -> list[float]:
        """The cross-encoder's score of each passage for the query, in order."""
        if not passages:
            return []
        return await self._score_batch((query, tuple(passages)))

    @serve.batch(max_batch_size=MAX_BATCH_PAIRS, batch_wait_timeout_s=0.005, batch_size_fn=_pairs)
    async def _score_batch(self, items: list[tuple[str, tuple[str, ...]]]) -> list[list[float]]:
        pairs = [(query, passage) for query, passages in items for passage in passages]
        self.stats.record(len(items), len(pairs))
        scores = (await asyncio.to_thread(self.encoder.score_pairs, pairs)).tolist()
        out, start = [], 0
        for _, passages in items:
            out.append(scores[start : start + len(passages)])
            start += len(passages)
        return out

    def reconfigure(self, config: Mapping[str, Any]) -> None:
        """user_config: {max_batch_pairs, batch_wait_timeout_s}."""
        if "max_batch_pairs" in config:
            self._score_batch.set_max_batch_size(max(int(config["max_batch_pairs"]), self.depth))
        if "batch_wait_timeout_s" in config:
            self._score_batch.set_batch_wait_timeout_s(float(config["batch_wait_timeout_s"]))

    def batch_stats(self) -> dict[str, float]:
        return self.stats.as_dict()

    def ready(self) -> str:
        return "ready"
