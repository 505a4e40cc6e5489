"""Retriever: answers whole search requests in batches with one retrieval plan per batch.

Concurrent requests wait up to `batch_wait_timeout_s` (a millisecond by default) to be
answered together: the queries of a batch are encoded in one call and every plan step sends one
call per shard group, carrying all the batch's queries. A query that fails inside a batch (too
long for the model, text the tokenizer refuses) fails alone; if a plan fails as a whole, its
requests are answered one by one so that only the cause fails.

Where the work runs is the deployment file's choice (serve/app.py: AppArgs): the query encoder
in this process or in the QueryEncoder deployment; the shards in this process or in ShardGroup
deployments, each holding one or more shards with both rankers.

It decides which index version is served: CURRENT at start; then a watcher (every
LLMFRAME_INDEX_WATCH_INTERVAL_S s; 0: off) or a reload switches to a new version once every shard
group has loaded it and it passes the start checks. A batch keeps the version it started with. A
version that fails the checks is not served (`index_info`, GET /v1/index, says why). The
knowledge graph's ranker is answered by the group holding every shard, or here where the shards
are spread over several groups.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np
from ray import serve
from ray.serve.handle import DeploymentHandle

from llmframe_ray.api.failures import StageUnavailableError
from llmframe_ray.api.stages import Retrieved
from llmframe_ray.errors import IndexLoadError, ModelError
from llmframe_ray.index.domain import version_centroid
from llmframe_ray.index.metadata import Filter
from llmframe_ray.index.params import check_model
from llmframe_ray.index.versions import IndexDirectory
from llmframe_ray.models.embedder import EmbedderParams, check_query_text, embed_each, load_embedder
from llmframe_ray.retrieve.params import RetrievalParams
from llmframe_ray.retrieve.facts import ShardFacts, bm25_consistency_problem
from llmframe_ray.retrieve.drive import run_plan_async
from llmframe_ray.retrieve.plan import Request, ResultLevel, SearchGraph, retrieval_plan
from llmframe_ray.graph.inspect import graph_query as answer_graph
from llmframe_ray.graph.search import open_for_version
from llmframe_ray.retrieve.shard_cache import ShardCache, answer_all
from llmframe_ray.serve.activity import MachineSearches
from llmframe_ray.serve.metrics_hub import start_pushing
from llmframe_ray.serve.replica import BatchStats, replica_threads, unwrap, with_replica_threads
from llmframe_ray.telemetry import timed_step, watch_queue
from llmframe_ray.types import SearchMode

logger = logging.getLogger("ray.serve")

MAX_BATCH = 64  # requests
BATCH_WAIT_S = 0.0


@dataclass(frozen=True)
class Served:
    version: str
    facts: tuple[ShardFacts, ...]
    bm25_problem: str | None


@dataclass(frozen=True)
class Ask:  # one search request of a batch
    query: str  # checked: stripped, not empty
    mode: SearchMode
    level: ResultLevel
    top_k: int
    where: Filter | None = None  # namespace and metadata filter
    alpha: float | None = None  # dense/sparse fusion weight (retrieve/strategy.py); None: the configured weights


@dataclass(frozen=True)
class Group:
    """Shards answered by one ShardGroup deployment (handle), or by this process (None)."""

    shards: tuple[int, ...]
    handle: DeploymentHandle | None


@dataclass(frozen=True)
class RetrieverArgs:
    """What a Retriever is built from (its deployment's arguments, or the Ingress's for one in its process)."""

    encoder: DeploymentHandle | EmbedderParams  # the QueryEncoder, or the model to load here
    groups: Sequence[tuple[Sequence[int], DeploymentHandle | None]]  # None: shards held here
    index_dir: str
    params: RetrievalParams
    watch_interval_s: float
    faiss_threads: int | None = None


class RetrieverCore:
    """The Retriever's logic, in whichever replica holds it: `await RetrieverCore(args).start()`."""

    def __init__(self, args: RetrieverArgs) -> None:
        self.fusion, self.index, self.args = args.params.fusion, IndexDirectory(args.index_dir), args
        self.groups = [Group(tuple(shards), handle) for shards, handle in args.groups]
        self.n_shards = sum(len(g.shards) for g in self.groups)
        self.group_of = {shard: i for i, g in enumerate(self.groups) for shard in g.shards}
        self.together = [g.shards for g in self.groups if len(g.shards) > 1]  # each group's shards searched as one
        self.graphs: dict[str, Any] = {}  # version -> GraphSearch, held here when no group holds every shard
        if sorted(self.group_of) != list(range(self.n_shards)):
            raise ValueError(f"shard groups {[g.shards for g in self.groups]} must hold shards 0..n-1 once each")
        self.local: ShardCache | None = None
        self.encoder: DeploymentHandle | None = None if isinstance(args.encoder, EmbedderParams) else args.encoder
        self.embedder: Any = None
        self.searches: MachineSearches | None = None  # in flight on this machine, when there is a solo session
        self.stats = BatchStats("retrieve")
        self.pending = 0  # searches waiting for or in a batch
        watch_queue("retrieve", lambda: self.pending)
        self.shed = 0  # searches refused because `pending` was at the limit
        self.solo = 0  # queries encoded through the solo session
        self.problem: str | None = None  # why the newest version is not served
        self._failed: str | None = None
        self._switching = asyncio.Lock()
        self._watcher: asyncio.Task | None = None

    async def start(self) -> RetrieverCore:
        args = self.args
        current = self.index.current_version()
        if current is None:
            raise IndexLoadError(f"no published version in {args.index_dir}; build one with `llmframe-ray ingest`")
        local = sorted(s for g in self.groups if g.handle is None for s in g.shards)
        if local:
            import faiss

            faiss.omp_set_num_threads(args.faiss_threads if args.faiss_threads is not None else replica_threads())
            self.local = await asyncio.to_thread(ShardCache, args.index_dir, local, args.params)
        if self.encoder is None:
            self.embedder = await asyncio.to_thread(load_embedder, with_replica_threads(args.encoder), solo=True)
            self.embedder.embed(["warm up"])
            if getattr(self.embedder, "solo_threads", 0):
                self.embedder.embed(["warm up"], solo=True)
                self.searches = MachineSearches()
        self.served = await self._first_version(current)
        await self._warm_up()
        loop = asyncio.get_running_loop()
        if args.watch_interval_s > 0:
            self._watcher = loop.create_task(self._watch(args.watch_interval_s))
        return self

    async def retrieve(
        self, query: str, mode: SearchMode, level: ResultLevel, top_k: int, where: Filter | None = None,
        alpha: float | None = None,
    ) -> Retrieved:
        where = None if where is None or where.empty else where
        self.fusion.with_alpha(alpha)  # a bad alpha fails here, alone, not its batch
        ask = Ask(check_query_text(query), SearchMode(mode), ResultLevel(level), int(top_k), where, alpha)
        limit = self.args.params.max_pending
        if limit and self.pending >= limit:  # shed load here, fast, instead of queueing past deadlines
            self.shed += 1
            raise StageUnavailableError(
                f"the retriever stage is overloaded ({self.pending} searches waiting or running in this "
                f"replica, LLMFRAME_MAX_PENDING_SEARCHES={limit}); retry shortly"
            )
        self.pending += 1
        if self.searches is not None:
            self.searches.enter()
        try:
            result = await self._batch(ask)
        finally:
            self.pending -= 1
            if self.searches is not None:
                self.searches.leave()
        if isinstance(result, BaseException):
            raise result
        return result

    @serve.batch(max_batch_size=MAX_BATCH, batch_wait_timeout_s=BATCH_WAIT_S, max_concurrent_batches=2)
    async def _batch(self, asks: list[Ask]) -> list[Retrieved | BaseException]:
        served = self.served  # the batch's version, whatever is published meanwhile
        self.stats.record(len(asks))
        similar: dict[tuple[SearchMode, ResultLevel, int, Filter | None, float | None], list[int]] = {}
        for i, ask in enumerate(asks):
            similar.setdefault((ask.mode, ask.level, ask.top_k, ask.where, ask.alpha), []).append(i)
        out: list[Retrieved | BaseException | None] = [None] * len(asks)
        answers = await asyncio.gather(*(self._answer(served, [asks[i] for i in idx]) for idx in similar.values()))
        for idx, results in zip(similar.values(), answers):
            for i, result in zip(idx, results):
                out[i] = result
        return out  # type: ignore[return-value]

    async def _answer(self, served: Served, asks: list[Ask]) -> list[Retrieved | BaseException]:
        """Answer asks of one mode, level, top_k, filter and alpha with one plan."""
        mode, level, top_k, where = asks[0].mode, asks[0].level, asks[0].top_k, asks[0].where
        fusion = self.fusion.with_alpha(asks[0].alpha)
        if mode.uses_bm25 and served.bm25_problem is not None:
            return [IndexLoadError(served.bm25_problem)] * len(asks)
        out: list[Retrieved | BaseException | None] = [None] * len(asks)
        vectors = None
        live = list(range(len(asks)))
        if mode.uses_dense:
            with timed_step("encode"):
                encoded = await self._encode([a.query for a in asks])
            for i, result in enumerate(encoded):
                if isinstance(result, BaseException):
                    out[i] = result
            live = [i for i in live if out[i] is None]
            if live:
                vectors = np.stack([encoded[i] for i in live]).astype(np.float32, copy=False)
        if live:
            sizes = [f.size for f in served.facts]
            plan = retrieval_plan(
                [asks[i].query for i in live], mode, level, top_k, sizes, fusion, vectors, self.together, where
            )
            backend = _Backend(self, served.version)
            try:
                hits = await run_plan_async(plan, backend)
                results: list[Any] = [Retrieved(served.version, h) for h in hits]
            except Exception as exc:
                if len(live) == 1:
                    results = [unwrap(exc)]
                else:  # find the request that failed: each alone
                    results = []
                    for j, i in enumerate(live):
                        one = None if vectors is None else vectors[j : j + 1]
                        alone = retrieval_plan([asks[i].query], mode, level, top_k, sizes, fusion, one, self.together, where)
                        try:
                            results.append(Retrieved(served.version, (await run_plan_async(alone, backend))[0]))
                        except Exception as failed:
                            results.append(unwrap(failed))
            for i, result in zip(live, results):
                out[i] = result
        return out  # type: ignore[return-value]

    async def _encode(self, queries: list[str]) -> list[np.ndarray | BaseException]:
        """Each query's vector or its own error. Here: in this thread (a hand-off cost up to 2 ms),
        in the embedder's batches of 4 (faster per query than 1 or 32, same vectors: README); one
        replica per core gives the parallelism. The only search on the machine runs through the
        solo session, on the cores the idle replicas leave."""
        if self.embedder is not None:
            solo = len(queries) == 1 and self.searches is not None and self.searches.alone()
            self.solo += solo
            return embed_each(self.embedder, queries, solo=solo)
        try:
            return list(await self.encoder.encode_many.remote(queries))
        except Exception as exc:
            return [unwrap(exc)] * len(queries)

    async def embed_texts(self, texts: list[str]) -> list[np.ndarray | None]:
        """Unit vectors of short texts (compression's sentences, cut to the model's length by the
        caller), one model call; None for a text it cannot take."""
        local = self.embedder is not None
        encoded = await (asyncio.to_thread(embed_each, self.embedder, texts) if local else self._encode(texts))
        return [None if isinstance(v, BaseException) else v for v in encoded]

    async def _warm_up(self) -> None:
        """One search before the first request (loading the compiled ranking functions cost the first
        search 395 ms, later ones 5-6 ms), with a local model, else BM25 alone; a failure is logged."""
        local = getattr(self.embedder, "provider", None) == "local"
        bm25 = self.served.bm25_problem is None
        if not (local or bm25):
            return
        mode = (SearchMode.HYBRID if bm25 else SearchMode.DENSE) if local else SearchMode.BM25
        try:
            (result,) = await self._answer(self.served, [Ask("warm up", mode, ResultLevel.DOCUMENT, 1)])
        except Exception as exc:  # noqa: BLE001
            result = exc
        if isinstance(result, BaseException):
            logger.warning("the warm-up search failed: %s", result)
        self.solo = 0  # counts requests only

    async def _first_version(self, current: str) -> Served:
        """CURRENT's version, or, when it cannot be served, the newest older one that can (a replica
        restarting after a bad publish serves what the others kept serving); /v1/index says so."""
        try:
            return await self._prepare(current)
        except (IndexLoadError, ModelError) as exc:
            problem = f"version {current} is not served: {exc}"
            for older in reversed(self.index.versions()):
                if older >= current:
                    continue
                try:
                    served = await self._prepare(older)
                except (IndexLoadError, ModelError):
                    continue
                self.problem, self._failed = f"{problem}; serving {older}, the newest version that loads", current
                logger.error(self.problem)
                return served
            raise

    async def _prepare(self, version: str) -> Served:
        """Load `version` in every shard group and check it can be served."""
        info = self.index.version_info(version)
        n_shards = int(info["shards"])
        if n_shards != self.n_shards:
            what = f"version {version} has {n_shards} shards but this app was deployed for {self.n_shards}"
            raise IndexLoadError(f"{what}; redeploy the app to serve it")
        try:
            described = await asyncio.gather(*(self._group_call(g, "describe", version) for g in self.groups))
            model = self.embedder.info() if self.embedder is not None else await self.encoder.model.remote()
        except Exception as exc:
            raise unwrap(exc) from None
        facts = {s: f for group, group_facts in zip(self.groups, described) for s, f in zip(group.shards, group_facts)}
        ordered = tuple(facts[s] for s in range(self.n_shards))
        for shard in ordered:
            if shard.size:
                check_model(shard.model, model)
        if len(self.groups) > 1:  # else the group holding every shard holds the graph
            graph = await asyncio.to_thread(open_for_version, self.args.index_dir, version, self.args.params.graph)
            kept = getattr(getattr(self, "served", None), "version", None)  # the one in use stays
            self.graphs = {**{v: g for v, g in self.graphs.items() if v == kept}, version: graph}
        return Served(version, ordered, bm25_consistency_problem(ordered))

    async def _group_call(self, group: Group, method: str, *args: Any) -> Any:
        if group.handle is None:
            return await getattr(self.local, method)(*args)
        return await getattr(group.handle, method).remote(*args)

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

    def reconfigure(self, config: Mapping[str, Any]) -> None:
        """user_config: {max_batch_size (requests), batch_wait_timeout_s}."""
        if "max_batch_size" in config:
            self._batch.set_max_batch_size(int(config["max_batch_size"]))
        if "batch_wait_timeout_s" in config:
            self._batch.set_batch_wait_timeout_s(float(config["batch_wait_timeout_s"]))

    async def domain_centroid(self, version: str) -> tuple[list[float] | None, dict[str, Any]]:
        """A version's centroid and embedding model (index/domain.py), read from its files."""
        vector, model = await asyncio.to_thread(version_centroid, self.index, version)
        return (None if vector is None else vector.tolist()), model

    def index_info(self) -> dict[str, Any]:
        return {**self.index.describe(self.served.version), "problem": self.problem}

    async def graph_query(self, method: str, args: dict[str, Any]) -> Any:
        if len(self.groups) > 1:
            return answer_graph(self.graphs.get(self.served.version), method, args)
        return await self._group_call(self.groups[0], "graph_query", self.served.version, method, args)

    def batch_stats(self) -> dict[str, float]:
        return {**self.stats.as_dict(), "pending": self.pending, "shed": self.shed, "solo": self.solo}

    def ready(self) -> str:
        return "ready"


@serve.deployment(ray_actor_options={"num_cpus": 0.1}, max_ongoing_requests=256, max_queued_requests=512)
class Retriever(RetrieverCore):
    async def __init__(self, args: RetrieverArgs) -> None:
        RetrieverCore.__init__(self, args)
        await self.start()
        start_pushing()  # its batches and plan steps reach GET /metrics


class _Backend:
    """A plan step's requests (retrieve/drive.py: PlanBackend), one call per shard group, on one version."""

    def __init__(self, retriever: RetrieverCore, version: str) -> None:
        self.retriever, self.version = retriever, version

    async def answer(self, requests: Sequence[Request]) -> list[Any]:
        retriever = self.retriever
        out: list[Any] = [None] * len(requests)
        by_group: dict[int, list[int]] = {}
        for i, request in enumerate(requests):  # no Encode: _answer passes the plan its vectors
            if isinstance(request, SearchGraph) and len(retriever.groups) > 1:  # the graph is held here
                out[i] = answer_all({}, self.version, [request], retriever.graphs.get(self.version))[0]
            else:
                by_group.setdefault(retriever.group_of[request.shard], []).append(i)
        groups = list(by_group.items())
        answers = await asyncio.gather(
            *(retriever._group_call(retriever.groups[g], "answer", self.version, [requests[i] for i in idx]) for g, idx in groups)
        )
        for (_, idx), group_answers in zip(groups, answers):
            for i, answer in zip(idx, group_answers):
                out[i] = answer
        return out
