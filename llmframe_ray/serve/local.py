"""The API's stages answered in this process (no Ray): for tests, benchmarks and debugging.

The same RagService and HTTP app run over these as over the Serve deployments, so the in-process
path and the served one differ only in how a stage is reached.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, AsyncIterator

from llmframe_ray.config import Settings
from llmframe_ray.generate.extractive import ExtractiveAnswerer
from llmframe_ray.index.versions import IndexDirectory
from llmframe_ray.models.cross_encoder import CrossEncoder
from llmframe_ray.pipeline import Pipeline
from llmframe_ray.retrieve.plan import ResultLevel
from llmframe_ray.serve.service import Retrieved
from llmframe_ray.types import Answer, Hit, SearchMode


class LocalStages:
    def __init__(
        self,
        index_dir: Path,
        pipeline: Pipeline,
        version: str,
        reranker: CrossEncoder | None = None,
        answerer: ExtractiveAnswerer | None = None,
    ) -> None:
        self.index = IndexDirectory(index_dir)
        self.pipeline = pipeline
        self.version = version
        self.reranker = reranker
        self.answerer = answerer if answerer is not None else ExtractiveAnswerer()
        self.has_reranker = reranker is not None
        self._lock = asyncio.Lock()  # one model call at a time, as one replica would

    @classmethod
    def open(cls, index_dir: Path, settings: Settings, reranker: CrossEncoder | None = None) -> LocalStages:
        from llmframe_ray.models.embedder import load_embedder

        loaded = IndexDirectory(index_dir).load()
        pipeline = Pipeline(loaded.shards, load_embedder(settings), settings)
        return cls(index_dir, pipeline, loaded.version, reranker)

    async def retrieve(self, query: str, mode: SearchMode, level: ResultLevel, top_k: int) -> Retrieved:
        async with self._lock:
            hits = await asyncio.to_thread(self.pipeline.search, query, mode, top_k, level, rerank=False)
        return Retrieved(self.version, hits)

    async def rerank_scores(self, query: str, passages: list[str]) -> list[float]:
        async with self._lock:
            scores = await asyncio.to_thread(self.reranker.score, query, passages)
        return [float(s) for s in scores]

    async def answer(self, question: str, hits: list[Hit]) -> Answer:
        return self.answerer.answer(question, hits)

    async def answer_events(self, question: str, hits: list[Hit]) -> AsyncIterator[str | Answer]:
        for item in self.answerer.events(question, hits):
            yield item

    async def readiness(self) -> dict[str, str]:
        return {"pipeline": "ready"}

    async def index_info(self) -> dict[str, Any]:
        return self.index.describe(self.version)

    async def reload(self) -> dict[str, Any]:
        return {"version": self.version, "switched": False, "reason": "the in-process app does not reload"}

    async def stats(self) -> dict[str, Any]:
        return {}
