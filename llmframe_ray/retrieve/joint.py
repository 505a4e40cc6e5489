"""Several shards held by one process, searched as one: per query, their merged top k.

A plan that asks each of S shards for its own top k and then keeps the best k of the S k rows
does S times the work it keeps. For an exact dense search through the int8 prefilter it is
worse than that: k = 400 of a 2,500-row shard is a sixth of the shard, so nearly every row
becomes a candidate to rescore. Searched together, the shards share one prefilter
(index/prefilter.py, made on first use and kept while the shards are loaded): their codes are
scanned in one pass and cut at one threshold, the k-th best lower bound over all their rows,
which leaves as many candidates as one index of their combined size would, at the cost of one
scan. BM25 analyses the query once for all shards.

The answer is the same as merging each shard's own top k and keeping k (candidates.py order
rules: score desc, then document key, row, shard): within a shard those rules order rows as
the shard does (rows are stored in document order), so the best k overall are, shard by shard,
a prefix of that shard's own top k.
"""

from __future__ import annotations

import weakref
from typing import Any, Sequence

import numpy as np

from llmframe_ray.index import prefilter
from llmframe_ray.index.dense import DenseIndex
from llmframe_ray.index.metadata import Filter
from llmframe_ray.index.shard import IndexShard
from llmframe_ray.retrieve.candidates import ShardAnswer, concat_keys

# (shard id, shard) pairs; None for a shard left empty in this version
Held = Sequence[tuple[int, IndexShard | None]]


def search_together(shards: Held, bm25: bool, inputs: Any, k: int, where: Filter | None = None) -> ShardAnswer:
    """The merged top `k` of `shards` for each query (texts for BM25, else float32 vectors),
    with each hit's shard in the answer's `shards`; with `where`, of the rows it selects."""
    live = [(i, shard) for i, shard in shards if shard is not None and len(shard)]
    n_queries = len(inputs)
    if not live:
        return ShardAnswer.empty(n_queries)
    k = min(k, sum(len(shard) for _, shard in live))
    if bm25:
        per_query = _bm25(live, list(inputs), k, where)
    else:
        per_query = _dense(live, np.ascontiguousarray(inputs, dtype=np.float32), k, where)
    parts = [_merged(live, found, k) for found in per_query]
    offsets = np.zeros(n_queries + 1, dtype=np.int64)
    np.cumsum([len(p[0]) for p in parts], out=offsets[1:])
    return ShardAnswer(
        rows=np.concatenate([p[1] for p in parts]),
        scores=np.concatenate([p[2] for p in parts]),
        doc_keys=concat_keys([p[3] for p in parts]),
        offsets=offsets,
        shards=np.concatenate([p[0] for p in parts]),
    )


def _merged(
    live: list[tuple[int, IndexShard]], found: list[tuple[np.ndarray, np.ndarray]], k: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """One query's (rows, scores) per live shard -> its best k as (shards, rows, scores, keys)."""
    found = [(np.asarray(rows, dtype=np.int64), np.asarray(scores, dtype=np.float32)) for rows, scores in found]
    total = sum(len(rows) for rows, _ in found)
    if total > k:  # only rows scoring at least the k-th best score (ties kept) need ordering
        cut = np.partition(np.concatenate([scores for _, scores in found]), total - k)[total - k]
        found = [(rows[scores >= cut], scores[scores >= cut]) for rows, scores in found]
    shard = np.concatenate([np.full(len(rows), i, dtype=np.int64) for (i, _), (rows, _) in zip(live, found)])
    rows = np.concatenate([rows for rows, _ in found])
    scores = np.concatenate([scores for _, scores in found])
    keys = concat_keys([s.store.doc_keys_of(r) for (_, s), (r, _) in zip(live, found)])
    if not len(rows):
        return shard, rows, scores, keys
    order = np.lexsort((shard, rows, keys, -scores.astype(np.float64)))[:k]
    return shard[order], rows[order], scores[order], keys[order]


def _bm25(
    live: list[tuple[int, IndexShard]], queries: list[str], k: int, where: Filter | None
) -> list[list[tuple[np.ndarray, np.ndarray]]]:
    allowed = [None if where is None else shard.store.row_mask(where) for _, shard in live]
    analyzers = [shard.sparse.analyzer for _, shard in live]
    same = all(a.key == analyzers[0].key for a in analyzers)
    out = []
    for query in queries:
        terms = analyzers[0].terms(query) if same else None
        out.append([
            shard.sparse.top_of_terms(terms if same else shard.sparse.analyzer.terms(query), k, mask)
            for (_, shard), mask in zip(live, allowed)
        ])
    return out


def _dense(
    live: list[tuple[int, IndexShard]], vectors: np.ndarray, k: int, where: Filter | None
) -> list[list[tuple[np.ndarray, np.ndarray]]]:
    total = sum(len(shard) for _, shard in live)
    filtered = where is not None and any(shard.store.row_mask(where) is not None for _, shard in live)
    codes = None
    if not filtered and prefilter.usable(total, k):
        codes = _shared_prefilter([shard.dense for _, shard in live])
    if codes is None:  # each shard on its own (a filter scores only the rows it selects)
        per_shard = [shard.search_dense_arrays(vectors, min(k, len(shard)), where) for _, shard in live]
        return [[answers[q] for answers in per_shard] for q in range(len(vectors))]
    out = []
    for query in vectors:
        center, bound = codes.bounds(query)
        threshold = np.partition(center - bound, total - k)[total - k]
        rows = np.flatnonzero(center + bound >= threshold).astype(np.int64)
        scores = codes.rescore(query, rows)
        cuts = np.searchsorted(rows, codes.offsets).tolist()
        out.append([
            (rows[cuts[i] : cuts[i + 1]] - codes.offsets[i], scores[cuts[i] : cuts[i + 1]]) for i in range(len(live))
        ])
    return out


# first dense index of a group -> (references to the group's dense indexes, their prefilter)
_SHARED: weakref.WeakKeyDictionary[DenseIndex, tuple[tuple[weakref.ref, ...], prefilter.Int8Prefilter]] = (
    weakref.WeakKeyDictionary()
)


def _shared_prefilter(indexes: list[DenseIndex]) -> prefilter.Int8Prefilter | None:
    """One int8 prefilter over these flat indexes' rows, made on first use and kept while the
    indexes live (None if any of them is not flat). Two threads making it at once is harmless."""
    flats = [index.flat_index() for index in indexes]
    if any(flat is None for flat in flats):
        return None
    kept = _SHARED.get(indexes[0])
    if kept is None or len(kept[0]) != len(indexes) or any(ref() is not i for ref, i in zip(kept[0], indexes)):
        kept = (tuple(weakref.ref(index) for index in indexes), prefilter.Int8Prefilter.of(*flats))
        _SHARED[indexes[0]] = kept
    return kept[1]
