"""Several shards held by one process, searched as one: per query, their merged top k.

A plan that asks each of S shards for its own top k and then keeps the best k of the S k rows
does S times the work it keeps. For an exact dense search through the int8 prefilter it is
worse than that: k = 400 of a 2,500-row shard is a sixth of the shard, so nearly every row
becomes a candidate to rescore. Searched together, the shards share one prefilter
(index/prefilter.py, made on first use and kept while the shards are loaded): their codes are
scanned in one pass and cut at one threshold, the k-th best lower bound over all their rows,
which leaves as many candidates as one index of their combined size would, at the cost of one
scan. BM25 analyses the query once for all shards and, for groups of up to JOINT_BM25_ROWS
rows, reads one set of postings over all of them (`_Group.postings`).

The answer is the same as merging each shard's own top k and keeping k (candidates.py order
rules: score desc, then document key, row, shard). A group numbers its rows in that order of
ties (`_Group`: position p is the p-th row by (document key, row, shard)), so ordering by
(score desc, position asc) is the order rules themselves: the best k come out merged, with no
per-shard lists to merge. Where a group is not used (a filtered dense search, indexes that are
not flat, larger groups' BM25), each shard answers and the answers are merged (`_merged`):
within a shard the order rules order rows as the shard does (rows are stored in document
order), so the best k overall are, shard by shard, a prefix of that shard's own top k.
"""

from __future__ import annotations

import weakref
from typing import Any, Sequence

import numpy as np

from llmframe_ray.index import prefilter
from llmframe_ray.index.dense import DenseIndex
from llmframe_ray.index.metadata import Filter
from llmframe_ray.index.shard import IndexShard
from llmframe_ray.index.sparse_top import NO_MASK, bm25_top
from llmframe_ray.retrieve.candidates import ShardAnswer, concat_keys

# (shard id, shard) pairs; None for a shard left empty in this version
Held = Sequence[tuple[int, IndexShard | None]]
Live = list[tuple[int, IndexShard]]

# Above this many rows a group's BM25 runs shard by shard: its joint postings are a second
# copy of every shard's (SciFact's 9,981 chunks: 618,249 entries, 5 MB, 0.1 s to make).
JOINT_BM25_ROWS = 50_000


def search_together(shards: Held, bm25: bool, inputs: Any, k: int, where: Filter | None = None) -> ShardAnswer:
    """The merged top `k` of `shards` for each query (texts for BM25, else float32 vectors),
    with each hit's shard in the answer's `shards`; with `where`, of the rows it selects."""
    live = [(i, shard) for i, shard in shards if shard is not None and len(shard)]
    n_queries = len(inputs)
    if not live:
        return ShardAnswer.empty(n_queries)
    k = min(k, sum(len(shard) for _, shard in live))
    if bm25:
        found = _bm25(live, list(inputs), k, where)
    else:
        found = _dense(live, np.ascontiguousarray(inputs, dtype=np.float32), k, where)
    if isinstance(found, tuple):  # positions of the group, already in order
        group, per_query = found
        parts = [(group.shard[p], group.row[p], scores, group.keys[p]) for p, scores in per_query]
    else:
        parts = [_merged(live, answers, k) for answers in found]
    offsets = np.zeros(n_queries + 1, dtype=np.int64)
    np.cumsum([len(p[0]) for p in parts], out=offsets[1:])
    return ShardAnswer(
        rows=np.concatenate([p[1] for p in parts]),
        scores=np.concatenate([np.asarray(p[2], dtype=np.float32) for p in parts]),
        doc_keys=concat_keys([p[3] for p in parts]),
        offsets=offsets,
        shards=np.concatenate([p[0] for p in parts]),
    )


class _Group:
    """Live shards numbered as one index. `offsets`: where each shard's rows start when they
    are numbered shard after shard (the shared prefilter's numbering); `position` maps that
    numbering to the group's, in which rows follow the order rules' ties (document key, row,
    shard id); `shard`, `row` and `keys` give each position's shard id, row and document key."""

    def __init__(self, live: Live) -> None:
        sizes = [len(shard) for _, shard in live]
        self.ids = [i for i, _ in live]
        self.offsets = np.cumsum([0, *sizes], dtype=np.int64)
        ids = np.repeat(np.asarray([i for i, _ in live], dtype=np.int64), sizes)
        rows = np.concatenate([np.arange(n, dtype=np.int64) for n in sizes])
        keys = concat_keys([shard.store.doc_keys_of(np.arange(n)) for (_, shard), n in zip(live, sizes)])
        order = np.lexsort((ids, rows, keys))
        self.shard, self.row, self.keys = ids[order], rows[order], keys[order]
        self.position = np.empty(len(order), dtype=np.int64)
        self.position[order] = np.arange(len(order), dtype=np.int64)
        self._postings: tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, int]] | None = None

    def __len__(self) -> int:
        return len(self.position)

    def postings(self, live: Live) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, int]]:
        """The shards' BM25 score matrices as one (CSC over the terms of all of them, rows as
        positions), made on first use. Every entry is the shard's own, so a row's float32 sum
        over a query's terms, in the query's order, is the one its shard computes."""
        if self._postings is None:
            vocab: dict[str, int] = {}
            terms, positions, values = [], [], []
            for (_, shard), start in zip(live, self.offsets.tolist()):
                data, indices, indptr, own = shard.sparse.postings()
                column = np.empty(len(indptr) - 1, dtype=np.int64)
                for term, c in own.items():
                    column[c] = vocab.setdefault(term, len(vocab))
                terms.append(np.repeat(column, np.diff(indptr)))
                positions.append(self.position[start + np.asarray(indices, dtype=np.int64)].astype(np.int32))
                values.append(np.asarray(data, dtype=np.float32))
            term, where, value = np.concatenate(terms), np.concatenate(positions), np.concatenate(values)
            order = np.lexsort((where, term))
            pointers = np.zeros(len(vocab) + 1, dtype=np.int64)
            np.cumsum(np.bincount(term, minlength=len(vocab)), out=pointers[1:])
            self._postings = (value[order], where[order], pointers, vocab)
        return self._postings

    def mask(self, masks: Sequence[np.ndarray | None]) -> np.ndarray:
        """The shards' row masks (None: every row) over the group's positions."""
        if all(m is None for m in masks):
            return NO_MASK
        allowed = np.ones(len(self), dtype=np.bool_)
        for m, start, end in zip(masks, self.offsets[:-1].tolist(), self.offsets[1:].tolist()):
            if m is not None:
                allowed[self.position[start:end]] = m
        return allowed


# first live shard of a group -> (references to the group's shards, the group)
_GROUPS: weakref.WeakKeyDictionary[IndexShard, tuple[tuple[weakref.ref, ...], _Group]] = weakref.WeakKeyDictionary()


def prepare(shards: Held) -> None:
    """Make what searching these shards together uses (their group, its BM25 postings, their
    shared prefilter) now, where they are loaded, so that no request waits for it."""
    live = [(i, shard) for i, shard in shards if shard is not None and len(shard)]
    if len(live) < 2:  # one shard is searched on its own
        return
    joint_bm25 = _joint_bm25(live)
    total = sum(len(shard) for _, shard in live)
    codes = _shared_prefilter([shard.dense for _, shard in live]) if total >= prefilter.MIN_ROWS else None
    if joint_bm25 or codes is not None:  # else (large groups of ANN indexes) no search uses a group
        group = _group(live)
        if joint_bm25:
            group.postings(live)


def _joint_bm25(live: Live) -> bool:
    """Whether BM25 searches these shards through their group: they analyse text alike and
    hold at most JOINT_BM25_ROWS rows."""
    analyzers = {shard.sparse.analyzer.key for _, shard in live}
    return len(analyzers) == 1 and sum(len(shard) for _, shard in live) <= JOINT_BM25_ROWS


def _group(live: Live) -> _Group:
    """The group of these live shards (ids and shards), made on first use and kept while the
    shards live."""
    ids = [i for i, _ in live]
    return _kept(_GROUPS, [s for _, s in live], lambda: _Group(live), lambda group: group.ids == ids)


def _kept(cache: weakref.WeakKeyDictionary, objects: Sequence[Any], make: Any, fits: Any = lambda _: True) -> Any:
    """What `make()` made for these objects, kept in `cache` under the first of them while it
    lives and while they are the same objects (and `fits` it); else made again. Two threads
    making it at once is harmless."""
    kept = cache.get(objects[0])
    if kept is None or len(kept[0]) != len(objects) or any(ref() is not o for ref, o in zip(kept[0], objects)) \
            or not fits(kept[1]):
        kept = (tuple(weakref.ref(o) for o in objects), make())
        cache[objects[0]] = kept
    return kept[1]


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


Found = list[list[tuple[np.ndarray, np.ndarray]]] | tuple[_Group, list[tuple[np.ndarray, np.ndarray]]]


def _bm25(live: Live, queries: list[str], k: int, where: Filter | None) -> Found:
    """Per query, each shard's (rows, scores); or, where the shards share an analyzer and the
    group is small enough, the group and per query its best k (positions, scores) in order."""
    allowed = [None if where is None else shard.store.row_mask(where) for _, shard in live]
    analyzers = [shard.sparse.analyzer for _, shard in live]
    same = all(a.key == analyzers[0].key for a in analyzers)
    if _joint_bm25(live):
        group = _group(live)
        data, positions, pointers, vocab = group.postings(live)
        mask = group.mask(allowed)
        out = []
        for query in queries:
            ids = np.asarray([vocab[t] for t in analyzers[0].terms(query) if t in vocab], dtype=np.int64)
            out.append(bm25_top(data, positions, pointers, len(group), ids, k, mask))
        return group, out
    found = []
    for query in queries:
        terms = analyzers[0].terms(query) if same else None
        found.append([
            shard.sparse.top_of_terms(terms if same else shard.sparse.analyzer.terms(query), k, mask)
            for (_, shard), mask in zip(live, allowed)
        ])
    return found


def _dense(live: Live, vectors: np.ndarray, k: int, where: Filter | None) -> Found:
    """Per query, each shard's (rows, scores); or, through the shards' shared prefilter, the
    group and per query its best k (positions, scores) in order."""
    total = sum(len(shard) for _, shard in live)
    filtered = where is not None and any(shard.store.row_mask(where) is not None for _, shard in live)
    codes = None
    if not filtered and prefilter.usable(total, k):
        codes = _shared_prefilter([shard.dense for _, shard in live])
    if codes is None:  # each shard on its own (a filter scores only the rows it selects)
        per_shard = [shard.search_dense_arrays(vectors, min(k, len(shard)), where) for _, shard in live]
        return [[answers[q] for answers in per_shard] for q in range(len(vectors))]
    group = _group(live)
    out = []
    for query in vectors:
        rows = codes.candidates(query, k)  # numbered shard after shard
        scores = codes.rescore(query, rows)
        positions = group.position[rows]
        best = np.lexsort((positions, -scores.astype(np.float64)))[:k]
        out.append((positions[best], scores[best]))
    return group, out


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
    return _kept(_SHARED, indexes, lambda: prefilter.Int8Prefilter.of(*flats))
