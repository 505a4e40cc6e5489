"""RRF fusion of one query's candidate lists as one compiled call (numba).

The order rules are those of retrieve/candidates.py: RRF score descending, then the best
(smallest) rank in any list, then the key (a document code, or a chunk's (document code, row,
shard)); scores are the same float64 sums, w / (k + rank) added list by list in the lists'
order. Done with numpy, one query's fusion took about 30 array calls of a few microseconds each
on a few hundred candidates, more than a third of what retrieval adds to the model's time;
here it is one call.

Inputs are one query's ranked lists concatenated: list i is `[bounds[i], bounds[i + 1])` of
`docs` (dense integer codes, ordered like the document ids), `rows` and `shards`, best first,
each list holding distinct chunks. Compiled on first use and cached on disk by numba.
"""

from __future__ import annotations

import numpy as np
from numba import njit

_NO_RANK = np.iinfo(np.int64).max
_PARTIAL_MAX = 64  # _fused_order keeps a sorted buffer below this limit


@njit(cache=True, nogil=True)
def _chunk_ids(docs, rows, shards, n_docs):  # pragma: no cover - compiled
    """Per position, a code for its chunk (equal chunks, equal codes; codes ordered by
    (document, row, shard)), the number of chunks, and per code its first position."""
    n = len(docs)
    # Counting sort by document, then insertion sort by (row, shard) inside each document.
    starts = np.zeros(n_docs + 1, dtype=np.int64)
    for p in range(n):
        starts[docs[p] + 1] += 1
    for d in range(n_docs):
        starts[d + 1] += starts[d]
    fill = starts[:-1].copy()
    order = np.empty(n, dtype=np.int64)
    for p in range(n):
        order[fill[docs[p]]] = p
        fill[docs[p]] += 1
    for d in range(n_docs):
        for j in range(starts[d] + 1, starts[d + 1]):
            p = order[j]
            i = j - 1
            while i >= starts[d] and (rows[order[i]] > rows[p] or (rows[order[i]] == rows[p] and shards[order[i]] > shards[p])):
                order[i + 1] = order[i]
                i -= 1
            order[i + 1] = p
    codes = np.empty(n, dtype=np.int64)
    first = np.empty(n, dtype=np.int64)
    n_codes = 0
    for j in range(n):
        p = order[j]
        if j == 0 or docs[p] != docs[order[j - 1]] or rows[p] != rows[order[j - 1]] or shards[p] != shards[order[j - 1]]:
            first[n_codes] = p
            n_codes += 1
        elif p < first[n_codes - 1]:
            first[n_codes - 1] = p
        codes[p] = n_codes - 1
    return codes, n_codes, first[:n_codes]


@njit(cache=True, nogil=True)
def _before(score_a, best_a, key_a, score_b, best_b, key_b):  # pragma: no cover - compiled
    """Whether item a is fused ahead of item b (keys compare as integers)."""
    if score_a != score_b:
        return score_a > score_b
    if best_a != best_b:
        return best_a < best_b
    return key_a < key_b


@njit(cache=True, nogil=True)
def _fused_order(items, scores, best, limit):  # pragma: no cover - compiled
    """`items` (distinct codes, each its own key) in fused order, at most `limit`: the best
    `limit` kept in order as they come where `limit` is small (one query's top k), else a
    stable bottom-up merge sort. Both give the one order, since no two items tie."""
    n = len(items)
    if limit < _PARTIAL_MAX and limit < n:
        top = np.empty(limit, dtype=np.int64)
        kept = 0
        for x in items:
            if kept == limit:
                w = top[kept - 1]
                if not _before(scores[x], best[x], x, scores[w], best[w], w):
                    continue
                kept -= 1
            i = kept
            while i > 0:
                y = top[i - 1]
                if not _before(scores[x], best[x], x, scores[y], best[y], y):
                    break
                top[i] = y
                i -= 1
            top[i] = x
            kept += 1
        return top
    a = items.copy()
    b = np.empty(n, dtype=np.int64)
    width = 1
    while width < n:
        for lo in range(0, n, 2 * width):
            mid = min(lo + width, n)
            hi = min(lo + 2 * width, n)
            i, j, out = lo, mid, lo
            while i < mid and j < hi:
                x, y = a[i], a[j]
                if _before(scores[y], best[y], y, scores[x], best[x], x):
                    b[out] = y
                    j += 1
                else:
                    b[out] = x
                    i += 1
                out += 1
            while i < mid:
                b[out] = a[i]
                i += 1
                out += 1
            while j < hi:
                b[out] = a[j]
                j += 1
                out += 1
        a, b = b, a
        width *= 2
    return a[: min(limit, n)]


@njit(cache=True, nogil=True)
def _rrf(codes, bounds, weights, k, depth, n_codes):  # pragma: no cover - compiled
    """RRF over each list's first `depth` distinct codes: per code its score, its rank in
    each list (0: absent) and its best rank."""
    n_lists = len(bounds) - 1
    scores = np.zeros(n_codes, dtype=np.float64)
    ranks = np.zeros((n_lists, n_codes), dtype=np.int64)
    best = np.full(n_codes, _NO_RANK, dtype=np.int64)
    for i in range(n_lists):
        rank = 0
        for p in range(bounds[i], bounds[i + 1]):
            c = codes[p]
            if ranks[i, c] > 0:
                continue
            rank += 1
            if rank > depth:
                break
            ranks[i, c] = rank
            scores[c] += weights[i] / (k + rank)
            if rank < best[c]:
                best[c] = rank
    return scores, ranks, best


@njit(cache=True, nogil=True)
def fuse_chunks(docs, rows, shards, bounds, weights, k, depth, limit):  # pragma: no cover - compiled
    """Chunks fused over each list's first `depth` chunks: the top `limit` as (a position of
    the chunk in the concatenated lists, score, ranks per list)."""
    codes, n_codes, first = _chunk_ids(docs, rows, shards, docs.max() + 1 if len(docs) else 0)
    scores, ranks, best = _rrf(codes, bounds, weights, k, depth, n_codes)
    present = np.flatnonzero(best != _NO_RANK)
    top = _fused_order(present, scores, best, limit)
    return first[top], scores[top], ranks[:, top]


@njit(cache=True, nogil=True)
def fuse_documents(docs, rows, shards, bounds, weights, k, depth, limit):  # pragma: no cover - compiled
    """Documents fused over each list's first `depth` distinct documents, each represented by
    its chunk that ranks highest when the whole chunk lists are fused: the top `limit` as
    (a position of that chunk in the concatenated lists, score, ranks per list)."""
    n_docs = docs.max() + 1 if len(docs) else 0
    codes, n_codes, first = _chunk_ids(docs, rows, shards, n_docs)
    chunk_scores, _, chunk_best = _rrf(codes, bounds, weights, k, len(docs), n_codes)
    # Chunk codes follow (document, row, shard) order, so a smaller code is a smaller key.
    representative = np.full(n_docs, -1, dtype=np.int64)
    for c in range(n_codes):
        d = docs[first[c]]
        r = representative[d]
        if r < 0 or _before(chunk_scores[c], chunk_best[c], c, chunk_scores[r], chunk_best[r], r):
            representative[d] = c
    scores, ranks, best = _rrf(docs, bounds, weights, k, depth, n_docs)
    present = np.flatnonzero(best != _NO_RANK)
    top = _fused_order(present, scores, best, limit)
    return first[representative[top]], scores[top], ranks[:, top]
