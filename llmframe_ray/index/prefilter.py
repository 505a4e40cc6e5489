"""Exact top-k over a flat index that reads a quarter of the bytes: an int8 scan, then rescoring.

A flat search reads every stored float32 vector. For one query of a 10^4 x 384 shard that is
15 MB, which the model's own weights have just pushed out of the cache: the scan costs more
than twice what it costs warm (~2.4 ms against ~1 ms here). This module keeps one byte per
dimension (per-dimension min/max scalar quantization) and, per query:

1. scores every row approximately from its codes: a_j = q . lo + sum_i (q_i step_i) c_ji;
2. bounds each approximation's distance to FAISS's own float32 score s_j:
       |s_j - a_j| <= b_j = |q| (e_j + gamma |x_j|) + E_q + slack
   where e_j = |x_j - decoded x_j| (the quantization residual, computed once), gamma |q| |x_j|
   bounds FAISS's float32 rounding of a d-term dot product, and E_q bounds the float32 rounding
   of step 1's sum;
3. takes T, the k-th largest lower bound a_j - b_j: at least k rows score >= T, so no row whose
   upper bound a_j + b_j is below T can be in the top k or tied with the k-th score;
4. scores the remaining candidates exactly with FAISS's own kernel (fvec_inner_products_by_idx,
   the same bits as IndexFlatIP.search) and orders them by score desc, then row asc.

The result is therefore exactly the flat search's: same rows, same float32 scores, same order.
On SciFact (9,981 chunks) a query at k = 401 rescored ~535 candidates.
"""

from __future__ import annotations

from typing import Sequence

import faiss
import numpy as np
from numba import njit

_U = 2.0 ** -24  # unit roundoff of float32

# Below this many rows the float32 scan is cheap enough; at or above this share of the rows
# for k the candidates are most of the index.
MIN_ROWS = 2048
MAX_K_SHARE = 0.25


def usable(n_rows: int, k: int) -> bool:
    return n_rows >= MIN_ROWS and k <= MAX_K_SHARE * n_rows


class Int8Prefilter:
    """Codes and error bounds of flat indexes' vectors, for `top_k`; build with `of`.

    Several indexes (the shards one process searches as one, retrieve/joint.py) can share one
    prefilter: their rows are numbered one after another (`offsets`), quantised with one range
    per dimension, and scanned in one pass, so a query pays for one scan and one threshold
    however many shards there are. Rescoring reads each row from its own index's storage.
    """

    def __init__(self, vectors: np.ndarray | Sequence[np.ndarray], block: int = 1 << 16) -> None:
        parts = [vectors] if isinstance(vectors, np.ndarray) else list(vectors)
        d = parts[0].shape[1]
        self._parts = parts  # float32 (n_i, d), C order: the indexes' own storage
        self._owners: tuple[faiss.IndexFlat, ...] = ()  # what `of` made views of
        self.offsets = np.cumsum([0, *(len(v) for v in parts)], dtype=np.int64)
        n = int(self.offsets[-1])
        live = [v for v in parts if len(v)]
        self._lo = np.min([v.min(axis=0) for v in live], axis=0).astype(np.float64) if live else np.zeros(d)
        top = np.max([v.max(axis=0) for v in live], axis=0).astype(np.float64) if live else np.zeros(d)
        span = top - self._lo
        self._step = np.where(span > 0, span / 255.0, 1.0)
        self._codes = np.empty((n, d), dtype=np.uint8)
        residual = np.empty(n, dtype=np.float64)
        norms = np.empty(n, dtype=np.float64)
        for part, offset in zip(parts, self.offsets.tolist()):
            for start in range(0, len(part), block):  # float64 work in blocks: 10^6 x 384 at once is 3 GB
                wide = part[start : start + block].astype(np.float64)
                at = slice(offset + start, offset + start + len(wide))
                codes = np.clip(np.rint((wide - self._lo) / self._step), 0, 255)
                self._codes[at] = codes
                residual[at] = np.linalg.norm(wide - (self._lo + self._step * codes), axis=1)
                norms[at] = np.linalg.norm(wide, axis=1)
        self._row_bound = residual * (1.0 + 1e-12) + _gamma(d + 1) * norms
        self._max_norm = float(norms.max()) if n else 0.0

    @classmethod
    def of(cls, *indexes: faiss.IndexFlat) -> Int8Prefilter:
        """The prefilter of one flat index, or of several numbered one after another."""
        made = cls([stored(index) for index in indexes])
        made._owners = indexes  # the arrays are views of their storage: keep it alive
        return made

    def top_k(self, query: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The exact best `k` rows for one float32 query: (scores float32, rows int64)."""
        candidates = self.candidates(query, k)
        scores = self.rescore(query, candidates)
        # candidates ascend, so a stable sort by score descending breaks ties by row
        order = np.argsort(-scores, kind="stable")[:k]
        return scores[order], candidates[order]

    def candidates(self, query: np.ndarray, k: int) -> np.ndarray:
        """Rows (int64, ascending) that can be in the exact top `k` of one float32 query or tied
        with its k-th score: steps 1 to 3 above, in two compiled passes over the rows."""
        approx, base, norm, constant = self._scan_query(query)
        return _select(approx, base, norm, self._row_bound, constant, k)

    def bounds(self, query: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Every row's approximate score and the bound on its distance to FAISS's own score
        (steps 1 and 2 above), float64. Any T that at least k rows' lower bounds reach (here or
        over several shards' rows together) selects, by upper bound >= T, every row that can
        be in the top k."""
        approx, base, norm, constant = self._scan_query(query)
        center = approx.astype(np.float64) + base
        bound = norm * self._row_bound + constant
        return center, bound

    def _scan_query(self, query: np.ndarray) -> tuple[np.ndarray, float, float, float]:
        """Step 1 for one query: (every row's float32 approximation without the query's base
        term, the base term q . lo, |q|, the bound's part that is the same for every row)."""
        d = self._codes.shape[1]
        wide = query.astype(np.float64)
        weights = (wide * self._step).astype(np.float32)
        base = float(wide @ self._lo)
        norm = float(np.sqrt(wide @ wide))
        # step 1's float32 sum: d products and d - 1 additions of terms |w_i| c_ji <= 255 |w_i|,
        # plus the rounding of w_i itself
        scan_error = _gamma(d + 2) * 255.0 * float(np.abs(weights.astype(np.float64)).sum())
        slack = 1e-9 * (1.0 + abs(base) + norm * self._max_norm)
        approx = np.empty(len(self._codes), dtype=np.float32)
        _scan(self._codes, weights, approx)
        return approx, base, norm, scan_error + slack

    @staticmethod
    def rescore_flat(vectors: np.ndarray, query: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """FAISS's own float32 inner products of `query` with `vectors[rows]` (the bits a flat
        search gives), one OpenMP iteration."""
        scores = np.empty(len(rows), dtype=np.float32)
        query = np.ascontiguousarray(query, dtype=np.float32)
        rows = np.ascontiguousarray(rows, dtype=np.int64)
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        threads = faiss.omp_get_max_threads()
        faiss.omp_set_num_threads(1)
        try:
            faiss.fvec_inner_products_by_idx(
                faiss.swig_ptr(scores), faiss.swig_ptr(query), faiss.swig_ptr(vectors),
                faiss.swig_ptr(rows), vectors.shape[1], 1, len(rows),
            )
        finally:
            faiss.omp_set_num_threads(threads)
        return scores

    def rescore(self, query: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """FAISS's own float32 scores of `rows` (int64, ascending where there are several
        parts) for one query."""
        d = self._codes.shape[1]
        scores = np.empty(len(rows), dtype=np.float32)
        query = np.ascontiguousarray(query, dtype=np.float32)
        if len(self._parts) == 1:
            local = [(self._parts[0], rows, 0)]
        else:
            cuts = np.searchsorted(rows, self.offsets).tolist()
            local = [
                (part, rows[cuts[i] : cuts[i + 1]] - self.offsets[i], cuts[i])
                for i, part in enumerate(self._parts) if cuts[i + 1] > cuts[i]
            ]
        # One query is one OpenMP iteration: run it without a parallel region, whose idle
        # threads spin on the other core after it (they slowed the next encode by half here).
        threads = faiss.omp_get_max_threads()
        faiss.omp_set_num_threads(1)  # the calling thread's setting only
        try:
            for part, ids, at in local:
                ids = np.ascontiguousarray(ids, dtype=np.int64)
                faiss.fvec_inner_products_by_idx(
                    faiss.swig_ptr(scores[at:]), faiss.swig_ptr(query), faiss.swig_ptr(part),
                    faiss.swig_ptr(ids), d, 1, len(ids),
                )
        finally:
            faiss.omp_set_num_threads(threads)
        return scores


def stored(index: faiss.IndexFlat) -> np.ndarray:
    """A flat index's vectors, as the (n, d) float32 array it stores (no copy)."""
    n, d = int(index.ntotal), int(index.d)
    return faiss.rev_swig_ptr(index.get_xb(), n * d).reshape(n, d)


def _gamma(n: int) -> float:
    """The classic bound on the relative rounding error of n float32 operations in sequence
    (any order of summation): n u / (1 - n u)."""
    return n * _U / (1.0 - n * _U)


@njit(cache=True, nogil=True, fastmath=True)
def _scan(codes, weights, out):  # pragma: no cover - compiled
    """out[j] = sum_i weights[i] * codes[j, i] in float32 (any summation order: fastmath).
    (Four rows at a time was a third faster with the codes in the cache, and slower right after
    an encode, when they are not.)"""
    n, d = codes.shape
    for j in range(n):
        acc = np.float32(0.0)
        for i in range(d):
            acc += weights[i] * np.float32(codes[j, i])
        out[j] = acc


@njit(cache=True, nogil=True)
def _lower_bounds(approx, base, norm, row_bound, constant, out):  # pragma: no cover - compiled
    """Step 2: out[j] = center_j - b_j, center_j = approx_j + base, b_j = norm row_bound_j +
    constant (float64, in this order: not compiled with fastmath)."""
    for j in range(len(approx)):
        out[j] = (np.float64(approx[j]) + base) - (norm * row_bound[j] + constant)


@njit(cache=True, nogil=True)
def _reaching(approx, base, norm, row_bound, constant, threshold):  # pragma: no cover - compiled
    """Step 3: the rows whose upper bound center_j + b_j is at least `threshold`, ascending."""
    n = len(approx)
    out = np.empty(n, dtype=np.int64)
    found = 0
    for j in range(n):
        if (np.float64(approx[j]) + base) + (norm * row_bound[j] + constant) >= threshold:
            out[found] = j
            found += 1
    return out[:found]


@njit(cache=True, nogil=True)
def _kth_largest_finite(values, k):  # pragma: no cover - compiled
    """(the k-th largest of `values`, True), exactly the value np.partition(values, n - k)[n - k]
    gives (1 <= k <= n): a histogram of the values finds the bucket that holds it, and only that
    bucket's values are sorted. (0.0, False) where a value is not finite, or the values span
    too little or too much to bucket: the caller then partitions."""
    n = len(values)
    lo, hi = values[0], values[0]
    for j in range(n):
        v = values[j]
        if not np.isfinite(v):
            return 0.0, False
        lo = min(lo, v)
        hi = max(hi, v)
    scale = _BUCKETS / (hi - lo) if hi > lo else 0.0
    if scale == 0.0 or not np.isfinite(scale):
        return 0.0, False
    counts = np.zeros(_BUCKETS + 1, dtype=np.int64)
    for j in range(n):
        counts[min(int((values[j] - lo) * scale), _BUCKETS)] += 1
    above, bucket = 0, _BUCKETS
    while above + counts[bucket] < k:
        above += counts[bucket]
        bucket -= 1
    inside = np.empty(counts[bucket], dtype=np.float64)
    found = 0
    for j in range(n):
        if min(int((values[j] - lo) * scale), _BUCKETS) == bucket:
            inside[found] = values[j]
            found += 1
    inside.sort()
    return inside[found - (k - above)], True


_BUCKETS = 4096


def kth_largest(values: np.ndarray, k: int) -> float:
    """The k-th largest of float64 `values` (1 <= k <= len): np.partition's value, in ~18 us
    for 10^4 values where np.partition took ~85 us here (_kth_largest_finite)."""
    value, ok = _kth_largest_finite(values, k)
    return float(value) if ok else float(np.partition(values, len(values) - k)[len(values) - k])


def _select(approx: np.ndarray, base: float, norm: float, row_bound: np.ndarray, constant: float, k: int) -> np.ndarray:
    """Steps 2 and 3: the rows whose upper bound reaches the k-th largest lower bound, ascending."""
    n = len(approx)
    lower = np.empty(n, dtype=np.float64)
    _lower_bounds(approx, base, norm, row_bound, constant, lower)
    threshold = kth_largest(lower, k)
    return _reaching(approx, base, norm, row_bound, constant, threshold)
