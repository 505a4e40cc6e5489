"""Retrieval as a plan of requests: the stage logic shared by the in-process pipeline and Serve.

`retrieval_plan(...)` is a generator. Each `yield` hands its driver a list of requests that may
run concurrently (encode the queries, search one shard with one ranker, read chunks from one
shard) and receives their answers, in the same order, through `send`; its return value is each
query's hits. The in-process pipeline answers the requests with direct calls (`run_plan`), the
Serve Retriever with deployment handle calls (`run_plan_async`): both rank identically because
the ranking logic exists once, here.

    [encode] -> rounds of shard searches (bm25 and dense side by side) -> merge shards
             -> (documents: best chunk per document) -> RRF (hybrid) -> read the chunks -> hits
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, Generator, Mapping, Protocol, Sequence

import numpy as np

from llmframe_ray.index.shard import IndexShard
from llmframe_ray.retrieve.candidates import Candidates, ChunkRef, merge_shard_results
from llmframe_ray.retrieve.fusion import reciprocal_rank_fusion
from llmframe_ray.types import Choice, Chunk, Hit, SearchMode


class Ranker(Choice):
    """A first-stage ranker; its value names its list in fusion and in a hit's `ranks`."""

    BM25 = SearchMode.BM25.value
    DENSE = SearchMode.DENSE.value


BM25 = Ranker.BM25.value
DENSE = Ranker.DENSE.value

# Per query: (row, score, document id), best first.
ShardResults = list[list[tuple[int, float, str]]]


class ResultLevel(Choice):
    """Whether hits are chunks, or documents represented by their best chunk."""

    CHUNK = "chunk"
    DOCUMENT = "document"


@dataclass(frozen=True)
class Encode:
    """Embed these query texts; answer: a float32 matrix, one row per text."""

    texts: tuple[str, ...]


@dataclass(frozen=True)
class SearchShard:
    """Search shard `shard` with `ranker` for the top `k` rows; answer: ShardResults.

    `inputs` are query texts for BM25 or a float32 matrix of query vectors for dense.
    """

    ranker: Ranker
    shard: int
    inputs: Any
    k: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "ranker", Ranker.from_str(self.ranker))


@dataclass(frozen=True)
class ReadChunks:
    """Read these rows of shard `shard`; answer: the Chunks, in the same order."""

    shard: int
    rows: tuple[int, ...]


Request = Encode | SearchShard | ReadChunks
Plan = Generator[list[Request], list[Any], list[list[Hit]]]


@dataclass(frozen=True)
class FusionParams:
    """Hybrid fusion: RRF constant, weight per ranker (by its name), and how deep each ranker's
    list goes into the fusion."""

    rrf_k: int = 20
    weights: Mapping[str, float] = field(default_factory=lambda: {BM25: 1.0, DENSE: 1.0})
    fusion_depth: int = 200


class PlanBackend(Protocol):
    """What answers a plan's requests: direct calls in process (returning values), deployment
    handles in Serve (returning awaitables)."""

    def encode(self, texts: Sequence[str]) -> Any: ...

    def search(self, shard: int, ranker: Ranker, inputs: Any, k: int) -> Any: ...

    def read_chunks(self, shard: int, rows: Sequence[int]) -> Any: ...


def answer_request(backend: PlanBackend, request: Request) -> Any:
    """Send one request of a plan to the backend method that answers it."""
    if isinstance(request, Encode):
        return backend.encode(request.texts)
    if isinstance(request, SearchShard):
        return backend.search(request.shard, request.ranker, request.inputs, request.k)
    if isinstance(request, ReadChunks):
        return backend.read_chunks(request.shard, request.rows)
    raise TypeError(f"not a retrieval plan request: {request!r}")


@dataclass(frozen=True)
class ShardFacts:
    """What retrieval needs to know of one shard of a version, without its files."""

    size: int  # chunks; 0 for a shard left empty
    n_tokens: int  # BM25 document lengths summed
    corpus: Mapping[str, Any] | None  # the corpus-wide BM25 statistics it was scored with
    model: Mapping[str, Any]  # the embedding model its vectors come from

    @classmethod
    def of(cls, shard: IndexShard) -> ShardFacts:
        corpus = shard.sparse.corpus
        return cls(
            size=len(shard),
            n_tokens=shard.sparse.n_tokens,
            corpus=None if corpus is None else dict(corpus),
            model=dict(shard.manifest.model),
        )


def bm25_consistency_problem(shards: Sequence[ShardFacts]) -> str | None:
    """Why BM25 scores of these shards cannot be merged into one ranking (None when they can).

    Shards rank like one index only if each was scored with the statistics of all of them
    together (see SparseIndex.build): the same recorded corpus, whose size is theirs combined.
    Empty shards take no part.
    """
    live = [s for s in shards if s.size > 0]
    if len(live) <= 1:
        return None
    total = {"n_docs": sum(s.size for s in live), "n_tokens": sum(s.n_tokens for s in live)}
    if any(s.corpus is None or dict(s.corpus) != total for s in live):
        return (
            f"BM25 over these {len(live)} shards would rank differently from one index: their "
            "scores were not computed with corpus-wide statistics (rebuild the index with "
            "`llmframe-ray ingest`), so use mode 'dense'"
        )
    return None


def search_shard(shard: IndexShard, ranker: Ranker, inputs: Any, k: int) -> ShardResults:
    """Answer a SearchShard request against a loaded shard."""
    if Ranker.from_str(ranker) is Ranker.BM25:
        results = shard.search_sparse(list(inputs), k)
    else:
        results = shard.search_dense(np.ascontiguousarray(inputs, dtype=np.float32), k)
    return [[(row, score, shard.doc_id(row)) for row, score in per_query] for per_query in results]


def retrieval_plan(
    queries: Sequence[str],
    mode: SearchMode,
    level: ResultLevel,
    top_k: int,
    shard_sizes: Sequence[int],
    fusion: FusionParams,
) -> Plan:
    """Rank `top_k` hits per (already checked) query over shards of the given sizes (0: empty)."""
    depth = top_k if mode is not SearchMode.HYBRID else max(top_k, fusion.fusion_depth)
    rankers: list[tuple[str, Any]] = []
    if mode in (SearchMode.BM25, SearchMode.HYBRID):
        rankers.append((BM25, list(queries)))
    if mode in (SearchMode.DENSE, SearchMode.HYBRID):
        (vectors,) = yield [Encode(tuple(queries))]
        rankers.append((DENSE, np.ascontiguousarray(vectors, dtype=np.float32)))
    per_ranker = yield from _candidates(rankers, len(queries), depth, level, shard_sizes)

    ranked = []
    for i in range(len(queries)):
        candidates = [per_ranker[name][i] for name, _ in rankers]
        ranked.append(_rank(candidates, level, depth, top_k, fusion))

    wanted = sorted({(ref.shard, ref.row) for items in ranked for ref, _, _ in items})
    by_shard: dict[int, list[int]] = {}
    for shard, row in wanted:
        by_shard.setdefault(shard, []).append(row)
    reads = [ReadChunks(shard, tuple(rows)) for shard, rows in by_shard.items()]
    answers = (yield reads) if reads else []
    chunks: dict[tuple[int, int], Chunk] = {}
    for read, read_chunks in zip(reads, answers):
        chunks.update(((read.shard, row), chunk) for row, chunk in zip(read.rows, read_chunks))
    return [
        [_hit(chunks[ref.shard, ref.row], score, rank, ranks) for rank, (ref, score, ranks) in enumerate(items, 1)]
        for items in ranked
    ]


def _candidates(
    rankers: list[tuple[str, Any]],
    n_queries: int,
    depth: int,
    level: ResultLevel,
    shard_sizes: Sequence[int],
) -> Generator[list[Request], list[Any], dict[str, list[Candidates]]]:
    """Each query's best chunks from every shard, merged, enough to rank `depth` items.

    At document level the number of chunks needed for `depth` distinct documents is not known
    in advance: start at 2 x depth and double, for the queries still short of `depth`
    documents, until they have them or the shards have nothing more to give. The rankers
    search side by side: one round asks every shard for every ranker's pending queries.
    """
    total = sum(shard_sizes)
    live = [s for s, size in enumerate(shard_sizes) if size > 0]
    out: dict[str, list[Candidates | None]] = {name: [None] * n_queries for name, _ in rankers}
    pending = {name: list(range(n_queries)) for name, _ in rankers}
    k = min(depth if level is ResultLevel.CHUNK else 2 * depth, total)
    while any(pending.values()):
        asked = [
            (name, SearchShard(name, s, _select(inputs, pending[name]), min(k, shard_sizes[s])))
            for name, inputs in rankers if pending[name]
            for s in live
        ]
        answers = yield [request for _, request in asked]
        for name, _ in rankers:
            if not pending[name]:
                continue
            per_shard = [(req.shard, ans) for (n, req), ans in zip(asked, answers) if n == name]
            still_short = []
            for j, i in enumerate(pending[name]):
                lists = {shard: results[j] for shard, results in per_shard}
                merged = merge_shard_results(name, lists, k)
                exhausted = all(len(lists[s]) < min(k, shard_sizes[s]) for s in live)
                enough = level is ResultLevel.CHUNK or merged.n_documents >= depth
                if enough or exhausted or k >= total:
                    out[name][i] = merged
                else:
                    still_short.append(i)
            pending[name] = still_short
        k = min(2 * k, total)
    return out  # type: ignore[return-value]


def _select(inputs: Any, rows: list[int]) -> Any:
    if isinstance(inputs, np.ndarray):
        return inputs[rows]
    return [inputs[i] for i in rows]


def _rank(
    candidates: list[Candidates], level: ResultLevel, depth: int, top_k: int, fusion: FusionParams
) -> list[tuple[ChunkRef, float, dict[str, int]]]:
    """The top `top_k` items of one query as (chunk, score, rank per ranker)."""
    if level is ResultLevel.CHUNK:
        lists = [c.chunk_list(depth) for c in candidates]
        best = {ref.key: ref for c in candidates for ref in c.refs[:depth]}
    else:
        lists, best = [], {}
        for c in candidates:
            ranked, best_chunks = c.document_list(depth)
            lists.append(ranked)
            for doc_id, ref in best_chunks.items():
                best.setdefault(doc_id, ref)
        if len(candidates) > 1:
            best = _best_fused_chunks(candidates, best, fusion)

    if len(lists) == 1:
        only = lists[0]
        items = [
            (key, score, {only.name: pos + 1})
            for pos, (key, score) in enumerate(zip(only.keys[:top_k], only.scores[:top_k]))
        ]
    else:
        fused = reciprocal_rank_fusion(lists, k=fusion.rrf_k, weights=fusion.weights, limit=top_k)
        items = [(f.key, f.score, dict(f.ranks)) for f in fused]
    return [(best[key], score, ranks) for key, score, ranks in items]


def _best_fused_chunks(
    candidates: list[Candidates], fallback: dict[str, ChunkRef], fusion: FusionParams
) -> dict[str, ChunkRef]:
    """Each document's chunk that ranks highest when the chunk lists are fused."""
    refs = {ref.key: ref for c in candidates for ref in c.refs}
    fused = reciprocal_rank_fusion(
        [c.chunk_list() for c in candidates], k=fusion.rrf_k, weights=fusion.weights
    )
    best: dict[str, ChunkRef] = {}
    for item in fused:
        ref = refs[item.key]
        best.setdefault(ref.doc_id, ref)
    return {doc_id: best.get(doc_id, ref) for doc_id, ref in fallback.items()}


def _hit(chunk: Chunk, score: float, rank: int, ranks: dict[str, int]) -> Hit:
    return Hit(
        doc_id=chunk.doc_id,
        chunk_id=chunk.chunk_id,
        text=chunk.text,
        title=chunk.title,
        score=float(score),
        rank=rank,
        ranks=ranks,
    )


def run_plan(plan: Plan, backend: PlanBackend) -> list[list[Hit]]:
    """Drive a plan with direct calls, one request after another."""
    try:
        requests = next(plan)
        while True:
            requests = plan.send([answer_request(backend, r) for r in requests])
    except StopIteration as done:
        return done.value


async def run_plan_async(plan: Plan, backend: PlanBackend) -> list[list[Hit]]:
    """Drive a plan with a backend whose methods return awaitables; the requests of one step
    run concurrently."""
    try:
        requests = next(plan)
        while True:
            answers = await asyncio.gather(*(answer_request(backend, r) for r in requests))
            requests = plan.send(list(answers))
    except StopIteration as done:
        return done.value
