"""Dense retrieval over one shard: a FAISS index with the inner-product metric.

Vectors are expected to be L2-normalised float32, so the inner product is the cosine similarity
(this module does not check the norms). Three kinds: `flat` (exact), `hnsw` and `ivf` (IVF-Flat,
trained on the vectors it indexes), and `auto`, the default, which builds a shard of up to
`flat_max_rows` vectors as flat and a larger one as HNSW (chosen with benchmarks/ann.py: see
AUTO_FLAT_MAX_ROWS).

Result order is deterministic: score descending, then row ascending. For `flat` this also holds
at the k-th place: FAISS picks an arbitrary subset of rows tied there once k is large, so the
search widens its window until the tie group at the cut-off is complete. On a flat index of
2,048 rows or more, a search for up to a quarter of them scans one-byte codes first and rescores
only the rows that can reach the top k (index/prefilter.py): the same rows, scores and order.
"""

from __future__ import annotations

import math
import shutil
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

import faiss
import numpy as np
from numba import njit

from llmframe_ray.index import atomic, prefilter
from llmframe_ray.types import Choice


EXACT_FILTER_ROWS = 65536  # an IVF index scores up to this many filtered rows exactly
PREFILTER_SHARE = 0.1  # a flat index's filter keeping more of its rows goes through the int8 prefilter
# `auto` builds a shard of more vectors than this as HNSW. Measured on 2 cores with MiniLM-like
# vectors (benchmarks/ann.py, README "Scale"), one query, top 100: an exact search costs 0.44 ms
# at 10^4 rows, 3.2 ms at 5 * 10^4 and 11.6 ms at 2.5 * 10^5; HNSW (M 32, efConstruction 200,
# efSearch 128) 0.46, 0.80 and 0.85 ms at recall@100 0.98-0.99 of exact. A query searches every
# shard a process holds, so the exact cost adds up over its shards.
AUTO_FLAT_MAX_ROWS = 20_000


class DenseIndexKind(Choice):
    AUTO = "auto"  # resolved per shard at build: DenseParams.resolve
    FLAT = "flat"
    HNSW = "hnsw"
    IVF = "ivf"


def _positive_int(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


@dataclass(frozen=True)
class DenseParams:
    """How a dense index is built and searched.

    `ivf_nlist=None` picks round(4 * sqrt(n)) lists; any value is clamped to [1, n] at build.
    `hnsw_ef_search` and `ivf_nprobe` are search-time settings, applied again after a load.
    `flat_max_rows` is where `auto` turns from flat to HNSW.
    """

    kind: DenseIndexKind = DenseIndexKind.AUTO
    hnsw_m: int = 32
    hnsw_ef_construction: int = 200
    hnsw_ef_search: int = 128
    ivf_nlist: int | None = None
    ivf_nprobe: int = 16
    flat_max_rows: int = AUTO_FLAT_MAX_ROWS

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", DenseIndexKind.from_str(self.kind))
        for name in ("hnsw_m", "hnsw_ef_construction", "hnsw_ef_search", "ivf_nprobe", "flat_max_rows"):
            _positive_int(name, getattr(self, name))
        if self.ivf_nlist is not None:
            _positive_int("ivf_nlist", self.ivf_nlist)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "kind": self.kind.value}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DenseParams:
        return cls(**dict(data))

    def resolve(self, n: int) -> DenseParams:
        """The parameters a shard of `n` vectors is built with: `auto` becomes flat or HNSW."""
        if self.kind is not DenseIndexKind.AUTO:
            return self
        return replace(self, kind=DenseIndexKind.FLAT if n <= self.flat_max_rows else DenseIndexKind.HNSW)

    def resolved_nlist(self, n: int) -> int:
        """The number of IVF lists used for `n` vectors."""
        wanted = self.ivf_nlist if self.ivf_nlist is not None else round(4 * math.sqrt(n))
        return max(1, min(int(wanted), n))


def _check_matrix(name: str, array: Any, dim: int | None = None) -> np.ndarray:
    if not isinstance(array, np.ndarray):
        raise ValueError(f"{name} must be a numpy array, got {type(array).__name__}")
    if array.ndim != 2:
        raise ValueError(f"{name} must be 2-D (n, dim), got shape {array.shape}")
    if array.dtype != np.float32:
        raise ValueError(f"{name} must be float32, got {array.dtype}")
    if array.shape[1] == 0:
        raise ValueError(f"{name} must have at least one dimension, got shape {array.shape}")
    if dim is not None and array.shape[1] != dim:
        raise ValueError(f"{name} have dimension {array.shape[1]}; the index has {dim}")
    if not np.isfinite(array).all():
        raise ValueError(f"{name} contain NaN or infinite values")
    return np.ascontiguousarray(array)


def _sort_rows(scores: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Order each query's results by score descending, then row ascending; -1 rows go last."""
    scores = np.where(rows < 0, -np.inf, scores).astype(np.float32)
    rows = np.array(rows, dtype=np.int64)
    _sort_each_row(scores, rows)
    return scores, rows


@njit(cache=True, nogil=True)
def _sort_each_row(scores, rows):  # pragma: no cover - compiled
    """In place, per query: an insertion sort, linear on FAISS's answers, which come ordered by
    score already and need only their tied rows put in order."""
    for q in range(scores.shape[0]):
        for j in range(1, scores.shape[1]):
            score, row = scores[q, j], rows[q, j]
            i = j - 1
            while i >= 0 and (scores[q, i] < score or (scores[q, i] == score and rows[q, i] > row)):
                scores[q, i + 1] = scores[q, i]
                rows[q, i + 1] = rows[q, i]
                i -= 1
            scores[q, i + 1] = score
            rows[q, i + 1] = row


class DenseIndex:
    """A FAISS inner-product index plus the parameters it was built with."""

    def __init__(
        self, index: faiss.Index, params: DenseParams, source: Path | None = None
    ) -> None:
        self._index = index
        self.params = params
        self._source = source  # the file a loaded index was read from; it never changes
        self._prefilter: prefilter.Int8Prefilter | None = None  # flat only: see _exact_search
        self._apply_search_params()

    @classmethod
    def build(cls, vectors: np.ndarray, params: DenseParams) -> DenseIndex:
        """Index `vectors` (n, dim) float32; row i of the index is `vectors[i]`."""
        vectors = _check_matrix("vectors", vectors)
        n, dim = vectors.shape
        if n == 0:
            raise ValueError("cannot build a dense index from zero vectors")
        params = params.resolve(n)
        if params.kind is DenseIndexKind.FLAT:
            index = faiss.IndexFlatIP(dim)
        elif params.kind is DenseIndexKind.HNSW:
            # FAISS inserts HNSW nodes from several OpenMP threads, so two builds of the same
            # vectors may link the graph differently: approximate results are not bit-for-bit
            # reproducible across builds (flat and IVF are).
            index = faiss.IndexHNSWFlat(dim, params.hnsw_m, faiss.METRIC_INNER_PRODUCT)
            index.hnsw.efConstruction = params.hnsw_ef_construction
        else:
            params = replace(params, ivf_nlist=params.resolved_nlist(n))
            quantizer = faiss.IndexFlatIP(dim)
            index = faiss.IndexIVFFlat(quantizer, dim, params.ivf_nlist, faiss.METRIC_INNER_PRODUCT)
            index.train(vectors)  # the Python wrapper keeps `quantizer` alive with `index`
        index.add(vectors)
        return cls(index, params)

    @property
    def dim(self) -> int:
        return int(self._index.d)

    def vectors(self, rows: Sequence[int]) -> np.ndarray:
        """The stored vectors of `rows` (n, dim) float32, exactly as they were added (every kind
        this module builds stores full vectors: flat, HNSW's flat storage, IVF's lists)."""
        rows = np.asarray(rows, dtype=np.int64)
        if rows.size and (rows.min() < 0 or rows.max() >= len(self)):
            raise IndexError(f"rows must be in [0, {len(self)}), got {rows.min()}..{rows.max()}")
        if self.params.kind is DenseIndexKind.IVF:
            ivf = faiss.extract_index_ivf(self._index)
            ivf.make_direct_map()  # row -> (list, offset); built on demand, not stored
        out = np.empty((len(rows), self.dim), dtype=np.float32)
        for i, row in enumerate(rows.tolist()):
            out[i] = self._index.reconstruct(row)
        return out

    def __len__(self) -> int:
        return int(self._index.ntotal)

    def set_search_params(self, *, hnsw_ef_search: int | None = None, ivf_nprobe: int | None = None) -> None:
        """Change search-time settings of a built or loaded index (no effect on flat)."""
        changes: dict[str, int] = {}
        if hnsw_ef_search is not None:
            _positive_int("hnsw_ef_search", hnsw_ef_search)
            changes["hnsw_ef_search"] = hnsw_ef_search
        if ivf_nprobe is not None:
            _positive_int("ivf_nprobe", ivf_nprobe)
            changes["ivf_nprobe"] = ivf_nprobe
        if changes:
            self.params = replace(self.params, **changes)
            self._apply_search_params()

    def _apply_search_params(self) -> None:
        if self.params.kind is DenseIndexKind.HNSW:
            self._index.hnsw.efSearch = self.params.hnsw_ef_search
        elif self.params.kind is DenseIndexKind.IVF:
            self._index.nprobe = self.params.ivf_nprobe

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Best `min(k, len(self))` rows per query: `(scores, rows)`, each (q, min(k, n)).

        Scores are float32 inner products, rows int64. Slots an ANN index could not fill hold
        row -1 with score -inf, always at the end of their query's list; callers drop them.
        """
        _positive_int("k", k)
        queries = _check_matrix("queries", queries, self.dim)
        k = min(k, len(self))
        if self.params.kind is DenseIndexKind.FLAT:
            return self._exact_search(queries, k)
        scores, rows = self._index.search(queries, k)
        return _sort_rows(scores, rows)

    def search_within(self, queries: np.ndarray, k: int, allowed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The best `min(k, allowed rows)` of the rows `allowed` (a bool array) marks, per query:
        `(scores, rows)` as `search` returns them, a list per query (lengths may be below k).

        Exact for every kind while the allowed rows are at most EXACT_FILTER_ROWS (and always
        for flat and HNSW, whose flat storage is scored directly with FAISS's own kernel, the
        same float32 scores a flat search gives): the cost follows the rows allowed, so a
        selective filter is cheap. An IVF index with more allowed rows searches its lists
        with an id selector (approximate, like its unfiltered search)."""
        _positive_int("k", k)
        queries = _check_matrix("queries", queries, self.dim)
        rows = np.flatnonzero(np.asarray(allowed, dtype=bool)).astype(np.int64)
        k = min(k, len(rows))
        if k == 0:
            empty = (np.zeros(0, dtype=np.float32), np.zeros(0, dtype=np.int64))
            return [empty[0]] * len(queries), [empty[1]] * len(queries)
        if self.params.kind is DenseIndexKind.FLAT and len(rows) > PREFILTER_SHARE * len(self) and prefilter.usable(len(self), k):
            return self._prefiltered_within(queries, k, rows)
        storage = self._flat_storage()
        if storage is None and len(rows) > EXACT_FILTER_ROWS:
            selector = faiss.IDSelectorBatch(len(rows), faiss.swig_ptr(rows))
            search = faiss.SearchParametersIVF(sel=selector, nprobe=self.params.ivf_nprobe)
            scores, found = _sort_rows(*self._index.search(queries, k, params=search))
            return [s[r >= 0] for s, r in zip(scores, found)], [r[r >= 0] for r in found]
        vectors = storage if storage is not None else self.vectors(rows)
        ids = rows if storage is not None else np.arange(len(rows), dtype=np.int64)
        scorer = prefilter.Int8Prefilter.rescore_flat
        out_scores, out_rows = [], []
        for query in queries:
            scores = scorer(vectors, query, ids)
            order = np.lexsort((rows, -scores))[:k]
            out_scores.append(scores[order])
            out_rows.append(rows[order])
        return out_scores, out_rows

    def _prefiltered_within(self, queries: np.ndarray, k: int, rows: np.ndarray) -> tuple[list, list]:
        """`search_within` through the int8 prefilter (index/prefilter.py), for a filter that
        keeps many rows: one scan of the codes, the threshold taken over the allowed rows' lower
        bounds (at least k allowed rows score at least it), and only allowed rows that can reach
        it rescored exactly. Same rows, scores and order as scoring every allowed row."""
        codes = self.int8_prefilter()
        out_scores, out_rows = [], []
        for query in queries:
            center, bound = codes.bounds(query)
            center, bound = center[rows], bound[rows]
            threshold = np.partition(center - bound, len(rows) - k)[len(rows) - k]
            candidates = rows[center + bound >= threshold]
            scores = codes.rescore(query, candidates)
            order = np.lexsort((candidates, -scores))[:k]
            out_scores.append(scores[order])
            out_rows.append(candidates[order])
        return out_scores, out_rows

    def _flat_storage(self) -> np.ndarray | None:
        """The (n, d) float32 vectors a flat or HNSW index stores (a view), else None."""
        if self.params.kind is DenseIndexKind.FLAT:
            return prefilter.stored(self._index)
        if self.params.kind is DenseIndexKind.HNSW:
            return prefilter.stored(faiss.downcast_index(self._index.storage))
        return None

    def int8_prefilter(self) -> prefilter.Int8Prefilter | None:
        """The int8 prefilter of a flat index (None for an ANN one), made on first use (two
        threads making it at once is harmless)."""
        if self.params.kind is not DenseIndexKind.FLAT:
            return None
        if self._prefilter is None:
            self._prefilter = prefilter.Int8Prefilter.of(self._index)
        return self._prefilter

    def flat_index(self) -> faiss.IndexFlat | None:
        """The FAISS flat index behind a flat DenseIndex (None for an ANN one)."""
        return self._index if self.params.kind is DenseIndexKind.FLAT else None

    def _exact_search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        n = len(self)
        out_scores = np.empty((len(queries), k), dtype=np.float32)
        out_rows = np.empty((len(queries), k), dtype=np.int64)
        if prefilter.usable(n, k):
            codes = self.int8_prefilter()
            for i, query in enumerate(queries):
                out_scores[i], out_rows[i] = codes.top_k(query, k)
            return out_scores, out_rows
        pending = np.arange(len(queries))
        fetch = min(n, k + 1)
        while pending.size:
            scores, rows = _sort_rows(*self._index.search(queries[pending], fetch))
            if fetch == n:
                done = np.ones(len(pending), dtype=bool)
            else:
                # Everything tied with the k-th score was fetched when the last fetched
                # score is strictly lower; otherwise fetch a wider window for that query.
                done = scores[:, fetch - 1] < scores[:, k - 1]
            out_scores[pending[done]] = scores[done, :k]
            out_rows[pending[done]] = rows[done, :k]
            pending = pending[~done]
            fetch = min(n, fetch * 2)
        return out_scores, out_rows

    def save(self, path: str | Path) -> None:
        """Write the FAISS index to `path` atomically (temp file, fsync, rename).

        A loaded index is saved by copying the file it was read from: a memory-mapped IVF index
        would otherwise be written as a reference to that file instead of its data.
        """
        if self._source is not None:
            source = self._source
            atomic.write_via(path, lambda tmp: shutil.copyfile(source, tmp))
        else:
            atomic.write_via(path, lambda tmp: faiss.write_index(self._index, str(tmp)))

    @classmethod
    def load(
        cls, path: str | Path, params: DenseParams | None = None, *, mmap: bool = True
    ) -> DenseIndex:
        """Read an index written by `save`.

        With `mmap`, flat and HNSW indexes map their vector storage (IO_FLAG_MMAP_IFC; the HNSW
        graph itself is read into memory) and IVF maps its inverted lists (IO_FLAG_MMAP, read
        only); the quantizer is read normally. The file must then stay in place while the index
        is used. `params` (kind checked against the file, unless `auto`) sets efSearch / nprobe;
        without it they are read from the file.
        """
        path = Path(path)
        flags = 0
        if mmap:
            flags = _MMAP_FLAGS.get(_file_tag(path), 0)  # other types: a plain read
        index = faiss.read_index(str(path), flags)
        found = _params_of(index)
        if params is None:
            params = found
        elif params.kind is DenseIndexKind.AUTO:  # whatever `auto` built, with these search settings
            params = replace(found, hnsw_ef_search=params.hnsw_ef_search, ivf_nprobe=params.ivf_nprobe)
        elif params.kind is not found.kind:
            raise ValueError(
                f"{path} holds an index of kind {found.kind.value!r}, not {params.kind.value!r}"
            )
        return cls(index, params, source=path)


# FAISS files start with a 4-byte tag naming the index type. The flags that memory-map each type
# this module writes: IndexFlatIP and IndexHNSWFlat map their flat vector storage; IndexIVFFlat
# maps its inverted lists (the two flags cannot be combined for IVF).
_MMAP_FLAGS = {
    b"IxFI": faiss.IO_FLAG_MMAP_IFC,
    b"IHNf": faiss.IO_FLAG_MMAP_IFC,
    b"IwFl": faiss.IO_FLAG_MMAP | faiss.IO_FLAG_READ_ONLY,
}


def _file_tag(path: Path) -> bytes:
    with open(path, "rb") as f:
        return f.read(4)


def _params_of(index: faiss.Index) -> DenseParams:
    if isinstance(index, faiss.IndexHNSW):
        return DenseParams(
            kind=DenseIndexKind.HNSW,
            hnsw_m=int(index.hnsw.nb_neighbors(1)),
            hnsw_ef_construction=int(index.hnsw.efConstruction),
            hnsw_ef_search=int(index.hnsw.efSearch),
        )
    if isinstance(index, faiss.IndexIVF):
        return DenseParams(
            kind=DenseIndexKind.IVF, ivf_nlist=int(index.nlist), ivf_nprobe=int(index.nprobe)
        )
    if isinstance(index, faiss.IndexFlat):
        return DenseParams(kind=DenseIndexKind.FLAT)
    raise ValueError(f"unsupported FAISS index type {type(index).__name__}")
