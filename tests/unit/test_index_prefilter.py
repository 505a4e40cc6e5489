"""The int8 prefilter of flat search: exactly FAISS's rows, scores and order, fewer bytes read."""

from __future__ import annotations

import faiss
import numpy as np
import pytest

from llmframe_ray.index import prefilter
from llmframe_ray.index.dense import DenseIndex, DenseParams
from llmframe_ray.index.prefilter import Int8Prefilter


def faiss_reference(vectors: np.ndarray, query: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Every row scored by FAISS's own kernel (the bits IndexFlatIP.search gives), ordered by
    score descending, then row ascending."""
    n, d = vectors.shape
    scores = np.empty(n, dtype=np.float32)
    query = np.ascontiguousarray(query, dtype=np.float32)
    faiss.fvec_inner_products_ny(faiss.swig_ptr(scores), faiss.swig_ptr(query), faiss.swig_ptr(vectors), d, n)
    order = np.lexsort((np.arange(n), -scores))[:k]
    return scores[order], order.astype(np.int64)


def clustered(rng: np.random.Generator, n: int, d: int, scale: float = 1.0) -> np.ndarray:
    """Unit vectors around 20 centres (close scores near the cut), times `scale`."""
    centres = rng.standard_normal((20, d))
    x = centres[rng.integers(0, 20, n)] + 0.35 * rng.standard_normal((n, d))
    return np.ascontiguousarray((x / np.linalg.norm(x, axis=1, keepdims=True) * scale).astype(np.float32))


def counting_rescores(monkeypatch) -> list[int]:
    counts: list[int] = []
    original = faiss.fvec_inner_products_by_idx

    def counted(out, query, vectors, ids, d, nx, ny):
        counts.append(ny)
        return original(out, query, vectors, ids, d, nx, ny)

    monkeypatch.setattr(prefilter.faiss, "fvec_inner_products_by_idx", counted)
    return counts


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("scale", [1.0, 37.5])
def test_top_k_is_faiss_exact_search_bit_for_bit(seed, scale):
    rng = np.random.default_rng(seed)
    vectors = clustered(rng, 3000, 48, scale)
    filt = Int8Prefilter(vectors)
    queries = np.concatenate([clustered(rng, 6, 48), vectors[rng.integers(0, 3000, 4)]])
    for query in queries:
        for k in (1, 7, 100, 401, 750):
            scores, rows = filt.top_k(query, k)
            want_scores, want_rows = faiss_reference(vectors, query, k)
            assert rows.tolist() == want_rows.tolist()
            assert scores.tobytes() == want_scores.tobytes()


def test_codes_made_in_blocks_equal_codes_made_at_once():
    vectors = clustered(np.random.default_rng(4), 2100, 20)
    whole, blocked = Int8Prefilter(vectors), Int8Prefilter(vectors, block=256)
    assert np.array_equal(whole._codes, blocked._codes)
    assert np.array_equal(whole._row_bound, blocked._row_bound)


def test_ties_at_the_cut_are_taken_by_lower_row():
    rng = np.random.default_rng(3)
    base = clustered(rng, 600, 32)
    # five copies of each vector: every score comes in a group of five equal ones
    vectors = np.ascontiguousarray(np.repeat(base, 5, axis=0)[rng.permutation(3000)])
    filt = Int8Prefilter(vectors)
    for query in clustered(rng, 5, 32):
        for k in (3, 12, 298):
            scores, rows = filt.top_k(query, k)
            want_scores, want_rows = faiss_reference(vectors, query, k)
            assert rows.tolist() == want_rows.tolist()
            assert scores.tobytes() == want_scores.tobytes()
            assert scores[0] == scores[2]  # the best vector's five copies: k = 3 cuts a tie group


def test_a_constant_dimension_and_duplicate_rows_are_handled():
    rng = np.random.default_rng(5)
    vectors = clustered(rng, 2500, 16)
    vectors[:, 3] = 0.25  # span 0: step 1, every code 0
    vectors[100:140] = vectors[99]
    filt = Int8Prefilter(vectors)
    for query in [vectors[99], *clustered(rng, 3, 16)]:
        scores, rows = filt.top_k(query, 50)
        want_scores, want_rows = faiss_reference(vectors, query, 50)
        assert rows.tolist() == want_rows.tolist()
        assert scores.tobytes() == want_scores.tobytes()


def test_it_rescores_a_small_share_of_the_rows(monkeypatch):
    rng = np.random.default_rng(11)
    vectors = clustered(rng, 5000, 64)
    counts = counting_rescores(monkeypatch)
    filt = Int8Prefilter(vectors)
    for query in clustered(rng, 10, 64):
        filt.top_k(query, 10)
    assert len(counts) == 10
    assert max(counts) < 5000 // 20, counts


def test_dense_index_uses_it_where_it_pays_and_answers_as_before(monkeypatch):
    rng = np.random.default_rng(2)
    vectors = clustered(rng, 4096, 32)
    index = DenseIndex.build(vectors, DenseParams())
    queries = clustered(rng, 3, 32)
    counts = counting_rescores(monkeypatch)
    for k, used in ((10, True), (1024, True), (1025, False), (4096, False)):
        counts.clear()
        scores, rows = index.search(queries, k)
        assert (len(counts) == 3) is used, (k, counts)
        for query, got_scores, got_rows in zip(queries, scores, rows):
            want_scores, want_rows = faiss_reference(vectors, query, k)
            assert got_rows.tolist() == want_rows.tolist()
            assert got_scores.tobytes() == want_scores.tobytes()
    small = DenseIndex.build(vectors[: prefilter.MIN_ROWS - 1], DenseParams())
    counts.clear()
    small.search(queries, 10)
    assert counts == []


def test_a_loaded_memory_mapped_index_gives_the_same_answers(tmp_path):
    rng = np.random.default_rng(8)
    vectors = clustered(rng, 3000, 24)
    DenseIndex.build(vectors, DenseParams()).save(tmp_path / "dense.faiss")
    loaded = DenseIndex.load(tmp_path / "dense.faiss", mmap=True)
    queries = clustered(rng, 4, 24)
    scores, rows = loaded.search(queries, 25)
    for query, got_scores, got_rows in zip(queries, scores, rows):
        want_scores, want_rows = faiss_reference(vectors, query, 25)
        assert got_rows.tolist() == want_rows.tolist()
        assert got_scores.tobytes() == want_scores.tobytes()


def test_several_indexes_share_one_prefilter_numbered_one_after_another():
    rng = np.random.default_rng(9)
    parts = [clustered(rng, 1400, 24), np.empty((0, 24), dtype=np.float32), clustered(rng, 900, 24, 3.0)]
    vectors = np.concatenate(parts)
    shared = Int8Prefilter.of(*(DenseIndex.build(p, DenseParams()).flat_index() for p in parts if len(p)))
    assert Int8Prefilter(parts).offsets.tolist() == [0, 1400, 1400, 2300]
    assert shared.offsets.tolist() == [0, 1400, 2300]
    assert np.array_equal(shared._codes, Int8Prefilter(vectors)._codes)  # one range per dimension
    for query in [vectors[1399], vectors[1400], *clustered(rng, 3, 24)]:
        for k in (1, 40, 575):
            scores, rows = shared.top_k(query, k)
            want_scores, want_rows = faiss_reference(vectors, query, k)
            assert rows.tolist() == want_rows.tolist()
            assert scores.tobytes() == want_scores.tobytes()
        rows = np.array([0, 5, 1399, 1400, 1401, 2299], dtype=np.int64)  # both sides of the seam
        want, _ = faiss_reference(vectors[rows], query, len(rows))
        assert sorted(shared.rescore(query, rows).tolist()) == sorted(want.tolist())


def test_the_kth_largest_bound_is_numpys_partition_value():
    """The threshold of step 3: exactly np.partition's k-th largest, with ties, equal values,
    one value, spans too narrow or too wide to bucket, values that are not finite."""
    rng = np.random.default_rng(7)
    cases = [
        rng.standard_normal(9981) * 0.05 + 0.2,
        rng.integers(0, 4, 5000).astype(np.float64),  # heavy ties
        np.full(300, 0.25),
        np.array([1.5]),
        rng.standard_normal(2000) * 1e-310,  # subnormal values: a span too narrow to bucket
        np.concatenate([np.full(50, -1.7e308), np.full(50, 1.7e308), [0.0]]),  # a span beyond float64
        np.array([0.5, np.inf, -np.inf, 0.25, np.nan, 0.75]),  # not finite: numpy's own answer
    ]
    for values in cases:
        n = len(values)
        for k in sorted({1, 2, n // 3 + 1, n // 2 + 1, n}):
            expected = np.partition(values, n - k)[n - k]
            found = prefilter.kth_largest(values, k)
            assert found == expected or (np.isnan(found) and np.isnan(expected)), (n, k)
