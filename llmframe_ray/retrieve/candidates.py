"""Shard answers -> ranked candidates -> fused items, as arrays.

These are the composition steps shared by the in-process pipeline and the Serve DAG. Every step
works on numpy arrays (rows, scores, document ids), never on one Python object per candidate:
a hybrid query fuses hundreds of candidates per ranker, and per-candidate Python would cost more
than the model does.

Order rules (the same whatever the shard layout, so sharding never changes a ranking):
- a ranker's candidates: score descending, then document id, row and shard ascending (all
  chunks of a document live in one shard, and rows are stored in (document id, position)
  order);
- fused items: RRF score descending, then the best (smallest) rank in any list, then the key
  (a document id, or a chunk's (document id, row, shard)).
RRF sums w / (k + rank) over the lists in their given order, the same floating-point sums as
`fusion.reciprocal_rank_fusion`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import numpy as np

NO_DOC_IDS = np.array([], dtype=np.str_)


@dataclass(frozen=True)
class ShardAnswer:
    """One shard's answer to a search for N queries, flat: query i's hits are the slice
    `offsets[i]:offsets[i + 1]` of `rows` (int64), `scores` (float32) and `doc_ids` (str),
    best first."""

    rows: np.ndarray
    scores: np.ndarray
    doc_ids: np.ndarray
    offsets: np.ndarray

    @classmethod
    def of(
        cls, per_query: Sequence[tuple[np.ndarray, np.ndarray]], doc_ids_of: Callable[[np.ndarray], np.ndarray]
    ) -> ShardAnswer:
        """From each query's (rows, scores); `doc_ids_of(rows)` gives the rows' document ids."""
        sizes = [len(rows) for rows, _ in per_query]
        offsets = np.zeros(len(per_query) + 1, dtype=np.int64)
        np.cumsum(sizes, out=offsets[1:])
        if offsets[-1] == 0:
            return cls.empty(len(per_query))
        rows = np.concatenate([np.asarray(r, dtype=np.int64) for r, _ in per_query])
        scores = np.concatenate([np.asarray(s, dtype=np.float32) for _, s in per_query])
        return cls(rows, scores, doc_ids_of(rows), offsets)

    @classmethod
    def empty(cls, n_queries: int) -> ShardAnswer:
        """No hit for any of `n_queries` queries (a shard left empty)."""
        none = np.zeros(0, dtype=np.int64)
        return cls(none, np.zeros(0, dtype=np.float32), NO_DOC_IDS, np.zeros(n_queries + 1, dtype=np.int64))

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def query(self, i: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        start, end = int(self.offsets[i]), int(self.offsets[i + 1])
        return self.rows[start:end], self.scores[start:end], self.doc_ids[start:end]

    def count(self, i: int) -> int:
        return int(self.offsets[i + 1] - self.offsets[i])

    def as_lists(self) -> list[list[tuple[int, float, str]]]:
        """Per query, (row, score, document id) tuples (for tests and debugging)."""
        out = []
        for i in range(len(self)):
            rows, scores, docs = self.query(i)
            out.append([(int(r), float(s), str(d)) for r, s, d in zip(rows.tolist(), scores.tolist(), docs.tolist())])
        return out


@dataclass(frozen=True)
class Candidates:
    """One ranker's candidates for one query, merged over shards, best first."""

    ranker: str
    shards: np.ndarray  # int64
    rows: np.ndarray  # int64
    doc_ids: np.ndarray  # str
    scores: np.ndarray  # float64

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def n_documents(self) -> int:
        return len(self._firsts)

    def first_per_document(self, limit: int | None = None) -> np.ndarray:
        """Positions of each document's best chunk, in rank order (at most `limit`)."""
        return self._firsts[:limit]

    @functools.cached_property
    def _firsts(self) -> np.ndarray:
        return first_occurrences(self.doc_ids)


def merge_shards(ranker: str, per_shard: Mapping[int, tuple[np.ndarray, np.ndarray, np.ndarray]], limit: int) -> Candidates:
    """Merge each shard's (rows, scores, doc_ids) into one list, best first, at most `limit`."""
    shards = [np.full(len(rows), shard, dtype=np.int64) for shard, (rows, _, _) in per_shard.items()]
    parts = list(per_shard.values())
    if not parts or sum(len(p[0]) for p in parts) == 0:
        empty = np.zeros(0, dtype=np.int64)
        return Candidates(ranker, empty, empty, NO_DOC_IDS, np.zeros(0, dtype=np.float64))
    if len(parts) == 1:
        # A shard answers in (score desc, row asc) order, and its rows are in document id
        # order, so its answer already follows the order rules.
        rows, scores, docs = parts[0]
        return Candidates(
            ranker, shards[0][:limit], np.asarray(rows[:limit], dtype=np.int64), docs[:limit],
            np.asarray(scores[:limit], dtype=np.float64),
        )
    shard = np.concatenate(shards)
    rows = np.concatenate([np.asarray(p[0], dtype=np.int64) for p in parts])
    scores = np.concatenate([np.asarray(p[1], dtype=np.float64) for p in parts])
    docs = np.concatenate([p[2] for p in parts])
    order = np.lexsort((shard, rows, docs, -scores))[:limit]
    return Candidates(ranker, shard[order], rows[order], docs[order], scores[order])


def first_occurrences(values: np.ndarray) -> np.ndarray:
    """Ascending positions of the first occurrence of each distinct value."""
    first = dense_codes(values)[1]
    first.sort()
    return first


def dense_codes(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Integer codes 0..n-1 for the n distinct `values`, in the values' order, and per code the
    position of its first occurrence. (A stable argsort: several times faster than np.unique
    on the few hundred strings of one query's candidates.)"""
    order = np.argsort(values, kind="stable")
    ordered = values[order]
    new = np.ones(len(values), dtype=bool)
    new[1:] = ordered[1:] != ordered[:-1]
    codes = np.empty(len(values), dtype=np.int64)
    codes[order] = np.cumsum(new) - 1
    return codes, order[new]


@dataclass(frozen=True)
class Fused:
    """RRF over lists of integer codes (codes ordered like the keys they stand for): per
    distinct code, in fused order, its score and its rank in each list (0: absent)."""

    codes: np.ndarray
    scores: np.ndarray
    ranks: np.ndarray  # (n lists, n codes)


def fuse_codes(lists: Sequence[np.ndarray], weights: Sequence[float], k: int, n_codes: int, limit: int | None = None) -> Fused:
    """Each list holds distinct codes in [0, n_codes), best first."""
    scores = np.zeros(n_codes, dtype=np.float64)
    ranks = np.zeros((len(lists), n_codes), dtype=np.int64)
    for i, (codes, weight) in enumerate(zip(lists, weights)):
        positions = np.arange(1, len(codes) + 1, dtype=np.int64)
        scores[codes] += float(weight) / (k + positions)
        ranks[i, codes] = positions
    present = np.flatnonzero(ranks.any(axis=0))
    best = np.where(ranks[:, present] > 0, ranks[:, present], np.iinfo(np.int64).max).min(axis=0)
    order = present[np.lexsort((present, best, -scores[present]))][:limit]
    return Fused(order, scores[order], ranks[:, order])


def split(values: np.ndarray, sizes: Sequence[int]) -> list[np.ndarray]:
    """`values` cut into consecutive pieces of these sizes."""
    bounds = np.cumsum([0, *sizes])
    return [values[bounds[i] : bounds[i + 1]] for i in range(len(sizes))]


def chunk_codes(parts: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray]]) -> tuple[list[np.ndarray], np.ndarray]:
    """Integer codes for chunks given as (documents, rows, shards), ordered by (document, row,
    shard); also, per code, the position in the concatenated parts of one chunk holding it.
    Documents are ids or their integer codes (cheaper)."""
    docs = np.concatenate([p[0] for p in parts])
    rows = np.concatenate([p[1] for p in parts])
    shards = np.concatenate([p[2] for p in parts])
    order = np.lexsort((shards, rows, docs))
    new = np.ones(len(order), dtype=bool)
    if len(order) > 1:
        same = (docs[order][1:] == docs[order][:-1]) & (rows[order][1:] == rows[order][:-1]) & (shards[order][1:] == shards[order][:-1])
        new[1:] = ~same
    sorted_codes = np.cumsum(new) - 1
    codes = np.empty(len(order), dtype=np.int64)
    codes[order] = sorted_codes
    representative = order[new]
    return split(codes, [len(p[0]) for p in parts]), representative
