"""DenseIndex: exact order against numpy, ANN on easy cases, validation, save/load."""

from __future__ import annotations

import numpy as np
import pytest

from llmframe_ray.config import Settings
from llmframe_ray.index.dense import DenseIndexKind
from llmframe_ray.index.dense import DenseIndex, DenseParams


def normalised(rng: np.random.Generator, n: int, dim: int) -> np.ndarray:
    x = rng.standard_normal((n, dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def brute_force(vectors: np.ndarray, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Score descending, then row ascending, with numpy only."""
    scores = queries @ vectors.T
    rows = np.arange(len(vectors))
    order = np.stack([np.lexsort((rows, -s))[:k] for s in scores])
    return np.take_along_axis(scores, order, 1), order


def tied_vectors(rng: np.random.Generator, n: int) -> np.ndarray:
    """Unit vectors with 4 entries of +-0.5: every inner product is a multiple of 0.25 and is
    computed exactly in float32, so numpy and FAISS see the same, often tied, scores."""
    x = np.zeros((n, 16), dtype=np.float32)
    for i in range(n):
        cols = rng.choice(16, size=4, replace=False)
        x[i, cols] = rng.choice([-0.5, 0.5], size=4)
    return x


@pytest.fixture(scope="module")
def vectors() -> np.ndarray:
    return normalised(np.random.default_rng(7), 300, 24)


def test_flat_matches_numpy_brute_force(vectors):
    rng = np.random.default_rng(8)
    queries = normalised(rng, 6, 24)
    index = DenseIndex.build(vectors, DenseParams(kind="flat"))
    scores, rows = index.search(queries, 10)
    want_scores, want_rows = brute_force(vectors, queries, 10)
    assert rows.dtype == np.int64 and scores.dtype == np.float32
    assert rows.shape == (6, 10)
    np.testing.assert_array_equal(rows, want_rows)
    np.testing.assert_allclose(scores, want_scores, atol=1e-6)


@pytest.mark.parametrize("k", [1, 3, 10, 99, 150, 300, 599, 600])
@pytest.mark.parametrize("n_queries", [1, 30])
def test_flat_breaks_ties_by_lower_row_even_at_the_cut(k, n_queries):
    rng = np.random.default_rng(3)
    base = tied_vectors(rng, 12)
    vectors = base[rng.integers(0, 12, size=600)]  # many exact duplicates
    queries = base[rng.integers(0, 12, size=n_queries)]
    index = DenseIndex.build(vectors, DenseParams(kind="flat"))
    scores, rows = index.search(queries, k)
    want_scores, want_rows = brute_force(vectors, queries, k)
    np.testing.assert_array_equal(rows, want_rows)
    np.testing.assert_array_equal(scores, want_scores)


def test_k_is_clamped_to_the_number_of_vectors(vectors):
    index = DenseIndex.build(vectors[:5], DenseParams())
    scores, rows = index.search(vectors[:2], 50)
    assert rows.shape == scores.shape == (2, 5)
    assert sorted(rows[0].tolist()) == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("kind", ["hnsw", "ivf"])
def test_ann_finds_the_nearest_neighbour_on_an_easy_case(vectors, kind):
    rng = np.random.default_rng(11)
    targets = [0, 17, 123, 299]
    queries = vectors[targets] + 0.01 * rng.standard_normal((4, 24)).astype(np.float32)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    params = DenseParams(kind=kind, hnsw_m=16, ivf_nlist=8, ivf_nprobe=8)
    index = DenseIndex.build(vectors, params)
    scores, rows = index.search(queries, 5)
    assert rows[:, 0].tolist() == targets
    assert (np.diff(scores, axis=1) <= 0).all()


def test_ivf_with_one_probe_marks_unfilled_slots():
    rng = np.random.default_rng(5)
    # Two tight, opposite clusters: one probe reaches only the query's own cluster.
    centre = normalised(rng, 1, 8)[0]
    near = centre + 0.01 * rng.standard_normal((5, 8)).astype(np.float32)
    far = -centre + 0.01 * rng.standard_normal((5, 8)).astype(np.float32)
    vectors = np.vstack([near, far])
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    index = DenseIndex.build(vectors, DenseParams(kind="ivf", ivf_nlist=2, ivf_nprobe=1))
    scores, rows = index.search(centre[None, :], 10)
    assert sorted(rows[0, :5].tolist()) == [0, 1, 2, 3, 4]
    assert rows[0, 5:].tolist() == [-1] * 5
    assert np.isneginf(scores[0, 5:]).all()


def test_ivf_nlist_is_resolved_and_recorded(vectors):
    assert DenseParams(kind="ivf").resolved_nlist(300) == 69  # round(4 * sqrt(300))
    assert DenseParams(kind="ivf").resolved_nlist(2) == 2
    assert DenseParams(kind="ivf", ivf_nlist=1000).resolved_nlist(300) == 300
    index = DenseIndex.build(vectors, DenseParams(kind="ivf"))
    assert index.params.ivf_nlist == 69


@pytest.mark.parametrize(
    ("array", "message"),
    [
        (np.zeros((3, 4), dtype=np.float64), "vectors must be float32, got float64"),
        (np.zeros(4, dtype=np.float32), r"vectors must be 2-D \(n, dim\), got shape \(4,\)"),
        (np.array([[0.0, np.nan]], dtype=np.float32), "vectors contain NaN or infinite values"),
        (np.zeros((0, 4), dtype=np.float32), "cannot build a dense index from zero vectors"),
        ([[1.0, 0.0]], "vectors must be a numpy array, got list"),
    ],
)
def test_build_rejects_bad_vectors(array, message):
    with pytest.raises(ValueError, match=message):
        DenseIndex.build(array, DenseParams())


def test_search_rejects_bad_queries(vectors):
    index = DenseIndex.build(vectors, DenseParams())
    with pytest.raises(ValueError, match="queries have dimension 3; the index has 24"):
        index.search(np.zeros((1, 3), dtype=np.float32), 1)
    with pytest.raises(ValueError, match="k must be a positive integer, got 0"):
        index.search(vectors[:1], 0)


def test_params_validation_and_settings():
    bad_kind = "unknown dense index kind 'annoy'; valid dense index kinds: auto, flat, hnsw, ivf"
    with pytest.raises(ValueError, match=bad_kind):
        DenseParams(kind="annoy")
    with pytest.raises(ValueError, match="hnsw_m must be a positive integer, got 0"):
        DenseParams(hnsw_m=0)
    settings = Settings(dense_index="hnsw", hnsw_m=8, hnsw_ef_search=40, ivf_nlist=7, ivf_nprobe=3)
    params = settings.params().index.dense
    assert params == DenseParams(
        kind=DenseIndexKind.HNSW,
        hnsw_m=8,
        hnsw_ef_construction=settings.hnsw_ef_construction,
        hnsw_ef_search=40,
        ivf_nlist=7,
        ivf_nprobe=3,
    )
    assert DenseParams.from_dict(params.to_dict()) == params


@pytest.mark.parametrize("kind", ["flat", "hnsw", "ivf"])
@pytest.mark.parametrize("mmap", [True, False])
def test_save_load_round_trip(tmp_path, vectors, kind, mmap):
    queries = normalised(np.random.default_rng(9), 4, 24)
    params = DenseParams(kind=kind, hnsw_m=16, ivf_nlist=8, ivf_nprobe=4)
    index = DenseIndex.build(vectors, params)
    index.save(tmp_path / "dense.faiss")
    assert [p.name for p in tmp_path.iterdir()] == ["dense.faiss"]  # no temp file left

    loaded = DenseIndex.load(tmp_path / "dense.faiss", params, mmap=mmap)
    assert len(loaded) == 300 and loaded.dim == 24
    for got, want in zip(loaded.search(queries, 7), index.search(queries, 7)):
        np.testing.assert_array_equal(got, want)

    # A loaded (possibly memory-mapped) index saves to a self-contained file.
    loaded.save(tmp_path / "copy.faiss")
    again = DenseIndex.load(tmp_path / "copy.faiss", params, mmap=False)
    np.testing.assert_array_equal(again.search(queries, 7)[1], index.search(queries, 7)[1])


def test_auto_builds_flat_up_to_its_threshold_and_hnsw_above(tmp_path, vectors):
    params = DenseParams(hnsw_m=12, hnsw_ef_search=300, flat_max_rows=299)
    assert params.kind is DenseIndexKind.AUTO and DenseParams().kind is DenseIndexKind.AUTO
    assert params.resolve(299).kind is DenseIndexKind.FLAT
    assert params.resolve(300) == DenseParams(kind="hnsw", hnsw_m=12, hnsw_ef_search=300, flat_max_rows=299)
    assert DenseParams(kind="ivf").resolve(10**9).kind is DenseIndexKind.IVF  # a named kind stays
    queries = normalised(np.random.default_rng(10), 5, 24)

    small = DenseIndex.build(vectors[:299], params)
    assert small.params.kind is DenseIndexKind.FLAT and small.flat_index() is not None
    np.testing.assert_array_equal(small.search(queries, 10)[1], brute_force(vectors[:299], queries, 10)[1])

    large = DenseIndex.build(vectors, params)
    assert large.params.kind is DenseIndexKind.HNSW and large.flat_index() is None
    large.save(tmp_path / "dense.faiss")
    # `auto` loads whichever kind it built, with the search settings given
    loaded = DenseIndex.load(tmp_path / "dense.faiss", DenseParams(hnsw_ef_search=64))
    assert (loaded.params.kind, loaded.params.hnsw_m, loaded.params.hnsw_ef_search) == (DenseIndexKind.HNSW, 12, 64)
    # 300 vectors with efSearch 300: the graph search visits every row, so it is exact here
    np.testing.assert_array_equal(large.search(queries, 10)[1], brute_force(vectors, queries, 10)[1])


def test_load_reads_or_applies_search_params(tmp_path, vectors):
    built = DenseIndex.build(vectors, DenseParams(kind="ivf", ivf_nlist=8, ivf_nprobe=4))
    built.save(tmp_path / "ivf.faiss")
    assert DenseIndex.load(tmp_path / "ivf.faiss").params == DenseParams(
        kind="ivf", ivf_nlist=8, ivf_nprobe=4
    )
    wider = DenseParams(kind="ivf", ivf_nlist=8, ivf_nprobe=8)
    assert DenseIndex.load(tmp_path / "ivf.faiss", wider).params.ivf_nprobe == 8
    with pytest.raises(ValueError, match="holds an index of kind 'ivf', not 'flat'"):
        DenseIndex.load(tmp_path / "ivf.faiss", DenseParams(kind="flat"))

    hnsw = DenseIndex.build(vectors, DenseParams(kind="hnsw", hnsw_m=12, hnsw_ef_search=20))
    hnsw.save(tmp_path / "hnsw.faiss")
    found = DenseIndex.load(tmp_path / "hnsw.faiss").params
    assert (found.kind, found.hnsw_m, found.hnsw_ef_search) == (DenseIndexKind.HNSW, 12, 20)


def test_sort_rows_orders_ties_by_row_and_puts_missing_rows_last():
    from llmframe_ray.index.dense import _sort_rows

    rng = np.random.default_rng(5)
    for _ in range(50):
        scores = rng.choice(np.array([0.25, 0.5, 0.75], dtype=np.float32), size=(3, 40))
        rows = np.stack([rng.permutation(100)[:40] for _ in range(3)]).astype(np.int64)
        rows[rng.random((3, 40)) < 0.1] = -1  # slots an ANN index left empty
        # FAISS hands back each query's rows best first; ties and -1 rows in any order
        order = np.argsort(-scores, axis=1, kind="stable")
        scores, rows = np.take_along_axis(scores, order, 1), np.take_along_axis(rows, order, 1)
        got_scores, got_rows = _sort_rows(scores, rows)
        for q in range(3):
            want = sorted(zip(np.where(rows[q] < 0, np.inf, -scores[q]).tolist(), rows[q].tolist()))
            assert list(zip((-got_scores[q]).tolist(), got_rows[q].tolist())) == want
        assert got_scores.dtype == np.float32 and got_rows.dtype == np.int64
