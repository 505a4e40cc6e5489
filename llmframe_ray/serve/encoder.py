"""QueryEncoder: the ONNX embedder, batching queries across requests (`@serve.batch`)."""

from __future__ import annotations

import asyncio
from typing import Any, Mapping

import numpy as np
from ray import serve

from llmframe_ray.errors import QueryError
from llmframe_ray.models.embedder import EmbedderParams, load_embedder
from llmframe_ray.serve.replica import BatchStats, with_replica_threads


@serve.deployment(ray_actor_options={"num_cpus": 0.5}, max_ongoing_requests=128)
class QueryEncoder:
    def __init__(self, params: EmbedderParams) -> None:
        self.embedder = load_embedder(with_replica_threads(params))
        self.stats = BatchStats()
        self.embedder.embed(["warm up"] * 32)

    async def encode(self, query: str) -> np.ndarray:
        """The query's unit vector; a query over the model's token limit raises QueryTooLongError."""
        result = await self._encode_batch(query)
        if isinstance(result, Exception):
            raise result
        return result

    @serve.batch(max_batch_size=32, batch_wait_timeout_s=0.002)
    async def _encode_batch(self, queries: list[str]) -> list[np.ndarray | Exception]:
        self.stats.record(len(queries))
        out: list[np.ndarray | Exception | None] = [None] * len(queries)
        checked: list[tuple[int, str]] = []
        for i, query in enumerate(queries):
            try:
                checked.append((i, self.embedder.check_query(query)))
            except QueryError as exc:  # fails this query only, not the batch
                out[i] = exc
        if checked:
            vectors = await asyncio.to_thread(self.embedder.embed, [q for _, q in checked])
            for (i, _), vector in zip(checked, np.asarray(vectors, dtype=np.float32)):
                out[i] = vector
        return out  # type: ignore[return-value]

    def reconfigure(self, config: Mapping[str, Any]) -> None:
        """user_config: {max_batch_size, batch_wait_timeout_s}."""
        if "max_batch_size" in config:
            self._encode_batch.set_max_batch_size(int(config["max_batch_size"]))
        if "batch_wait_timeout_s" in config:
            self._encode_batch.set_batch_wait_timeout_s(float(config["batch_wait_timeout_s"]))

    def model(self) -> dict[str, Any]:
        return self.embedder.info()

    def batch_stats(self) -> dict[str, float]:
        return self.stats.as_dict()

    def ready(self) -> str:
        return "ready"
