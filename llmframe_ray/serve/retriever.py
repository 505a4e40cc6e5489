"""Retriever: runs the retrieval plan over the shard deployments and the QueryEncoder.

It decides which index version is served. At start it serves CURRENT; a watcher (every
LLMFRAME_INDEX_WATCH_INTERVAL_S seconds; 0 turns it off) or a reload call switches to a newly
published version once every shard replica asked has loaded it and it passes the same checks as
at start. Each request keeps the version it started with, so in-flight requests finish on the old
version while new ones use the new. A version that fails the checks is not served; the reason is
reported by `index_info` (GET /v1/index) and the app keeps serving the version it had.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
from ray import serve
from ray.serve.handle import DeploymentHandle

from llmframe_ray.api.service import Retrieved
from llmframe_ray.errors import IndexLoadError, ModelError
from llmframe_ray.index.params import check_model
from llmframe_ray.index.versions import IndexDirectory
from llmframe_ray.models.embedder import check_query_text
from llmframe_ray.retrieve.params import RetrievalParams
from llmframe_ray.retrieve.plan import (
    Ranker,
    ResultLevel,
    ShardFacts,
    bm25_consistency_problem,
    retrieval_plan,
    run_plan_async,
)
from llmframe_ray.serve.replica import unwrap
from llmframe_ray.types import SearchMode

logger = logging.getLogger("ray.serve")


@dataclass(frozen=True)
class Served:
    version: str
    facts: tuple[ShardFacts, ...]
    bm25_problem: str | None


@serve.deployment(ray_actor_options={"num_cpus": 0.05}, max_ongoing_requests=256)
class Retriever:
    async def __init__(
        self,
        encoder: DeploymentHandle,
        dense: Sequence[DeploymentHandle],
        sparse: Sequence[DeploymentHandle],
        index_dir: str,
        params: RetrievalParams,
        watch_interval_s: float,
    ) -> None:
        self.fusion = params.fusion
        self.encoder, self.dense, self.sparse = encoder, list(dense), list(sparse)
        self.index = IndexDirectory(index_dir)
        self.problem: str | None = None
        self._failed: str | None = None
        self._switching = asyncio.Lock()
        current = self.index.current_version()
        if current is None:
            raise IndexLoadError(f"no published version in {index_dir}; build one with `llmframe-ray ingest`")
        self.served = await self._prepare(current)
        loop = asyncio.get_running_loop()
        self._watcher = loop.create_task(self._watch(watch_interval_s)) if watch_interval_s > 0 else None

    async def retrieve(self, query: str, mode: SearchMode, level: ResultLevel, top_k: int) -> Retrieved:
        served = self.served  # this request's version, whatever is published meanwhile
        if mode in (SearchMode.BM25, SearchMode.HYBRID) and served.bm25_problem is not None:
            raise IndexLoadError(served.bm25_problem)
        plan = retrieval_plan(
            [check_query_text(query)], mode, level, top_k, [f.size for f in served.facts], self.fusion
        )
        try:
            hits = await run_plan_async(plan, _HandleBackend(self, served.version))
        except Exception as exc:
            raise unwrap(exc) from None
        return Retrieved(served.version, hits[0])

    async def _prepare(self, version: str) -> Served:
        """Load `version` on a replica of every shard deployment and check it can be served."""
        info = self.index.version_info(version)
        n_shards = int(info["shards"])
        if n_shards != len(self.dense):
            raise IndexLoadError(
                f"version {version} has {n_shards} shards but this app was deployed for "
                f"{len(self.dense)}; redeploy the app to serve it"
            )
        try:
            sparse = await asyncio.gather(*(h.describe.remote(version) for h in self.sparse))
            await asyncio.gather(*(h.describe.remote(version) for h in self.dense))
            model = await self.encoder.model.remote()
        except Exception as exc:
            raise unwrap(exc) from None
        for facts in sparse:
            if facts.size:
                check_model(facts.model, model)
        return Served(version, tuple(sparse), bm25_consistency_problem(sparse))

    async def reload(self) -> dict[str, Any]:
        """Serve CURRENT if it is newer than the served version."""
        async with self._switching:
            current = self.index.current_version()
            previous = self.served.version
            if current is None or current == previous:
                return {"version": previous, "switched": False}
            try:
                served = await self._prepare(current)
            except Exception as exc:
                if isinstance(exc, (IndexLoadError, ModelError)):  # the version itself is unusable
                    self._failed = current
                self.problem = f"version {current} is not served: {exc}"
                logger.error(self.problem)
                raise
            self.served, self.problem, self._failed = served, None, None
            logger.info("now serving index version %s (was %s)", current, previous)
            return {"version": current, "previous": previous, "switched": True}

    async def _watch(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                current = self.index.current_version()
                if current not in (None, self.served.version, self._failed):
                    await self.reload()
            except Exception:  # reported by reload; keep watching
                continue

    def index_info(self) -> dict[str, Any]:
        return {**self.index.describe(self.served.version), "problem": self.problem}

    def ready(self) -> str:
        return "ready"


class _HandleBackend:
    """The plan's requests (retrieve/plan.py: PlanBackend) as deployment handle calls on one
    index version."""

    def __init__(self, retriever: Retriever, version: str) -> None:
        self.retriever, self.version = retriever, version

    async def encode(self, texts: Sequence[str]) -> np.ndarray:
        vectors = await asyncio.gather(*(self.retriever.encoder.encode.remote(text) for text in texts))
        return np.stack(vectors)

    async def search(self, shard: int, ranker: Ranker, inputs: Any, k: int) -> Any:
        shards = self.retriever.sparse if ranker is Ranker.BM25 else self.retriever.dense
        return await shards[shard].search.remote(self.version, inputs, k)

    async def read_chunks(self, shard: int, rows: Sequence[int]) -> Any:
        return await self.retriever.sparse[shard].chunks.remote(self.version, rows)
