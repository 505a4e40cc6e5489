"""Shard answers -> ranked candidates, as arrays (fusion: retrieve/compiled.py).

These are the composition steps shared by the in-process pipeline and the Serve DAG. Every step
works on numpy arrays (rows, scores, document keys), never on one Python object per candidate:
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
from numba import njit

NO_KEYS = np.array([], dtype=np.str_)


@dataclass(frozen=True)
class ShardAnswer:
    """One shard's answer to a search for N queries, flat: query i's hits are the slice
    `offsets[i]:offsets[i + 1]` of `rows` (int64), `scores` (float32) and `doc_keys`, best
    first. Document keys sort like the document ids: the ids themselves, or int64 keys that the
    shards searched together share (index/store.py: share_document_keys). `shards` (int64, per
    hit) where one answer covers several shards searched as one (retrieve/joint.py); None where
    every hit is from the shard that was asked."""

    rows: np.ndarray
    scores: np.ndarray
    doc_keys: np.ndarray
    offsets: np.ndarray
    shards: np.ndarray | None = None

    @classmethod
    def of(
        cls, per_query: Sequence[tuple[np.ndarray, np.ndarray]], doc_keys_of: Callable[[np.ndarray], np.ndarray]
    ) -> ShardAnswer:
        """From each query's (rows, scores); `doc_keys_of(rows)` gives the rows' document keys."""
        if len(per_query) == 1:  # one query (the usual request): no concatenation
            rows, scores = per_query[0]
            if not len(rows):
                return cls.empty(1)
            rows, scores = np.asarray(rows, dtype=np.int64), np.asarray(scores, dtype=np.float32)
            return cls(rows, scores, doc_keys_of(rows), np.array([0, len(rows)], dtype=np.int64))
        sizes = [len(rows) for rows, _ in per_query]
        offsets = np.zeros(len(per_query) + 1, dtype=np.int64)
        np.cumsum(sizes, out=offsets[1:])
        if offsets[-1] == 0:
            return cls.empty(len(per_query))
        rows = np.concatenate([np.asarray(r, dtype=np.int64) for r, _ in per_query])
        scores = np.concatenate([np.asarray(s, dtype=np.float32) for _, s in per_query])
        return cls(rows, scores, doc_keys_of(rows), offsets)

    @classmethod
    def empty(cls, n_queries: int) -> ShardAnswer:
        """No hit for any of `n_queries` queries (a shard left empty)."""
        none = np.zeros(0, dtype=np.int64)
        return cls(none, np.zeros(0, dtype=np.float32), NO_KEYS, np.zeros(n_queries + 1, dtype=np.int64))

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def query(self, i: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        start, end = int(self.offsets[i]), int(self.offsets[i + 1])
        return self.rows[start:end], self.scores[start:end], self.doc_keys[start:end]

    def count(self, i: int) -> int:
        return int(self.offsets[i + 1] - self.offsets[i])

    def part(self, i: int, shard: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Query i's hits as merge_parts takes them: (shards, rows, scores, doc keys); `shard`:
        the shard that was asked, where the answer has no `shards`."""
        start, end = int(self.offsets[i]), int(self.offsets[i + 1])
        where = np.full(end - start, shard, dtype=np.int64) if self.shards is None else self.shards[start:end]
        return where, self.rows[start:end], self.scores[start:end], self.doc_keys[start:end]

    def as_lists(self) -> list[list[tuple[int, float, str]]]:
        """Per query, (row, score, document key) tuples (for tests and debugging)."""
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
    doc_keys: np.ndarray  # ordered like the document ids (see ShardAnswer)
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
        return first_occurrences(self.doc_keys)


def merge_shards(ranker: str, per_shard: Mapping[int, tuple[np.ndarray, np.ndarray, np.ndarray]], limit: int) -> Candidates:
    """Merge each shard's (rows, scores, doc_keys) into one list, best first, at most `limit`."""
    parts = [(np.full(len(rows), shard, dtype=np.int64), rows, scores, docs) for shard, (rows, scores, docs) in per_shard.items()]
    return merge_parts(ranker, parts, limit)


def merge_parts(
    ranker: str, parts: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]], limit: int
) -> Candidates:
    """Merge lists of (shards, rows, scores, doc_keys), each in the order rules already (one
    shard's answer, or several shards' merged), into one list, best first, at most `limit`."""
    if not parts or sum(len(p[1]) for p in parts) == 0:
        empty = np.zeros(0, dtype=np.int64)
        return Candidates(ranker, empty, empty, NO_KEYS, np.zeros(0, dtype=np.float64))
    if len(parts) == 1:
        # A shard answers in (score desc, row asc) order, and its rows are in document id
        # order, so its answer already follows the order rules (as does a merged answer).
        shards, rows, scores, docs = parts[0]
        return Candidates(
            ranker, np.asarray(shards[:limit], dtype=np.int64), np.asarray(rows[:limit], dtype=np.int64),
            docs[:limit], np.asarray(scores[:limit], dtype=np.float64),
        )
    shard = np.concatenate([np.asarray(p[0], dtype=np.int64) for p in parts])
    rows = np.concatenate([np.asarray(p[1], dtype=np.int64) for p in parts])
    scores = np.concatenate([np.asarray(p[2], dtype=np.float64) for p in parts])
    docs = concat_keys([p[3] for p in parts])
    order = np.lexsort((shard, rows, docs, -scores))[:limit]
    return Candidates(ranker, shard[order], rows[order], docs[order], scores[order])


def concat_keys(parts: Sequence[np.ndarray]) -> np.ndarray:
    """Document keys of several lists in one array. Empty parts are left out: numpy would turn
    integer keys into strings next to an empty string array (and "10" sorts before "9")."""
    parts = [p for p in parts if len(p)]
    if not parts:
        return np.zeros(0, dtype=np.int64)
    if len({p.dtype.kind for p in parts}) > 1:
        raise TypeError(f"document keys of different kinds cannot be ranked together: {sorted({str(p.dtype) for p in parts})}")
    return np.concatenate(parts)


def first_occurrences(values: np.ndarray) -> np.ndarray:
    """Ascending positions of the first occurrence of each distinct value."""
    if values.dtype == np.int64:
        return _int_first_occurrences(values)
    first = dense_codes(values)[1]
    first.sort()
    return first


def dense_codes(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Integer codes 0..n-1 for the n distinct `values`, in the values' order, and per code the
    position of its first occurrence. (A stable argsort: several times faster than np.unique
    on the few hundred strings of one query's candidates; one compiled call on int64 keys.)"""
    if values.dtype == np.int64:
        return _int_dense_codes(values)
    order = np.argsort(values, kind="stable")
    ordered = values[order]
    new = np.ones(len(values), dtype=bool)
    new[1:] = ordered[1:] != ordered[:-1]
    codes = np.empty(len(values), dtype=np.int64)
    codes[order] = np.cumsum(new) - 1
    return codes, order[new]


@njit(cache=True, nogil=True)
def _distinct(values):  # pragma: no cover - compiled
    """Per position its distinct value's number (numbered in order of first occurrence), and
    per number the value's first position: one pass with an open-addressing table."""
    n = len(values)
    size = 16
    while size < 2 * n:
        size *= 2
    mask = size - 1
    seen = np.empty(size, dtype=np.int64)
    number = np.full(size, -1, dtype=np.int64)
    which = np.empty(n, dtype=np.int64)
    firsts = np.empty(n, dtype=np.int64)
    m = 0
    for p in range(n):
        v = values[p]
        slot = (v * 0x9E3779B1) & mask
        while number[slot] >= 0 and seen[slot] != v:
            slot = (slot + 1) & mask
        if number[slot] < 0:
            number[slot] = m
            seen[slot] = v
            firsts[m] = p
            m += 1
        which[p] = number[slot]
    return which, firsts[:m]


@njit(cache=True, nogil=True)
def _int_dense_codes(values):  # pragma: no cover - compiled
    """dense_codes of int64 values: the distinct values found in one pass, then only they are
    sorted (distinct, so any sort is stable)."""
    which, firsts = _distinct(values)
    order = np.argsort(values[firsts])  # numbers by value
    code_of = np.empty(len(firsts), dtype=np.int64)
    for code in range(len(order)):
        code_of[order[code]] = code
    codes = np.empty(len(values), dtype=np.int64)
    for p in range(len(values)):
        codes[p] = code_of[which[p]]
    return codes, firsts[order]


@njit(cache=True, nogil=True)
def _int_first_occurrences(values):  # pragma: no cover - compiled
    """first_occurrences of int64 values (positions of first occurrence, ascending as found)."""
    return _distinct(values)[1]
