"""SparseIndex: exact rankings, BM25 scores against a numpy reference, save/load, statistics."""

from __future__ import annotations

import math
import re

import bm25s
import numpy as np
import pytest
import Stemmer

from llmframe_ray.config import Settings
from llmframe_ray.index.sparse import CorpusStats, SparseIndex, SparseParams

TEXTS = [
    "The quick brown fox jumps over the lazy dog",
    "A lazy afternoon: the dog sleeps in the sun",
    "Foxes are running quickly through the forest",
    "The quick brown fox jumps over the lazy dog",
    "Quantum computing uses qubits",
    "Dogs and foxes run; the fox runs fastest of all the running animals",
]

PLAIN = SparseParams(stemmer=None, stopwords=None)


@pytest.fixture(scope="module")
def english() -> SparseIndex:
    return SparseIndex.build(TEXTS, SparseParams(stemmer="english", stopwords="en"))


def rows(hits: list[tuple[int, float]]) -> list[int]:
    return [row for row, _ in hits]


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        # doc 5 holds fox twice ("foxes", "fox"); 2 is shorter than 0 and 3, which are
        # identical and so tie: the lower row comes first.
        ("fox", [5, 2, 0, 3]),
        ("lazy dog", [1, 0, 3, 5]),
        # "running" and "runs" stem to "run": doc 5 holds it three times.
        ("running foxes", [5, 2, 0, 3]),
        ("QUANTUM", [4]),
    ],
)
def test_ranks_in_the_expected_order(english, query, expected):
    [hits] = english.search([query], 10)
    assert rows(hits) == expected
    assert all(score > 0 for _, score in hits)


def test_ties_keep_the_lower_row_at_the_cut(english):
    assert rows(english.search(["fox"], 3)[0]) == [5, 2, 0]
    assert rows(english.search(["brown"], 1)[0]) == [0]


@pytest.mark.parametrize("query", ["the of and", "", "   ", "zebra", "a"])
def test_queries_without_corpus_terms_return_nothing(english, query):
    assert english.search([query], 5) == [[]]


def test_k_is_clamped_and_a_batch_keeps_query_order(english):
    results = english.search(["quantum", "the", "fox"], 1000)
    assert [rows(r) for r in results] == [[4], [], [5, 2, 0, 3]]


def test_rejects_bad_arguments(english):
    with pytest.raises(ValueError, match="k must be a positive integer, got 0"):
        english.search(["fox"], 0)
    with pytest.raises(ValueError, match="queries must be a sequence of strings, not one string"):
        english.search("fox", 3)
    with pytest.raises(ValueError, match="cannot build a sparse index from zero texts"):
        SparseIndex.build([], PLAIN)


def reference_bm25(texts: list[str], query: str, k1: float, b: float) -> np.ndarray:
    """Classic BM25 with Lucene's idf, in plain numpy (lower case, no stemming, no stopwords)."""
    tokenize = re.compile(r"(?u)\b\w\w+\b").findall
    docs = [tokenize(t.lower()) for t in texts]
    lengths = np.array([len(d) for d in docs], dtype=np.float64)
    avglen = lengths.mean()
    n = len(docs)
    scores = np.zeros(n)
    for term in tokenize(query.lower()):
        tf = np.array([d.count(term) for d in docs], dtype=np.float64)
        df = np.count_nonzero(tf)
        if df == 0:
            continue
        idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
        scores += idf * tf * (k1 + 1) / (tf + k1 * (1 - b + b * lengths / avglen))
    return scores


@pytest.mark.parametrize(("k1", "b"), [(1.5, 0.75), (1.2, 0.4), (0.9, 1.0), (2.0, 0.0)])
@pytest.mark.parametrize("query", ["fox", "lazy dog", "the fox runs", "quick quick brown"])
def test_scores_match_the_bm25_formula(k1, b, query):
    index = SparseIndex.build(TEXTS, SparseParams(k1=k1, b=b, stemmer=None, stopwords=None))
    want = reference_bm25(TEXTS, query, k1, b)
    [hits] = index.search([query], len(TEXTS))
    got = np.zeros(len(TEXTS))
    for row, score in hits:
        got[row] = score
    # bm25s's "lucene" variant leaves out the constant factor (k1 + 1) of the classic formula,
    # as Lucene 8+ does; rankings are unchanged.
    np.testing.assert_allclose(got * (k1 + 1), want, rtol=1e-5, atol=1e-6)
    assert rows(hits) == [int(i) for i in np.lexsort((np.arange(len(want)), -want)) if want[i] > 0]


def bm25s_top(index: SparseIndex, query: str, k: int) -> list[tuple[int, float]]:
    """The k best rows by bm25s's own float32 scoring of the same matrix, ordered in numpy."""
    ids = index.term_ids(query)
    if not ids:
        return []
    scores = index._bm25.get_scores_from_ids(ids)
    rows = np.flatnonzero(scores > 0)
    order = np.lexsort((rows, -scores[rows]))[:k]
    return list(zip(rows[order].tolist(), scores[rows][order].tolist()))


@pytest.mark.parametrize("seed", range(12))
def test_compiled_top_k_equals_bm25s_scores_sorted_in_numpy(seed):
    # Few words and short texts: many equal scores, so the cut at k falls inside ties.
    rng = np.random.default_rng(seed)
    words = [f"w{i}" for i in range(30)]
    texts = [" ".join(rng.choice(words, size=rng.integers(1, 8))) for _ in range(300)]
    index = SparseIndex.build(texts, PLAIN)
    for _ in range(20):
        query = " ".join(rng.choice(words + ["unseen"], size=rng.integers(1, 6)))
        for k in (1, 3, 10, 50, 300):
            [hits] = index.search([query], k)
            assert hits == bm25s_top(index, query, k), (query, k)


def test_stats_expose_counts_lengths_and_document_frequencies(english):
    stats = english.stats()
    assert (stats.n_docs, stats.n_tokens) == (6, 37)
    assert stats.avg_doc_length == pytest.approx(37 / 6)
    assert {t: stats.doc_freqs[t] for t in ("fox", "dog", "run", "quick", "quantum")} == {
        "fox": 4,
        "dog": 4,
        "run": 2,
        "quick": 3,  # "quickly" stems to "quick"
        "quantum": 1,
    }
    assert "the" not in stats.doc_freqs

    a = SparseIndex.build(TEXTS[:2], PLAIN).stats()
    b = SparseIndex.build(TEXTS[2:], PLAIN).stats()
    whole = SparseIndex.build(TEXTS, PLAIN).stats()
    assert CorpusStats.merge([a, b]) == whole


def test_analyzer_lowercases_splits_drops_stopwords_and_stems(english):
    assert english.analyzer.terms("The Runners are RUNNING, x y") == ["runner", "run"]
    assert SparseIndex.build(TEXTS, PLAIN).analyzer.terms("The Runners, x") == ["the", "runners"]


def test_analyzer_gives_the_terms_of_bm25s_tokenize(english):
    extra = ["Ünïcödé café naïveté, déjà-vu!", "x y z 42 a1 __init__ The"]
    want = bm25s.tokenize(
        TEXTS + extra,
        stopwords="en",
        stemmer=Stemmer.Stemmer("english"),
        return_ids=False,
        show_progress=False,
        allow_empty=False,
    )
    assert [english.analyzer.terms(t) for t in TEXTS + extra] == want


def test_queries_leave_the_index_unchanged(english):
    before = english.stats()
    english.search(["brand new words appear here", "foxing runner"], 3)
    assert english.stats() == before


@pytest.mark.parametrize("mmap", [True, False])
def test_save_load_round_trip(tmp_path, english, mmap):
    english.save(tmp_path / "sparse")
    loaded = SparseIndex.load(tmp_path / "sparse", mmap=mmap)
    queries = ["fox", "lazy dog", "running foxes", "the", "qubits computing"]
    assert loaded.search(queries, 4) == english.search(queries, 4)
    assert loaded.params == english.params
    assert loaded.analyzer.to_dict() == english.analyzer.to_dict()
    assert loaded.stats() == english.stats()
    assert len(loaded) == 6


def test_params_validation_and_settings():
    with pytest.raises(ValueError, match="unknown BM25 method 'bm25l'; valid methods: lucene"):
        SparseParams(method="bm25l")
    with pytest.raises(ValueError, match="unknown stemmer 'klingon'; valid stemmers: arabic, "):
        SparseParams(stemmer="klingon")
    with pytest.raises(ValueError, match="unknown stopword list 'xx'"):
        SparseParams(stopwords="xx")
    with pytest.raises(ValueError, match="b must be between 0 and 1, got 1.5"):
        SparseParams(b=1.5)
    settings = Settings(bm25_k1=1.2, bm25_b=0.5, bm25_stemmer=None, bm25_stopwords="de")
    params = settings.params().index.sparse
    assert params == SparseParams(k1=1.2, b=0.5, stemmer=None, stopwords="de")
    assert SparseParams.from_dict(params.to_dict()) == params


def test_shards_scored_with_corpus_wide_statistics_rank_like_one_index():
    from llmframe_ray.index.sparse import CorpusStats, SparseIndex, SparseParams

    texts = [
        "the quick brown fox jumps over the lazy dog", "a fox and a hound", "lazy afternoons in summer",
        "dogs and foxes are canines", "summer fox sightings reported", "brown bears and brown dogs",
        "quick quick quick", "nothing to see here", "the hound of the baskervilles", "foxes",
    ]
    params = SparseParams()
    whole = SparseIndex.build(texts, params)
    parts = [[0, 3, 6, 9], [1, 4, 7], [2, 5, 8]]
    own = [SparseIndex.build([texts[i] for i in rows], params) for rows in parts]
    corpus = CorpusStats.merge([index.stats() for index in own])
    assert corpus.n_docs == len(texts) and corpus.doc_freqs == whole.stats().doc_freqs
    shards = [SparseIndex.build([texts[i] for i in rows], params, corpus) for rows in parts]
    assert all(s.corpus_wide for s in shards) and not whole.corpus_wide
    for query in ("brown fox", "lazy hound", "summer dogs quick"):
        expected = whole.search([query], len(texts))[0]
        merged = sorted(
            ((score, rows[row]) for rows, shard in zip(parts, shards) for row, score in shard.search([query], 10)[0]),
            key=lambda pair: (-pair[0], pair[1]),
        )
        assert [(row, score) for score, row in merged] == expected
        # each shard scored alone (its own statistics) would not agree
    alone = sorted(
        ((score, rows[row]) for rows, shard in zip(parts, own) for row, score in shard.search(["brown fox"], 10)[0]),
        key=lambda pair: (-pair[0], pair[1]),
    )
    assert [(row, score) for score, row in alone] != whole.search(["brown fox"], len(texts))[0]


def test_corpus_statistics_must_include_the_shard():
    from llmframe_ray.index.sparse import CorpusStats, SparseIndex, SparseParams

    with pytest.raises(ValueError, match="give term 'fox' a document frequency of 0, below its 1"):
        SparseIndex.build(["fox"], SparseParams(), CorpusStats(5, 10, {"dog": 2}))
