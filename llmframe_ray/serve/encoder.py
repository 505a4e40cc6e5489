"""QueryEncoder: the ONNX embedder as its own deployment, batching queries across calls
(`@serve.batch`). Used when the Retriever does not encode in its own process."""

from __future__ import annotations

import asyncio
from typing import Any, Mapping, Sequence

import numpy as np
from ray import serve

from llmframe_ray.models.embedder import EmbedderParams, embed_each, load_embedder
from llmframe_ray.serve.metrics_hub import start_pushing
from llmframe_ray.serve.replica import BatchStats, with_replica_threads
from llmframe_ray.telemetry import watch_queue


MAX_BATCH = 64  # queries


def _texts(calls: list[tuple[str, ...]]) -> int:
    return sum(len(texts) for texts in calls)


@serve.deployment(ray_actor_options={"num_cpus": 0.5}, max_ongoing_requests=128, max_queued_requests=256)
class QueryEncoder:
    def __init__(self, params: EmbedderParams) -> None:
        self.embedder = load_embedder(with_replica_threads(params))
        self.stats = BatchStats("encode", "queries")
        self.waiting = 0  # encode calls waiting for or in a batch
        watch_queue("encode", lambda: self.waiting)
        self.max_batch = MAX_BATCH
        self.embedder.embed(["warm up"] * 32)
        start_pushing()

    async def encode_many(self, queries: Sequence[str]) -> list[np.ndarray | Exception]:
        """Each query's unit vector, or the error of that query alone (embed_each)."""
        step = self.max_batch  # a call larger than a batch is split
        parts = [tuple(queries[i : i + step]) for i in range(0, len(queries), step)]
        self.waiting += 1
        try:
            answers = await asyncio.gather(*(self._encode_batch(part) for part in parts))
        finally:
            self.waiting -= 1
        return [result for answer in answers for result in answer]

    @serve.batch(max_batch_size=MAX_BATCH, batch_wait_timeout_s=0.002, batch_size_fn=_texts)
    async def _encode_batch(self, calls: list[tuple[str, ...]]) -> list[list[np.ndarray | Exception]]:
        texts = [text for call in calls for text in call]
        self.stats.record(len(calls), len(texts))
        results = await asyncio.to_thread(embed_each, self.embedder, texts)
        out, start = [], 0
        for call in calls:
            out.append(results[start : start + len(call)])
            start += len(call)
        return out

    def reconfigure(self, config: Mapping[str, Any]) -> None:
        """user_config: {max_batch_size (queries), batch_wait_timeout_s}."""
        if "max_batch_size" in config:
            self.max_batch = int(config["max_batch_size"])
            self._encode_batch.set_max_batch_size(self.max_batch)
        if "batch_wait_timeout_s" in config:
            self._encode_batch.set_batch_wait_timeout_s(float(config["batch_wait_timeout_s"]))

    def model(self) -> dict[str, Any]:
        return self.embedder.info()

    def batch_stats(self) -> dict[str, float]:
        return self.stats.as_dict()

    def ready(self) -> str:
        return "ready"
