"""Metadata filters (index/metadata.py): the language, its errors, and exact filtered retrieval.

Filtered search must give each ranker's true top k among the chunks the filter selects: the
same as ranking every chunk of every shard without a filter, keeping the selected ones and
cutting at k (never fewer while enough selected chunks score), checked here against that brute
force over random metadata on a few thousand chunks in three shards, for bm25, dense and hybrid.
"""

import numpy as np
import pytest

from llmframe_ray.config import load_settings
from llmframe_ray.index.dense import DenseIndex, DenseParams
from llmframe_ray.index.metadata import (
    DocumentMetadata, FilterError, check_metadata, internal_id, matches, parse_filter, public_id, split_id,
)
from llmframe_ray.index.versions import IndexDirectory
from llmframe_ray.ingest.build import publish_shards
from llmframe_ray.retrieve.fusion import reciprocal_rank_fusion
from llmframe_ray.retrieve.pipeline import Pipeline, _DirectBackend
from llmframe_ray.retrieve.drive import run_plan
from llmframe_ray.retrieve.plan import FusionParams, ResultLevel, retrieval_plan
from llmframe_ray.types import INDEX_MODES, Chunk, RankedList, SearchMode

WORDS = "moon tide ocean lava ice bee honey iron rust tea leaf salt wind rain sand star".split()
DIM = 24
LANGS = ["en", "de", "fr"]
TAGS = ["a", "b", "c", "d"]


def random_metadata(rng):
    meta = {}
    if rng.random() < 0.8:
        meta["lang"] = str(rng.choice(LANGS))
    meta["year"] = int(rng.integers(2000, 2025))
    if rng.random() < 0.7:
        meta["tags"] = sorted({str(t) for t in rng.choice(TAGS, size=int(rng.integers(0, 3)))})
    if rng.random() < 0.5:
        meta["draft"] = bool(rng.random() < 0.5)
    meta["date"] = f"2024-{int(rng.integers(1, 13)):02d}-01"
    return meta


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    rng = np.random.default_rng(7)
    chunks, metadata = [], {}
    for d in range(1500):
        doc = f"doc{d:05d}"
        metadata[doc] = random_metadata(rng)
        for position in range(int(rng.integers(1, 4))):
            text = " ".join(rng.choice(WORDS, size=int(rng.integers(2, 7))))
            chunks.append(Chunk(f"{doc}#{position}", doc, position, text, metadata=metadata[doc]))
    vectors = rng.normal(size=(len(chunks), DIM)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    directory = IndexDirectory(tmp_path_factory.mktemp("filters") / "index")
    params = load_settings().params().index
    publish_shards(directory, chunks, vectors, params, {"name": "random", "provider": "test", "dim": DIM, "max_length": 64}, shards=3)
    shards = directory.load().shards
    return shards, metadata, rng.normal(size=(6, DIM)).astype(np.float32)


QUERIES = ["moon tide honey", "iron rust", "star wind rain sand", "leaf", "ocean lava ice", "tea salt bee"]
FILTERS = [
    {"lang": "en"},
    {"year": {"gte": 2010, "lt": 2015}},
    {"tags": {"in": ["a", "d"]}, "lang": {"ne": "de"}},
    {"draft": False},
    {"tags": "c", "year": {"gt": 2020}},
    {"lang": {"nin": ["en", "fr"]}},
    {"draft": {"exists": False}, "date": {"lte": "2024-03-01"}},
    {"year": 2003, "lang": "fr"},  # very selective
]


def plan_hits(shards, mode, level, top_k, where, vectors, fusion):
    pipeline = Pipeline(shards, None)
    plan = retrieval_plan(QUERIES, mode, level, top_k, [len(s) for s in shards], fusion, vectors,
                          together=[range(len(shards))], where=where)
    return run_plan(plan, _DirectBackend(pipeline))


def brute_force(shards, metadata, where, ranker, query, vector, k):
    """Every chunk of every shard ranked without a filter, the selected kept, cut at k:
    (chunk id, doc id, score), in the plan's order (score desc, doc id, row, shard)."""
    found = []
    for s, shard in enumerate(shards):
        if ranker == "bm25":
            (rows, scores), = shard.search_sparse_arrays([query], len(shard))
        else:
            (rows, scores), = shard.search_dense_arrays(vector[None, :], len(shard))
        for row, score in zip(rows.tolist(), scores.tolist()):
            chunk = shard.chunk(row)
            if matches(metadata[chunk.doc_id], chunk.doc_id, where):
                found.append((-score, chunk.doc_id, row, s, chunk.chunk_id))
    found.sort()
    return [(c, d, -negative) for negative, d, _, _, c in found[:k]]


@pytest.mark.parametrize("raw", FILTERS, ids=[str(f) for f in FILTERS])
@pytest.mark.parametrize("mode", [SearchMode.BM25, SearchMode.DENSE])
def test_filtered_chunk_search_is_the_true_top_k(corpus, raw, mode):
    shards, metadata, vectors = corpus
    where = parse_filter(raw)
    top_k = 25
    got = plan_hits(shards, mode, ResultLevel.CHUNK, top_k, where, vectors, FusionParams())
    for q, query in enumerate(QUERIES):
        expected = brute_force(shards, metadata, where, mode.value, query, vectors[q], top_k)
        assert [(h.chunk_id, h.doc_id, h.score) for h in got[q]] == expected
        assert all(matches(metadata[h.doc_id], h.doc_id, where) for h in got[q])
        assert all(dict(h.metadata) == metadata[h.doc_id] for h in got[q])
    if mode is SearchMode.DENSE:  # every selected chunk has a dense score: never short
        n_selected = sum(int(s.store.row_mask(where).sum()) for s in shards)
        assert all(len(hits) == min(top_k, n_selected) for hits in got)


def first_per_document(ranked):
    seen, out = set(), []
    for chunk_id, doc, score in ranked:
        if doc not in seen:
            seen.add(doc)
            out.append((doc, score))
    return out


@pytest.mark.parametrize("raw", FILTERS[:4] + FILTERS[-1:], ids=[str(f) for f in FILTERS[:4] + FILTERS[-1:]])
def test_filtered_hybrid_fuses_the_filtered_lists(corpus, raw):
    shards, metadata, vectors = corpus
    where = parse_filter(raw)
    fusion = FusionParams(rrf_k=20, fusion_depth=40)
    top_k = 10
    got = plan_hits(shards, SearchMode.HYBRID, ResultLevel.DOCUMENT, top_k, where, vectors, fusion)
    for q, query in enumerate(QUERIES):
        lists = []
        for ranker in ("bm25", "dense"):
            docs = first_per_document(brute_force(shards, metadata, where, ranker, query, vectors[q], 10**6))
            docs = docs[: fusion.fusion_depth]
            lists.append(RankedList(ranker, [d for d, _ in docs], [s for _, s in docs]))
        expected = reciprocal_rank_fusion(lists, k=fusion.rrf_k, limit=top_k)
        assert [(h.doc_id, h.score, dict(h.ranks)) for h in got[q]] == [(f.key, f.score, dict(f.ranks)) for f in expected]


def test_a_filter_that_selects_nothing_returns_no_hits(corpus):
    shards, _, vectors = corpus
    where = parse_filter({"lang": "xx"})
    for mode in INDEX_MODES:  # graph modes: tests/unit/test_graph.py
        assert plan_hits(shards, mode, ResultLevel.DOCUMENT, 5, where, vectors, FusionParams()) == [[]] * len(QUERIES)


def test_the_language_and_its_errors():
    assert parse_filter({"a": 1, "b": {"in": ["x", 2]}}).clauses[1].value == ("x", 2)
    cases = [
        ({"year": {"between": [1, 2]}}, "unknown filter operator(s) 'between' for field 'year'; known: eq, ne, in, nin, gt, gte, lt, lte, exists"),
        ({"tags": {"in": "a"}}, "filter['tags']['in'] must be a list, got 'a'"),
        ({"year": {"gte": [1]}}, "filter['year']['gte'] must be a number or a string, got [1]"),
        ({"x": {"exists": 1}}, "filter['x']['exists'] must be true or false, got 1"),
        ({"x": None}, "filter['x'] must be a string, a finite number or a boolean, got None"),
        ({"x": {}}, "filter['x'] has no operator; known: eq, ne, in, nin, gt, gte, lt, lte, exists"),
        ([1], "filter must be a JSON object of field conditions, got list"),
    ]
    for raw, message in cases:
        with pytest.raises(FilterError) as caught:
            parse_filter(raw)
        assert str(caught.value) == message
    with pytest.raises(FilterError, match=r"metadata\['n'\] must be a string, a finite number"):
        check_metadata({"n": float("nan")})
    with pytest.raises(FilterError, match=r"metadata\['tags'\] must be"):
        check_metadata({"tags": ["a", 1]})


def test_values_compare_by_kind():
    docs = DocumentMetadata(["a", "b", "c", "d"], [{"v": 1}, {"v": True}, {"v": "1"}, {"v": ["1", "x"]}])
    assert docs.mask(parse_filter({"v": 1})).tolist() == [True, False, False, False]
    assert docs.mask(parse_filter({"v": True})).tolist() == [False, True, False, False]
    assert docs.mask(parse_filter({"v": "1"})).tolist() == [False, False, True, True]
    assert docs.mask(parse_filter({"v": {"ne": "1"}})).tolist() == [True, True, False, False]
    assert docs.mask(parse_filter({"w": {"exists": False}})).tolist() == [True] * 4
    assert docs.mask(parse_filter({})) is None


def test_namespace_ids_round_trip():
    assert internal_id("default", "x") == "x"
    stored = internal_id("acme", "x/y.md")
    assert stored != "x/y.md" and split_id(stored) == ("acme", "x/y.md") and public_id(stored) == "x/y.md"
    docs = DocumentMetadata(["x", stored], [{}, {}])
    assert docs.mask(parse_filter({}, namespace="acme")).tolist() == [False, True]
    assert docs.mask(parse_filter({}, namespace="default")).tolist() == [True, False]
    assert docs.mask(parse_filter({}, namespace="other")).tolist() == [False, False]


@pytest.mark.parametrize("share", [0.05, 0.6], ids=["selective", "broad: through the int8 prefilter on flat"])
@pytest.mark.parametrize("kind", ["flat", "hnsw", "ivf"])
def test_dense_search_within_is_exact_for_every_kind(kind, share):
    rng = np.random.default_rng(3)
    vectors = rng.normal(size=(3000, DIM)).astype(np.float32)
    flat = DenseIndex.build(vectors, DenseParams())
    index = DenseIndex.build(vectors, DenseParams(kind=kind))
    allowed = rng.random(3000) < share
    queries = rng.normal(size=(4, DIM)).astype(np.float32)
    all_scores, all_rows = flat.search(queries, 3000)
    scores, rows = index.search_within(queries, 20, allowed)
    for q in range(4):
        keep = allowed[all_rows[q]]
        assert rows[q].tolist() == all_rows[q][keep][:20].tolist()
        assert scores[q].tolist() == all_scores[q][keep][:20].tolist()


def tenant_corpus(rng, namespace, n_docs):
    chunks = []
    for d in range(n_docs):
        doc = internal_id(namespace, f"doc{d:04d}")  # the same public ids in every tenant
        for position in range(int(rng.integers(1, 3))):
            text = " ".join(rng.choice(WORDS, size=int(rng.integers(2, 7))))
            chunks.append(Chunk(f"{doc}#{position}", doc, position, text))
    vectors = rng.normal(size=(len(chunks), DIM)).astype(np.float32)
    return chunks, vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def test_a_tenants_ranking_does_not_depend_on_another_tenants_documents(tmp_path):
    rng = np.random.default_rng(11)
    a_chunks, a_vectors = tenant_corpus(rng, "acme", 400)
    b_chunks, b_vectors = tenant_corpus(rng, "bolt", 700)  # other texts, other term statistics
    params = load_settings().params().index
    model = {"name": "random", "provider": "test", "dim": DIM, "max_length": 64}
    alone, both = IndexDirectory(tmp_path / "alone"), IndexDirectory(tmp_path / "both")
    publish_shards(alone, a_chunks, a_vectors, params, model, shards=3)
    publish_shards(both, a_chunks + b_chunks, np.vstack([a_vectors, b_vectors]), params, model, shards=3)
    vectors = rng.normal(size=(len(QUERIES), DIM)).astype(np.float32)
    where = parse_filter({}, namespace="acme")
    for mode in INDEX_MODES:  # graph modes: tests/unit/test_graph.py
        for level in ResultLevel:
            fusion = FusionParams(rrf_k=20, fusion_depth=30)
            a = plan_hits(alone.load().shards, mode, level, 15, where, vectors, fusion)
            ab = plan_hits(both.load().shards, mode, level, 15, where, vectors, fusion)
            assert [[(h.doc_id, h.chunk_id, h.score, dict(h.ranks)) for h in hits] for hits in ab] == [
                [(h.doc_id, h.chunk_id, h.score, dict(h.ranks)) for h in hits] for hits in a
            ]
            assert all(len(hits) == 15 for hits in a)
    # without per-namespace statistics the BM25 scores would differ: the tenants' corpora do
    unfiltered = plan_hits(both.load().shards, SearchMode.BM25, ResultLevel.CHUNK, 5, parse_filter({}, namespace="bolt"), vectors, FusionParams())
    assert all(public_id(h.doc_id).startswith("doc") and h.doc_id.startswith("bolt") for hits in unfiltered for h in hits)
    info = both.load().shards[0].sparse.corpus
    assert set(info["namespaces"]) == {"acme", "bolt"}
    assert info["namespaces"]["acme"]["n_docs"] == len(a_chunks)


def test_a_filter_that_keeps_every_row_takes_the_unfiltered_path(corpus):
    shards, _, _ = corpus
    assert all(s.store.row_mask(parse_filter({"year": {"gte": 0}})) is None for s in shards)
    assert all(s.store.row_mask(parse_filter({"year": {"gte": 2001}})) is not None for s in shards)
