"""One shard position of an index, served across versions (the body of DenseShard/SparseShard).

A replica is bound to shard number `shard` of an index directory. Each call names the version it
belongs to, so a request that started on one version finishes on it while newer requests use the
next: versions are loaded on first use (one load at a time per version) and the
`keep_versions` most recently used stay loaded. A version dropped from the cache stays alive for calls still using
it (its files are memory-mapped, so a pruned version remains readable until then).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from typing import Any, Sequence

from llmframe_ray.index.shard import IndexShard
from llmframe_ray.index.versions import IndexDirectory
from llmframe_ray.retrieve.params import RetrievalParams
from llmframe_ray.retrieve.plan import Ranker, ShardFacts, ShardResults, search_shard
from llmframe_ray.types import Chunk

EMPTY = ShardFacts(size=0, n_tokens=0, corpus=None, model={})


class ShardCache:
    """The versions of one shard position that calls are using, loaded on first use."""

    def __init__(
        self, index_dir: str, shard: int, ranker: Ranker, params: RetrievalParams, keep_versions: int = 2
    ) -> None:
        if keep_versions < 1:
            raise ValueError(f"keep_versions must be >= 1, got {keep_versions}")
        self.index = IndexDirectory(index_dir)
        self.shard = shard
        self.ranker = Ranker.from_str(ranker)
        self.params = params
        self.keep_versions = keep_versions
        self._loaded: OrderedDict[str, IndexShard | None] = OrderedDict()
        self._locks: dict[str, asyncio.Lock] = {}
        current = self.index.current_version()
        if current is not None:
            self._remember(current, self._load(current))

    def _load(self, version: str) -> IndexShard | None:
        shard = self.index.load_shard(version, self.shard)
        return None if shard is None else self.params.prepare(shard)

    def _remember(self, version: str, shard: IndexShard | None) -> None:
        """Keep `version`; forget the least recently used others beyond `keep_versions`."""
        self._loaded[version] = shard
        self._loaded.move_to_end(version)
        while len(self._loaded) > self.keep_versions:
            dropped, _ = self._loaded.popitem(last=False)
            self._locks.pop(dropped, None)

    async def version(self, version: str) -> IndexShard | None:
        if version in self._loaded:
            self._loaded.move_to_end(version)
            return self._loaded[version]
        lock = self._locks.setdefault(version, asyncio.Lock())
        async with lock:
            if version in self._loaded:
                return self._loaded[version]
            shard = await asyncio.to_thread(self._load, version)
            self._remember(version, shard)
            return shard

    async def search(self, version: str, inputs: Any, k: int) -> ShardResults:
        shard = await self.version(version)
        if shard is None:
            return [[] for _ in range(len(inputs))]
        return await asyncio.to_thread(search_shard, shard, self.ranker, inputs, k)

    async def chunks(self, version: str, rows: Sequence[int]) -> list[Chunk]:
        shard = await self.version(version)
        if shard is None:
            raise ValueError(f"shard {self.shard} of version {version} is empty; it has no rows")
        return shard.chunks(list(rows))

    async def describe(self, version: str) -> ShardFacts:
        shard = await self.version(version)
        return EMPTY if shard is None else ShardFacts.of(shard)

    def loaded_versions(self) -> list[str]:
        return list(self._loaded)

    def ready(self) -> str:
        return "ready"

