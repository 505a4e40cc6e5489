from dataclasses import replace

import numpy as np
import pytest

from llmframe_ray.config import load_settings
from llmframe_ray.errors import EmptyQueryError, ModelError, QueryTooLongError
from llmframe_ray.index.domain import centroid
from llmframe_ray.index.versions import IndexDirectory
from llmframe_ray.ingest.build import build_index, build_shard, chunk_documents, embed_chunks, make_chunker
from llmframe_ray.retrieve.pipeline import Pipeline, ResultLevel
from llmframe_ray.retrieve.fusion import reciprocal_rank_fusion
from llmframe_ray.types import INDEX_MODES, Document, RankedList, SearchMode

DOCS = [
    Document("bikes", title="Cycling to work", text="Commuting by bicycle improves cardiovascular health and cuts traffic."),
    Document("baking", title="Sourdough", text="A sourdough starter is a culture of wild yeast and lactic acid bacteria used to leaven bread."),
    Document("charger", title="Warehouse inventory", text="The delivery van arrives on Tuesdays; pallets are stacked by the loading dock, forklifts are charged overnight and the night shift counts the stock. Part ZQ7731 sits on shelf 14."),
    Document("phones", title="Phone batteries", text="Lithium-ion phone batteries charge fastest with a compatible USB-C power adapter."),
    Document("volcano", title="Volcanoes", text="Basaltic lava flows erupt from shield volcanoes such as those of Hawaii."),
    Document("tides", title="Tides", text="Ocean tides are driven mainly by the gravitational pull of the Moon."),
    Document("lunar", title="Lunar phases", text="The Moon's phases follow its orbit: new moon, crescent, full moon."),
    Document("currents", title="Ocean currents", text="Ocean currents move heat from the equator towards the poles."),
    Document("eclipse", title="Eclipses", text="A solar eclipse happens when the Moon passes between Earth and the Sun."),
    Document(
        "long",
        title="A long document",
        text="\n\n".join(
            f"Paragraph {i} about glaciers, ice sheets and the slow flow of ice under its own weight." * 3
            for i in range(12)
        ),
    ),
]


@pytest.fixture(scope="module")
def settings():
    return load_settings(chunk_size=64, chunk_overlap=8, fusion_depth=3)


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory, settings, embedder):
    root = tmp_path_factory.mktemp("pipeline-index")
    build_index(DOCS, root, settings.params().index, embedder)
    return root


@pytest.fixture(scope="module")
def pipeline(index_dir, settings, embedder):
    return Pipeline.open(index_dir, embedder, settings.params().retrieval)


def test_long_document_is_chunked_and_aggregated(pipeline):
    hits = pipeline.search("glaciers and ice sheets flowing", SearchMode.DENSE, top_k=3)
    assert hits[0].doc_id == "long"
    assert len({h.doc_id for h in hits}) == 3  # one hit per document
    chunk_hits = pipeline.search("glaciers and ice sheets flowing", SearchMode.DENSE, top_k=3, level="chunk")
    assert [h.doc_id for h in chunk_hits] == ["long", "long", "long"]
    assert len({h.chunk_id for h in chunk_hits}) == 3
    assert pipeline.max_chunks_per_doc > 3


def test_bm25_finds_exact_product_code(pipeline):
    hits = pipeline.search("ZQ7731", SearchMode.BM25, top_k=5)
    assert [h.doc_id for h in hits] == ["charger"]
    assert dict(hits[0].ranks) == {"bm25": 1} and hits[0].rank == 1
    assert hits[0].text == DOCS[2].text and hits[0].title == "Warehouse inventory"


def test_hybrid_is_rrf_of_the_two_document_lists(pipeline, settings):
    query = "compatible charger for part ZQ7731"
    top_k = 4
    depth = max(top_k, settings.fusion_depth)  # each ranker contributes its top `depth`
    bm25 = pipeline.search(query, SearchMode.BM25, top_k=depth)
    dense = pipeline.search(query, SearchMode.DENSE, top_k=depth)
    expected = reciprocal_rank_fusion(
        [
            RankedList("bm25", [h.doc_id for h in bm25], [h.score for h in bm25]),
            RankedList("dense", [h.doc_id for h in dense], [h.score for h in dense]),
        ],
        k=settings.rrf_k,
        limit=top_k,
    )
    hybrid = pipeline.search(query, SearchMode.HYBRID, top_k=top_k)
    assert len(hybrid) == top_k
    assert [(h.doc_id, h.score, dict(h.ranks)) for h in hybrid] == [
        (f.key, f.score, dict(f.ranks)) for f in expected
    ]
    assert [h.rank for h in hybrid] == list(range(1, len(hybrid) + 1))


def test_bm25_only_hit_survives_fusion(pipeline, settings):
    query = "lactic moon orbit"  # "lactic" occurs only in the baking document
    depth = settings.fusion_depth
    dense_top = [h.doc_id for h in pipeline.search(query, SearchMode.DENSE, top_k=depth)]
    bm25_top = [h.doc_id for h in pipeline.search(query, SearchMode.BM25, top_k=depth)]
    assert "baking" in bm25_top and "baking" not in dense_top  # precondition
    bm25_rank = bm25_top.index("baking") + 1
    hybrid = {h.doc_id: h for h in pipeline.search(query, SearchMode.HYBRID, top_k=depth)}
    assert dict(hybrid["baking"].ranks) == {"bm25": bm25_rank}
    assert hybrid["baking"].score == 1 / (settings.rrf_k + bm25_rank)


def test_batch_equals_one_by_one(pipeline):
    queries = ["sourdough bread yeast", "moon and ocean tides", "lava", "phone battery adapter"]
    for mode in INDEX_MODES:
        batched = pipeline.search_batch(queries, mode, top_k=4)
        single = [pipeline.search(q, mode, top_k=4) for q in queries]
        assert [[(h.chunk_id, h.score) for h in hits] for hits in batched] == [
            [(h.chunk_id, h.score) for h in hits] for hits in single
        ]


def test_default_mode_follows_hybrid_switch(index_dir, embedder):
    on = Pipeline.open(index_dir, embedder, load_settings(hybrid_search_enabled=True).params().retrieval)
    off = Pipeline.open(index_dir, embedder, load_settings(hybrid_search_enabled=False).params().retrieval)
    assert on.default_mode is SearchMode.HYBRID and off.default_mode is SearchMode.DENSE
    assert set(on.search("lava")[0].ranks) == {"bm25", "dense"}
    assert set(off.search("lava")[0].ranks) == {"dense"}


@pytest.mark.parametrize("query", ["", "   \n"])
@pytest.mark.parametrize("mode", INDEX_MODES)
def test_empty_query(pipeline, query, mode):
    with pytest.raises(EmptyQueryError, match="query is empty or whitespace only"):
        pipeline.search(query, mode)


def test_query_over_model_limit(pipeline):
    query = "tides " * 400
    for mode in (SearchMode.DENSE, SearchMode.HYBRID):
        with pytest.raises(QueryTooLongError, match="the embedding model accepts at most 256"):
            pipeline.search(query, mode)
    assert pipeline.search(query, SearchMode.BM25)[0].doc_id == "tides"  # BM25 has no limit
    assert pipeline.search(query, SearchMode.DENSE, truncate=True)[0].doc_id == "tides"


def test_unknown_mode_and_level_and_top_k(pipeline):
    with pytest.raises(ValueError) as err:
        pipeline.search("lava", "semantic")
    assert str(err.value) == "unknown search mode 'semantic'; valid search modes: bm25, dense, hybrid, graph, hybrid-graph"
    with pytest.raises(ValueError) as err:
        pipeline.search("lava", "bm25", level="page")
    assert str(err.value) == "unknown result level 'page'; valid result levels: chunk, document"
    for bad in (0, -1, True, 2.5):
        with pytest.raises(ValueError, match="top_k must be a positive integer"):
            pipeline.search("lava", "bm25", top_k=bad)


def test_bm25_only_pipeline_needs_no_embedder(index_dir, settings):
    p = Pipeline.open(index_dir, None, settings.params().retrieval)
    assert p.search("sourdough", "bm25")[0].doc_id == "baking"
    with pytest.raises(ModelError, match="mode 'dense' needs an embedder"):
        p.search("sourdough", "dense")


def test_embedder_that_does_not_match_index(index_dir, settings, embedder):
    class Other:
        name, dim = "other-model", embedder.dim

        def info(self):
            return {"name": self.name, "dim": self.dim}

    with pytest.raises(ModelError) as err:
        Pipeline.open(index_dir, Other(), settings.params().retrieval)
    assert "built with embedding model 'all-MiniLM-L6-v2' (dim 384)" in str(err.value)


def test_two_shards_rank_like_one_for_dense(tmp_path, settings, embedder):
    chunks = chunk_documents(DOCS, make_chunker(settings.params().index, embedder))
    vectors = embed_chunks(chunks, embedder)
    by_doc = [i for i, c in enumerate(chunks) if c.doc_id in {"bikes", "charger", "volcano", "long"}]
    rest = [i for i in range(len(chunks)) if i not in set(by_doc)]
    shards = [
        build_shard([chunks[i] for i in rows], vectors[rows], settings.params().index, embedder.info()) for rows in (by_doc, rest)
    ]
    one = Pipeline([build_shard(chunks, vectors, settings.params().index, embedder.info())], embedder, settings.params().retrieval)
    two = Pipeline(shards, embedder, settings.params().retrieval)
    for query in ["ice", "bread", "moon", "USB-C adapter"]:
        for level in ResultLevel:
            a = one.search(query, "dense", top_k=6, level=level)
            b = two.search(query, "dense", top_k=6, level=level)
            assert [(h.chunk_id, h.score) for h in a] == [(h.chunk_id, h.score) for h in b]


def test_index_published_as_version(index_dir):
    directory = IndexDirectory(index_dir)
    assert directory.versions() == [directory.current_version()]


def test_document_ranking_equals_brute_force(pipeline, embedder):
    """Best chunk per document over the whole shard, computed with numpy, for every document
    (the long document's many chunks make the pipeline widen its chunk fetch)."""
    query = "glaciers and ice sheets flowing"
    shard = pipeline.shards[0]
    chunks = [shard.chunk(row) for row in range(len(shard))]
    scores = embedder.embed([c.indexed_text for c in chunks]) @ embedder.embed([query])[0]
    best: dict[str, float] = {}
    for chunk, score in zip(chunks, scores.tolist()):
        best[chunk.doc_id] = max(best.get(chunk.doc_id, float("-inf")), score)
    expected = sorted(best, key=lambda d: (-best[d], d))
    hits = pipeline.search(query, SearchMode.DENSE, top_k=len(DOCS))
    assert [h.doc_id for h in hits] == expected
    assert [h.score for h in hits] == pytest.approx([best[d] for d in expected], abs=1e-5)
    # the top 2 x top_k chunks hold fewer than top_k documents: the fetch had to widen
    assert sum(c.doc_id == "long" for c in chunks) > len(DOCS) + 1


class LengthScorer:
    """A stand-in cross-encoder: longer passages score higher (no model)."""

    def __init__(self, card=None):
        self.card = {} if card is None else card

    def score(self, query, passages):
        import numpy as np

        return np.array([float(len(p)) for p in passages], dtype=np.float32)


def test_rerank_reorders_the_hybrid_head(index_dir, embedder):
    settings = load_settings(chunk_size=64, chunk_overlap=8, fusion_depth=3, reranker_depth=4, reranker_fusion="none")
    pipeline = Pipeline.open(index_dir, embedder, settings.params().retrieval, reranker=LengthScorer(), rerank=settings.params().rerank)
    query = "moon and ocean tides"
    hybrid = pipeline.search(query, SearchMode.HYBRID, top_k=6)
    reranked = pipeline.search(query, SearchMode.HYBRID, top_k=6, rerank=True)
    head = sorted(hybrid[:4], key=lambda h: -len(h.passage))
    assert [h.chunk_id for h in reranked] == [h.chunk_id for h in head + hybrid[4:]]
    assert [h.rank for h in reranked] == [1, 2, 3, 4, 5, 6]
    assert [h.ranks["rerank"] for h in reranked[:4]] == [1, 2, 3, 4]
    assert all("rerank" not in h.ranks for h in reranked[4:])
    assert len(pipeline.search(query, SearchMode.HYBRID, top_k=2, rerank=True)) == 2


def home_card(vector, model):
    return {"domain": {"embedding_model": dict(model), "centroid": [float(x) for x in vector]}}


def toward(home, cosine):
    """A unit vector at this cosine from `home`."""
    other = np.zeros_like(home)
    other[int(np.argmin(np.abs(home)))] = 1.0
    other -= (other @ home) * home
    other /= np.linalg.norm(other)
    return cosine * home + np.sqrt(1 - cosine**2) * other


@pytest.mark.parametrize(
    "case, expected_weight",
    [("set 1", 1.0), ("set 0.3", 0.3), ("no card", 0.5), ("at home", 1.0), ("cosine 0.7", 0.7),
     ("far", 0.5), ("other embedding model", 0.5)],
)
def test_rerank_fused_with_the_first_stage_order(index_dir, embedder, case, expected_weight):
    """The cross-encoder's order and the hybrid head's fused by RRF, the cross-encoder's order
    weighted as set, or by the cosine of its card's training-corpus centroid and the index's
    (floor 0.5; no centroid, or one from another embedding model: 0.5)."""
    weight = {"set 1": 1.0, "set 0.3": 0.3}.get(case)
    settings = load_settings(
        chunk_size=64, chunk_overlap=8, fusion_depth=3, reranker_depth=4, rrf_k=20, reranker_weight=weight, reranker_fusion="rrf"
    )
    assert settings.params().rerank.rrf_k == 20
    loaded = IndexDirectory(index_dir).load().shards
    home, model = centroid(loaded), loaded[0].manifest.model
    cards = {"at home": home_card(home, model), "cosine 0.7": home_card(toward(home, 0.7), model),
             "far": home_card(-home, model), "other embedding model": home_card(home, {**model, "name": "other"})}
    scorer = LengthScorer(cards.get(case))
    pipeline = Pipeline.open(index_dir, embedder, settings.params().retrieval, reranker=scorer, rerank=settings.params().rerank)
    assert pipeline.rerank_weight == pytest.approx(expected_weight, abs=1e-5)
    w = pipeline.rerank_weight
    query = "moon and ocean tides"
    hybrid = pipeline.search(query, SearchMode.HYBRID, top_k=6)
    reranked = pipeline.search(query, SearchMode.HYBRID, top_k=6, rerank=True)
    by_length = sorted(range(4), key=lambda i: -len(hybrid[i].passage))
    own = {i: pos for pos, i in enumerate(by_length, 1)}
    fused = {i: w / (20 + own[i]) + 1 / (20 + i + 1) for i in range(4)}
    # equal fused scores: the better single rank first, then the incoming position
    expected = sorted(range(4), key=lambda i: (-fused[i], min(own[i], i + 1), i))
    assert [h.chunk_id for h in reranked] == [hybrid[i].chunk_id for i in expected] + [h.chunk_id for h in hybrid[4:]]
    assert [h.score for h in reranked[:4]] == pytest.approx([fused[i] for i in expected])
    assert [h.ranks["rerank"] for h in reranked[:4]] == [own[i] for i in expected]


@pytest.mark.parametrize("weight", [0.5, 1.0, 3.0])
def test_rerank_by_scores_on_a_common_scale(index_dir, embedder, weight):
    """The default fusion: the head's hybrid scores and the cross-encoder's, each mapped onto
    [0, 1] over the head, added with the cross-encoder's weight."""
    settings = load_settings(chunk_size=64, chunk_overlap=8, fusion_depth=3, reranker_depth=4, reranker_weight=weight)
    assert settings.params().rerank.fusion.value == "score"
    pipeline = Pipeline.open(index_dir, embedder, settings.params().retrieval, reranker=LengthScorer(), rerank=settings.params().rerank)
    query = "moon and ocean tides"
    hybrid = pipeline.search(query, SearchMode.HYBRID, top_k=6)
    reranked = pipeline.search(query, SearchMode.HYBRID, top_k=6, rerank=True)
    first = [h.score for h in hybrid[:4]]
    lengths = [len(h.passage) for h in hybrid[:4]]
    assert len(set(first)) > 1 and len(set(lengths)) > 1  # both lists order something here
    on_scale = lambda xs, i: (xs[i] - min(xs)) / (max(xs) - min(xs))  # noqa: E731
    fused = {i: on_scale(first, i) + weight * on_scale(lengths, i) for i in range(4)}
    expected = sorted(range(4), key=lambda i: (-fused[i], i))
    if weight > 1:  # the cross-encoder outweighs the first stage: the head is not hybrid's order
        assert expected != [0, 1, 2, 3]
    assert [h.chunk_id for h in reranked] == [hybrid[i].chunk_id for i in expected] + [h.chunk_id for h in hybrid[4:]]
    assert [h.score for h in reranked[:4]] == pytest.approx([fused[i] for i in expected])
    by_length = sorted(range(4), key=lambda i: (-lengths[i], i))
    assert [h.ranks["rerank"] for h in reranked[:4]] == [by_length.index(i) + 1 for i in expected]


@pytest.mark.parametrize("fusion", ["score", "rrf"])
def test_weight_zero_keeps_the_first_stage_order(index_dir, embedder, fusion):
    settings = load_settings(chunk_size=64, chunk_overlap=8, fusion_depth=3, reranker_depth=4, reranker_fusion=fusion)
    query = "moon and ocean tides"
    orders = {}
    for weight in (0.0, 1.0):
        rerank = replace(settings.params().rerank, weight=weight)
        pipeline = Pipeline.open(index_dir, embedder, settings.params().retrieval, reranker=LengthScorer(), rerank=rerank)
        orders[weight] = [h.chunk_id for h in pipeline.search(query, SearchMode.HYBRID, top_k=6, rerank=True)]
    hybrid = [h.chunk_id for h in pipeline.search(query, SearchMode.HYBRID, top_k=6)]
    assert orders[0.0] == hybrid
    assert orders[1.0] != hybrid


def test_reranker_enabled_switch(index_dir, embedder):
    on = load_settings(chunk_size=64, chunk_overlap=8, reranker_enabled=True, reranker_depth=3)
    pipeline = Pipeline.open(index_dir, embedder, on.params().retrieval, reranker=LengthScorer(), rerank=on.params().rerank)
    assert "rerank" in pipeline.search("lava")[0].ranks
    assert "rerank" not in pipeline.search("lava", rerank=False)[0].ranks
    with pytest.raises(ModelError, match="reranking was asked for but no reranker is loaded"):
        Pipeline.open(index_dir, embedder, on.params().retrieval, rerank=on.params().rerank).search("lava")


def test_sharded_build_ranks_like_one_shard(tmp_path, settings, embedder, pipeline):
    from llmframe_ray.index.shard import shard_of

    root = tmp_path / "three"
    build_index(DOCS, root, settings.params().index, embedder, shards=3)
    loaded = IndexDirectory(root).load()
    assert len(loaded.shards) + len(loaded.info["empty_shards"]) == 3
    for shard_id, shard in zip(loaded.shard_ids, loaded.shards):
        assert {shard.doc_id(r) for r in range(len(shard))} == {d.doc_id for d in DOCS if shard_of(d.doc_id, 3) == shard_id}
    sharded = Pipeline(loaded.shards, embedder, settings.params().retrieval)
    for query in ("moon and tides", "sourdough bread yeast", "ZQ7731", "glaciers"):
        for mode in ("bm25", "dense", "hybrid"):
            expected = [(h.doc_id, h.chunk_id, round(h.score, 5)) for h in pipeline.search(query, mode, 5)]
            assert [(h.doc_id, h.chunk_id, round(h.score, 5)) for h in sharded.search(query, mode, 5)] == expected
