"""A group of shard positions of an index, served across versions (the body of a ShardGroup
replica, and of the Retriever when it holds the shards itself).

A cache is bound to some shard numbers of an index directory and answers both rankers (BM25
and dense) and chunk reads for them; a group holding every shard also loads the version's
knowledge graph, if it has one, and answers the graph ranker (graph/search.py). Each call names
the version it belongs to, so a request
that started on one version finishes on it while newer requests use the next: versions are loaded
on first use (one load at a time per version) and the `keep_versions` most recently used stay
loaded. A version dropped from the cache stays alive for calls still using it (its files are
memory-mapped, so a pruned version remains readable until then).
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from dataclasses import replace
from typing import Any, Sequence

from llmframe_ray.errors import IndexLoadError
from llmframe_ray.index.shard import IndexShard
from llmframe_ray.index.store import share_document_keys
from llmframe_ray.index.versions import IndexDirectory
from llmframe_ray.retrieve.candidates import ShardAnswer
from llmframe_ray.retrieve.params import RetrievalParams
from llmframe_ray.retrieve.joint import prepare as prepare_together, search_together
from llmframe_ray.retrieve.facts import ShardFacts
from llmframe_ray.retrieve.plan import Ranker, ReadChunks, Request, SearchGraph, SearchShard, SearchShards, search_shard
from llmframe_ray.retrieve.strategy import GRAPH_MISSING, StrategyError

EMPTY = ShardFacts(size=0, n_tokens=0, corpus=None, model={})

logger = logging.getLogger(__name__)
Loaded = dict[int, IndexShard | None]  # shard number -> the shard (None: left empty)


class ShardCache:
    """The versions of some shard positions that calls are using, loaded on first use."""

    def __init__(
        self, index_dir: str, shards: Sequence[int], params: RetrievalParams, keep_versions: int = 2
    ) -> None:
        if keep_versions < 1:
            raise ValueError(f"keep_versions must be >= 1, got {keep_versions}")
        if not shards:
            raise ValueError("a shard cache needs at least one shard number")
        self.index = IndexDirectory(index_dir)
        self.shards = tuple(int(s) for s in shards)
        self.params = params
        self.keep_versions = keep_versions
        self._loaded: OrderedDict[str, Loaded] = OrderedDict()
        self._graphs: dict[str, Any] = {}  # version -> its GraphSearch (None: it has none)
        self._locks: dict[str, asyncio.Lock] = {}
        current = self.index.current_version()
        if current is not None:
            try:
                self._remember(current, self._load(current))
            except IndexLoadError as exc:  # the caller decides what to serve (RetrieverCore._first_version)
                logger.error("version %s does not load here: %s", current, exc)

    def _load(self, version: str) -> Loaded:
        self.index.check_memory(version, self.params.memory_limit_mb, self.shards)
        loaded: Loaded = {}
        for number in self.shards:
            shard = self.index.load_shard(version, number, verify=self.params.verify_on_load)
            loaded[number] = None if shard is None else self.params.prepare(shard)
        if set(self.shards) == set(range(int(self.index.version_info(version)["shards"]))):
            # Holding every shard, this group's answers are merged with no other group's.
            live = [n for n, shard in loaded.items() if shard is not None]
            keyed = share_document_keys([loaded[n].store for n in live])
            loaded.update({n: replace(loaded[n], store=store) for n, store in zip(live, keyed)})
            from llmframe_ray.graph.search import GraphSearch

            self._graphs[version] = GraphSearch.open(
                self.index.versions_dir / version, [loaded[n].store for n in live], live, self.params.graph
            )
        prepare_together([(n, loaded[n]) for n in self.shards])  # searched as one (SearchShards)
        return loaded

    def _remember(self, version: str, loaded: Loaded) -> None:
        """Keep `version`; forget the least recently used others beyond `keep_versions`."""
        self._loaded[version] = loaded
        self._loaded.move_to_end(version)
        while len(self._loaded) > self.keep_versions:
            dropped, _ = self._loaded.popitem(last=False)
            self._locks.pop(dropped, None)
            self._graphs.pop(dropped, None)

    async def version(self, version: str) -> Loaded:
        if version in self._loaded:
            self._loaded.move_to_end(version)
            return self._loaded[version]
        lock = self._locks.setdefault(version, asyncio.Lock())
        async with lock:
            if version in self._loaded:
                return self._loaded[version]
            loaded = await asyncio.to_thread(self._load, version)
            self._remember(version, loaded)
            return loaded

    async def answer(self, version: str, requests: Sequence[Request]) -> list[Any]:
        """Answer searches and chunk reads of this group's shards, in order.

        They run in the calling thread: a search takes about a millisecond, less than handing it
        to another thread cost on a small virtual machine (measured: up to 2 ms per hand-off)."""
        loaded = await self.version(version)
        return answer_all(loaded, version, requests, self._graphs.get(version))

    async def describe(self, version: str) -> list[ShardFacts]:
        """Facts of each of this group's shards, in the order of `shards`."""
        loaded = await self.version(version)
        return [EMPTY if loaded[n] is None else ShardFacts.of(loaded[n]) for n in self.shards]

    async def graph_query(self, version: str, method: str, args: dict[str, Any]) -> Any:
        """Inspect the version's knowledge graph (graph/inspect.py); None when it has none."""
        from llmframe_ray.graph.inspect import graph_query

        await self.version(version)
        return graph_query(self._graphs.get(version), method, args)

    def loaded_versions(self) -> list[str]:
        return list(self._loaded)

    def ready(self) -> str:
        return "ready"


def answer_all(loaded: Loaded, version: str, requests: Sequence[Request], graph: Any = None) -> list[Any]:
    out: list[Any] = []
    for request in requests:
        if isinstance(request, SearchGraph):
            if graph is None:
                raise StrategyError("retrieval_strategy", GRAPH_MISSING)
            out.append(graph.search(request.queries, request.k, request.level, request.where, request.vectors))
            continue
        asked = request.shards if isinstance(request, SearchShards) else (request.shard,)
        missing = [s for s in asked if s not in loaded]
        if missing:
            raise ValueError(f"shard {missing[0]} is not in this group (shards {sorted(loaded)})")
        shard = loaded[request.shard]
        if isinstance(request, SearchShards):
            held = [(s, loaded[s]) for s in request.shards]
            out.append(search_together(held, request.ranker is Ranker.BM25, request.inputs, request.k, request.where))
        elif isinstance(request, SearchShard):
            out.append(
                ShardAnswer.empty(len(request.inputs)) if shard is None
                else search_shard(shard, request.ranker, request.inputs, request.k, request.where)
            )
        elif isinstance(request, ReadChunks):
            if shard is None:
                raise ValueError(f"shard {request.shard} of version {version} is empty; it has no rows")
            out.append(shard.chunks(list(request.rows)))
        else:
            raise TypeError(f"a shard group cannot answer {request!r}")
    return out
