"""The knowledge graph (llmframe_ray/graph): offline extraction, the graph stored in a version,
the graph ranker's walk, and its list in the retrieval plan (modes graph and hybrid-graph)."""

import re

import numpy as np
import pytest

from llmframe_ray.config import load_settings
from llmframe_ray.errors import IndexLoadError
from llmframe_ray.eval.trec import score_all_found, write_run
from llmframe_ray.graph.build import ensure_graph
from llmframe_ray.graph.extract import NameMatcher, OfflineExtractor, entity_key, match_known, title_surface
from llmframe_ray.retrieve.words import stem
from llmframe_ray.graph.params import GraphParams
from llmframe_ray.graph.rank import GraphRanker
from llmframe_ray.graph.search import GraphSearch
from llmframe_ray.graph.store import TITLE_WEIGHT, KnowledgeGraph, build_graph, index_chunks
from llmframe_ray.index.metadata import parse_filter
from llmframe_ray.index.versions import IndexDirectory
from llmframe_ray.ingest.build import publish_shards
from llmframe_ray.retrieve.pipeline import Pipeline, _DirectBackend
from llmframe_ray.retrieve.drive import run_plan
from llmframe_ray.retrieve.plan import FusionParams, ResultLevel, retrieval_plan
from llmframe_ray.retrieve.strategy import GRAPH_MISSING, StrategyError
from llmframe_ray.types import Chunk, SearchMode

DIM = 16
DOCS = {
    "film": ("Kiss and Tell (1945 film)", [
        "Kiss and Tell is a 1945 American comedy film starring Shirley Temple as Corliss Archer. "
        "It was directed by Richard Wallace.",
        "The film was a box office success for Columbia Pictures.",
    ]),
    "temple": ("Shirley Temple", [
        "Shirley Temple Black was an American actress. As an adult, she served as Chief of Protocol of the United States.",
    ]),
    "archer": ("Meet Corliss Archer", ["Meet Corliss Archer is a radio program about a teenage girl. It aired on CBS from 1943."]),
    "lava": ("Lava", ["Lava is molten rock expelled by a volcano during an eruption. Basaltic lava flows quickly on Mount Etna."]),
    "etna": ("Mount Etna", ["Mount Etna is on the east coast of Sicily. Its eruptions are frequent."]),
    "tides": ("Tides", ["Tides are the rise and fall of sea levels caused by the Moon."]),
}
BRIDGE = "What position did the actress who played Corliss Archer in the film Kiss and Tell hold?"


def chunks():
    out = []
    for doc, (title, texts) in DOCS.items():
        for position, text in enumerate(texts):
            out.append(Chunk(f"{doc}#{position}", doc, position, text, title=title, metadata={"kind": "film" if doc in ("film", "temple", "archer") else "nature"}))
    return out


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    rng = np.random.default_rng(3)
    all_chunks = chunks()
    vectors = rng.normal(size=(len(all_chunks), DIM)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    root = tmp_path_factory.mktemp("graph") / "index"
    params = load_settings().params().index
    publish_shards(IndexDirectory(root), all_chunks, vectors, params, {"name": "random", "provider": "test", "dim": DIM, "max_length": 64}, shards=2)
    return root


def test_extractor_reads_titles_quotes_names_and_phrases():
    text = ('In 1943 the program "A Date with Judy" moved to NBC. It starred Janet Marie Waldo of the United States '
            'as a voice actress in January; Bank of America paid for insulin resistance studies.')
    got = [(m.key, m.surface, m.type) for m in OfflineExtractor().extract(text, "Janet Waldo (actress)")]
    assert got == [
        ("janet waldo", "Janet Waldo", "title"),
        ("date with judi", "A Date with Judy", "quoted"),
        ("nbc", "NBC", "name"),  # "In" (sentence start), "1943", "January" and single lower-case words are not
        ("janet mari waldo", "Janet Marie Waldo", "name"),
        ("unit state", "United States", "name"),
        ("voic actress", "voice actress", "phrase"),
        ("bank of america", "Bank of America", "name"),
        ("insulin resist studi", "insulin resistance studies", "phrase"),
    ]


def test_a_paragraph_break_ends_a_name():
    """A Markdown heading and the paragraph under it are not one capitalised run."""
    found = OfflineExtractor().extract("# Shirley Temple\n\nShirley Temple Black was an actress.\nShe was born in Santa\nMonica.")
    assert [m.surface for m in found if m.type == "name"] == ["Shirley Temple", "Shirley Temple Black", "Santa Monica"]


def test_scare_quotes_are_not_entities():
    got = [(m.surface, m.type) for m in OfflineExtractor().extract('A "useful" system and the "Bradford distribution" law.')]
    assert got == [("Bradford distribution", "quoted")]


def test_keys_and_titles_are_normalised():
    assert entity_key("The Beatles") == entity_key("Beatles") == "beatl"
    assert entity_key("Shirley Temple's") == entity_key("shirley temple") == "shirley templ"
    assert title_surface("Kiss and Tell (1945 film)") == "Kiss and Tell"
    assert title_surface("(film)") == "(film)"


def test_match_known_prefers_the_longest_name_and_capitalised_single_words():
    known = {"kiss and tell": 0, "corliss archer": 1, "tell": 2, "film": 3}
    single = {"tell": 2, "film": 3}
    assert match_known("the film Kiss and Tell starred Corliss Archer", known, single=single) == [0, 1]
    assert match_known("a film about Film", known, single=single) == [3]  # only the capitalised one
    assert match_known("kiss and tell", known, single={}) == [0]


def _every_ngram_match(text, known, single):
    """The reference reading, on its own tokens and stems: every n-gram (up to six words) of
    every position looked up, the longest kept."""
    best, offset = {}, 0
    for segment in re.split(r"[.!?;:,()\[\]{}\"“”«»–—/|]+|\s['‘’]|['‘’]\s|\n\s*\n", text):
        tokens = re.findall(r"[^\W_]+(?:['’.\-&][^\W_]+)*", segment)
        stems = [stem(t) for t in tokens]
        for start in range(len(stems)):
            for n in range(1, min(6, len(stems) - start) + 1):
                key = " ".join(stems[start : start + n])
                table = known if n > 1 else single
                if (n > 1 or tokens[start][:1].isupper()) and key in table:
                    best[offset + start] = (n, table[key])
        offset += len(stems) + 1
    out, covered_until = [], -1
    for start in sorted(best):
        n, entity = best[start]
        if start + n - 1 > covered_until:
            covered_until = start + n - 1
            if entity not in out:
                out.append(entity)
    return out


def test_name_matcher_reads_as_every_ngram_looked_up():
    # keys that nest ("new york" in "new york city"), share prefixes, overlap in texts, and one
    # longer than the six words an n-gram may have; the prefix scan (and the scan without
    # prefixes) must find exactly what looking up every n-gram finds
    rng = np.random.default_rng(7)
    vocabulary = "New York City Hall of Fame state university press kiss and tell Corliss Archer Film film".split()
    phrases = [" ".join(rng.choice(vocabulary, int(rng.integers(1, 7)))) for _ in range(40)]
    phrases += ["New York City Hall of Fame Press", "New York City Hall of Fame"]  # seven words, then its first six
    keys = {entity_key(phrase) for phrase in phrases} - {""}
    known = {key: i for i, key in enumerate(sorted(keys))}
    single = {key: i for key, i in known.items() if " " not in key}
    multi = {key: i for key, i in known.items() if " " in key}
    readers = [
        (NameMatcher(multi, single), multi, single), (NameMatcher(multi, single, prefixes=False), multi, single),
        (NameMatcher(known), known, known),  # one dictionary for both, as match_known(text, known) reads
    ]
    checked = 0
    for _ in range(300):
        # known names written out, between random words and punctuation
        parts = [rng.choice(phrases) if rng.random() < 0.4 else rng.choice(vocabulary + [",", ".", "and", "(x)"])
                 for _ in range(int(rng.integers(1, 12)))]
        text = " ".join(parts)
        for matcher, table, one_word in readers:
            assert matcher.match(text) == _every_ngram_match(text, table, one_word), text
        checked += bool(_every_ngram_match(text, multi, single))
    assert checked > 100  # most texts name something
    six = known[entity_key("New York City Hall of Fame")]
    assert NameMatcher(multi, single).match("the New York City Hall of Fame Press") == [six]  # seven words: the first six
    assert NameMatcher({"new york city": 0, "new york": 1}).prefixes == {"new", "new york"}


def test_graph_links_a_title_named_in_another_chunk(index):
    loaded = IndexDirectory(index).load()
    graph = build_graph(index_chunks(list(zip(loaded.shard_ids, loaded.shards))))
    ids = graph.entity_ids()
    nodes = {(int(s), int(r)): n for n, (s, r) in enumerate(zip(graph.chunk_shard, graph.chunk_row))}
    by_chunk = {}
    for shard_id, shard in zip(loaded.shard_ids, loaded.shards):
        for row, chunk in enumerate(shard.store):
            by_chunk[chunk.chunk_id] = nodes[shard_id, row]
    mentions = graph.mentions.toarray()
    temple = ids["shirley templ"]
    assert graph.types[temple] == "title" and graph.names[temple] == "Shirley Temple"
    assert mentions[by_chunk["temple#0"], temple] == TITLE_WEIGHT
    assert mentions[by_chunk["film#0"], temple] == 1.0  # named there, a link to the actress's own chunk
    assert mentions[by_chunk["film#1"], temple] == 0.0
    both = ((mentions[:, temple] > 0) & (mentions[:, ids["corliss archer"]] > 0)).sum()
    assert graph.relations[temple, ids["corliss archer"]] == both == 1
    assert graph.relations.diagonal().sum() == 0
    assert {graph.names[e] for c in graph.communities for e in c.entities} <= set(graph.names)


def test_a_stored_graph_reads_back_the_same(index, tmp_path):
    loaded = IndexDirectory(index).load()
    graph = build_graph(index_chunks(list(zip(loaded.shard_ids, loaded.shards))))
    back = KnowledgeGraph.load(graph.save(tmp_path / "graph"))
    assert (back.keys, back.names, back.types) == (graph.keys, graph.names, graph.types)
    assert (back.mentions != graph.mentions).nnz == 0 and (back.relations != graph.relations).nnz == 0
    assert back.communities == graph.communities and back.sizes() == graph.sizes()
    (tmp_path / "graph" / "graph.json").write_text('{"format": 99}')
    with pytest.raises(IndexLoadError, match="graph format 99, this version reads 1"):
        KnowledgeGraph.load(tmp_path / "graph")


def test_walk_scores_are_the_matrix_walk(index):
    loaded = IndexDirectory(index).load()
    graph = build_graph(index_chunks(list(zip(loaded.shard_ids, loaded.shards))))
    ranker = GraphRanker(graph, GraphParams(depth=3, hop_decay=0.5))
    m = graph.mentions.toarray().astype(np.float64)
    idf = np.log1p(m.shape[0] / np.maximum((m > 0).sum(axis=0), 1))
    to_chunks = m.T / m.T.sum(axis=1, keepdims=True)
    weighted = m * idf
    to_entities = weighted / weighted.sum(axis=1, keepdims=True)
    seeds = np.zeros(graph.n_entities)
    for entity, weight in ranker.seeds(BRIDGE).items():
        seeds[entity] = weight
    hop1 = seeds @ to_chunks
    hop2 = hop1 @ to_entities @ to_chunks
    hop3 = hop2 @ to_entities @ to_chunks
    expected = hop1 + 0.5 * hop2 + 0.25 * hop3
    assert np.allclose(ranker.scores([BRIDGE]).toarray()[0], expected)
    ids = graph.entity_ids()
    assert set(ranker.seeds(BRIDGE)) == {ids["kiss and tell"]}  # a title; "Corliss Archer" is a name
    assert set(GraphRanker(graph, GraphParams(seed_types=("title", "name"))).seeds(BRIDGE)) == {ids["kiss and tell"], ids["corliss archer"]}


def plan_hits(index, mode, queries, level=ResultLevel.DOCUMENT, top_k=5, where=None, params=None):
    loaded = IndexDirectory(index).load()
    pipeline = Pipeline(loaded.shards, None)
    ensure_graph(index)
    pipeline.load_graph(loaded.path, loaded.shard_ids, params)
    vectors = np.random.default_rng(5).normal(size=(len(queries), DIM)).astype(np.float32)
    plan = retrieval_plan(queries, mode, level, top_k, [len(s) for s in pipeline.shards], FusionParams(), vectors,
                          together=[range(len(pipeline.shards))], where=where)
    return run_plan(plan, _DirectBackend(pipeline))


def test_bridge_document_is_reached_only_at_depth_two(index):
    (one,) = plan_hits(index, SearchMode.GRAPH, [BRIDGE], params=GraphParams(depth=1))
    (two,) = plan_hits(index, SearchMode.GRAPH, [BRIDGE], params=GraphParams(depth=2))
    # "Meet Corliss Archer" is one longer name: its chunk does not name "Corliss Archer" alone
    assert [h.doc_id for h in one] == ["film"]
    assert [h.doc_id for h in two][:2] == ["film", "temple"]
    assert all(set(h.ranks) == {"graph"} for h in two)
    assert [h.rank for h in two] == list(range(1, len(two) + 1))


def test_graph_list_respects_filters_and_chunk_level(index):
    where = parse_filter({"kind": "nature"})
    (hits,) = plan_hits(index, SearchMode.GRAPH, ["Where is Mount Etna?"], where=where)
    assert {h.doc_id for h in hits} == {"etna", "lava"}
    (film,) = plan_hits(index, SearchMode.GRAPH, ["Kiss and Tell"], level=ResultLevel.CHUNK, top_k=10)
    assert {h.chunk_id for h in film} >= {"film#0", "film#1"}


def test_no_entity_in_the_query_leaves_hybrid_unchanged(index):
    queries = ["rise and fall of sea levels", "molten rock"]
    assert plan_hits(index, SearchMode.GRAPH, queries) == [[], []]
    fused = plan_hits(index, SearchMode.HYBRID_GRAPH, queries)
    hybrid = plan_hits(index, SearchMode.HYBRID, queries)
    assert [[(h.chunk_id, h.score, dict(h.ranks)) for h in q] for q in fused] == [[(h.chunk_id, h.score, dict(h.ranks)) for h in q] for q in hybrid]


def test_hybrid_graph_adds_the_graph_rank_to_rrf(index):
    (hybrid,) = plan_hits(index, SearchMode.HYBRID, [BRIDGE], top_k=6)
    (graph,) = plan_hits(index, SearchMode.GRAPH, [BRIDGE], top_k=6)
    (fused,) = plan_hits(index, SearchMode.HYBRID_GRAPH, [BRIDGE], top_k=6)
    k = FusionParams().rrf_k
    graph_rank = {h.doc_id: h.rank for h in graph}
    for hit in fused:
        expected = sum(1.0 / (k + r) for name, r in hit.ranks.items() if name in ("bm25", "dense"))
        expected += 1.0 / (k + graph_rank[hit.doc_id]) if hit.doc_id in graph_rank else 0.0
        assert hit.score == pytest.approx(expected, rel=1e-9)
        assert hit.ranks.get("graph") == graph_rank.get(hit.doc_id)
    assert {h.doc_id for h in fused} >= {"temple"} and len(hybrid) == 6


def index_without_graph(tmp_path):
    """The test corpus in one shard (every vector the same), published with no graph."""
    all_chunks = chunks()
    vectors = np.full((len(all_chunks), DIM), 1 / np.sqrt(DIM), dtype=np.float32)
    root = tmp_path / "index"
    publish_shards(IndexDirectory(root), all_chunks, vectors, load_settings().params().index,
                   {"name": "random", "provider": "test", "dim": DIM, "max_length": 64})
    return root


def test_graph_modes_without_a_graph_are_refused(tmp_path):
    root = index_without_graph(tmp_path)
    pipeline = Pipeline.open(root, None)
    assert pipeline.graph is None
    with pytest.raises(StrategyError) as raised:
        pipeline.search(BRIDGE, SearchMode.GRAPH)
    assert (raised.value.field, str(raised.value)) == ("retrieval_strategy", GRAPH_MISSING)
    folder, graph, built = ensure_graph(root)
    assert built and folder.parent == IndexDirectory(root).load().path
    assert ensure_graph(root)[2] is False
    hits = Pipeline.open(root, None).search(BRIDGE, SearchMode.GRAPH)
    assert hits[0].doc_id == "film"


def test_a_graph_of_other_shards_is_refused(index):
    loaded = IndexDirectory(index).load()
    graph = ensure_graph(index)[1]
    with pytest.raises(IndexLoadError, match="does not match the loaded shards"):
        GraphSearch(graph, [loaded.shards[0].store], [loaded.shard_ids[0]])


def test_all_found_recall_needs_every_relevant_document(tmp_path):
    run = {"q1": [("a", 3.0), ("b", 2.0), ("c", 1.0)], "q2": [("a", 3.0), ("x", 2.0), ("y", 1.5), ("b", 1.0)]}
    path = write_run(tmp_path / "run.trec", run, tag="t")
    qrels = {"q1": {"a": 1, "b": 1}, "q2": {"a": 1, "b": 1}, "q3": {"z": 1, "w": 1}}
    assert score_all_found(path, qrels, (2, 4)) == {"R_all@2": pytest.approx(1 / 3), "R_all@4": pytest.approx(2 / 3)}


KEY = "graph-test-key-0123456"
AUTH = {"X-API-Key": KEY}


def http_client(index_dir, graph=True):
    from fastapi.testclient import TestClient

    from llmframe_ray.api.auth import ApiKeys
    from llmframe_ray.api.http import create_app
    from llmframe_ray.api.local import LocalStages
    from llmframe_ray.api.service import RagService

    settings = load_settings(api_secret_key=KEY, llm_providers="extractive")
    if graph:
        ensure_graph(index_dir)
    pipeline = Pipeline.open(index_dir, None, settings.params().retrieval)
    stages = LocalStages(index_dir, pipeline, IndexDirectory(index_dir).current_version())
    return TestClient(create_app(RagService(stages, settings.params().service), ApiKeys.from_settings(settings))), pipeline


def test_graph_strategy_and_inspection_over_http(index):
    from tests.unit.test_http_api import as_dicts

    client, pipeline = http_client(index)
    with client:
        got = client.post("/v1/search", headers=AUTH, json={"query": BRIDGE, "retrieval_strategy": "graph", "top_k": 3})
        assert got.status_code == 200, got.text
        assert (got.json()["retrieval_strategy"], got.json()["hits"]) == ("graph", as_dicts(pipeline.search(BRIDGE, SearchMode.GRAPH, 3)))
        assert [h["doc_id"] for h in got.json()["hits"]][:2] == ["film", "temple"]

        found = client.get("/v1/graph/entities", headers=AUTH, params={"q": "Corliss Archer"}).json()["entities"]
        ids = pipeline.graph.graph.entity_ids()
        assert found[0] == {"id": ids["corliss archer"], "name": "Corliss Archer", "type": "name", "key": "corliss archer", "chunks": 1}
        assert {e["name"] for e in found} == {"Corliss Archer", "Meet Corliss Archer"}  # named, then by substring

        temple = client.get(f"/v1/graph/entity/{ids['shirley templ']}", headers=AUTH).json()
        assert [m["chunk_id"] for m in temple["mentions"]] == ["temple#0", "film#0"]  # its own chunk (title) first
        assert {n["name"]: n["weight"] for n in temple["neighbours"]}["Corliss Archer"] == 1
        assert all(ids["shirley templ"] in c["entities"] or c["size"] > len(c["entities"]) for c in temple["communities"])

        with_communities = client.post("/v1/search", headers=AUTH, json={"query": BRIDGE, "mode": "bm25", "top_k": 2, "include_communities": True}).json()
        hits, extra = with_communities["hits"][:2], with_communities["hits"][2:]
        assert hits == client.post("/v1/search", headers=AUTH, json={"query": BRIDGE, "mode": "bm25", "top_k": 2}).json()["hits"]
        assert extra and [h["rank"] for h in extra] == list(range(3, 3 + len(extra)))
        assert all(h["doc_id"].startswith("community:") and h["ranks"] == {"community": h["rank"] - 2} for h in extra)
        texts = " ".join(t for _, texts in DOCS.values() for t in texts)
        assert "Kiss and Tell" in extra[0]["metadata"]["entities"] and extra[0]["text"] in texts  # a sentence of the corpus
        assert "timings_ms" in with_communities and "communities" in with_communities["timings_ms"]

        other = client.get(f"/v1/graph/entity/{ids['shirley templ']}", headers=AUTH, params={"namespace": "someone-else"})
        assert other.status_code == 404
        assert other.json()["error"] == {"type": "not_found", "message": f"no entity {ids['shirley templ']} in the served version's knowledge graph", "field": None}
        assert client.get("/v1/graph/entities", headers=AUTH, params={"q": "Shirley", "namespace": "someone-else"}).json()["entities"] == []
        assert client.get("/v1/graph/entities", params={"q": "Shirley"}).status_code == 401


def test_graph_routes_without_a_graph_are_404(tmp_path):
    from llmframe_ray.api.graph_routes import NO_GRAPH

    client, _ = http_client(index_without_graph(tmp_path), graph=False)
    with client:
        for path in ("/v1/graph/entities?q=Etna", "/v1/graph/entity/0"):
            response = client.get(path, headers=AUTH)
            assert (response.status_code, response.json()["error"]) == (404, {"type": "no_graph", "message": NO_GRAPH, "field": None})
        response = client.post("/v1/search", headers=AUTH, json={"query": "Etna", "retrieval_strategy": "graph"})
        assert response.status_code == 422
        assert response.json()["error"]["field"] == "retrieval_strategy"
        response = client.post("/v1/search", headers=AUTH, json={"query": "Etna", "mode": "bm25", "include_communities": True})
        assert response.status_code == 422
        assert response.json()["error"]["field"] == "include_communities"


def bag_of_words(texts):
    """A stand-in embedder: each word hashed into DIM dimensions, unit length."""
    out = np.zeros((len(texts), DIM), dtype=np.float32)
    for i, text in enumerate(texts):
        for word in text.lower().split():
            out[i, sum(map(ord, word.strip("?,."))) % DIM] += 1.0
    return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-9)


def test_a_title_meant_but_not_named_seeds_through_its_embedded_name(tmp_path):
    root = index_without_graph(tmp_path)
    graph = ensure_graph(root, embed=bag_of_words)[1]
    titles = sorted(graph.names[e] for e in graph.name_entities.tolist())
    assert titles == sorted(title_surface(t) for t, _ in DOCS.values())  # no quoted names in these chunks
    assert graph.name_vectors.dtype == np.float16 and graph.info["names_embedded"] == len(titles)
    assert ensure_graph(root, embed=bag_of_words)[2] is False  # built with name vectors: kept
    query = "Archer Corliss meet"  # the title's words, not its word order: no n-gram names it
    ranker = GraphRanker(graph, GraphParams(name_match=0.99))
    archer = graph.entity_ids()["meet corliss archer"]
    assert archer not in ranker.seeds(query)
    assert ranker.meant(bag_of_words([query])) == [[archer]]
    assert archer in ranker.seeds(query, [archer])
    assert GraphRanker(graph, GraphParams()).meant(bag_of_words([query])) == [[]]  # off by default

    loaded = IndexDirectory(root).load()
    pipeline = Pipeline(loaded.shards, None)

    def hits(mode, params):
        pipeline.load_graph(loaded.path, loaded.shard_ids, params)
        plan = retrieval_plan([query], mode, ResultLevel.DOCUMENT, 5, [len(s) for s in pipeline.shards], FusionParams(),
                              bag_of_words([query]), together=[range(len(pipeline.shards))])
        return run_plan(plan, _DirectBackend(pipeline))[0]

    assert [h.doc_id for h in hits(SearchMode.HYBRID_GRAPH, GraphParams(name_match=0.99)) if "graph" in h.ranks][:1] == ["archer"]
    assert not [h for h in hits(SearchMode.HYBRID_GRAPH, GraphParams()) if "graph" in h.ranks]
    assert hits(SearchMode.GRAPH, GraphParams(name_match=0.99)) == []  # graph alone has no query embedding
