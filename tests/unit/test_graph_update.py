"""Incremental knowledge graphs (graph/extractions.py, graph/store.py `previous`): a chunk's
entities are read once and kept by fingerprint, and an update starts from the previous graph,
keeping what did not change."""

from __future__ import annotations

import json

from llmframe_ray.batch.plan import chunk_fingerprint
from llmframe_ray.graph.extract import OfflineExtractor
from llmframe_ray.graph.extractions import ExtractionStore, merge_reports, storable
from llmframe_ray.graph.llm_extract import Extraction
from llmframe_ray.graph.store import KnowledgeGraph, build_graph
from tests.unit.test_graph import chunks

SIZE = 2  # communities over 2 entities are split again: the test graphs have sub-levels


def triples(items):
    return [(0, row, chunk) for row, chunk in enumerate(items)]


def by_key(graph):
    """(chunk fingerprint, entity key) -> weight: the mentions, whatever the node order."""
    m = graph.mentions.tocoo()
    return {(graph.chunk_fps[r], graph.keys[c]): float(w) for r, c, w in zip(m.row, m.col, m.data)}


def communities_by_keys(graph):
    return {(c.level, frozenset(graph.keys[e] for e in c.entities)): c.summary for c in graph.communities}


class CountingExtractor(OfflineExtractor):
    def __init__(self):
        self.read = []

    def extract(self, text, title=""):
        self.read.append(title)
        return super().extract(text, title)


def test_an_update_reads_only_new_chunks_and_links_like_a_full_build(tmp_path):
    everything = chunks()
    old = [c for c in everything if c.doc_id != "tides"]
    store = ExtractionStore(tmp_path, OfflineExtractor.name)
    first = build_graph(triples(old), store=store, max_community_size=SIZE)
    assert (first.info["extracted"], first.info["extractions_reused"]) == (len(old), 0)
    assert store.fingerprints() == {chunk_fingerprint(c) for c in old}

    reader = CountingExtractor()
    update = build_graph(triples(everything), reader, store=store, previous=first, max_community_size=SIZE)
    assert reader.read == ["Tides"]  # the only chunk not in the store
    assert (update.info["extracted"], update.info["extractions_reused"]) == (1, len(old))
    full = build_graph(triples(everything), max_community_size=SIZE)
    assert by_key(update) == by_key(full) and update.keys == full.keys
    assert (update.relations != full.relations).nnz == 0


def test_an_update_keeps_the_communities_and_summaries_it_did_not_touch(tmp_path):
    everything = chunks()
    old = [c for c in everything if c.doc_id != "tides"]
    first = build_graph(triples(old), max_community_size=SIZE)
    update = build_graph(triples(everything), previous=first, max_community_size=SIZE)
    before, after = communities_by_keys(first), communities_by_keys(update)
    assert len(first.communities) > 1 and max(c.level for c in first.communities) >= 1
    # "Tides" shares no entity with the rest: every earlier community is still there, as it was
    assert {k: after[k] for k in before} == before
    assert update.info["summaries_kept"] == len(before)
    tides = {m.key for c in everything if c.doc_id == "tides" for m in OfflineExtractor().extract(c.text, c.title)}
    assert update.info["entities_touched"] == len(tides)  # only the new chunk's entities gained a mention
    assert update.info["level0_kept"] == sum(c.level == 0 for c in first.communities)  # taken whole, not partitioned again
    assert update.info["communities_kept"] == sum(c.level > 0 for c in first.communities)
    assert "updated" in update.info
    assert set(after) - set(before)  # the new chunk's entities form a community of their own


def test_a_changed_chunk_is_partitioned_and_summarised_again(tmp_path):
    everything = chunks()
    first = build_graph(triples(everything), max_community_size=SIZE)
    changed = [
        c if c.doc_id != "etna" else type(c)(c.chunk_id, c.doc_id, c.position, "Mount Etna is on the east coast of Sicily near Catania.", title=c.title, metadata=c.metadata)
        for c in everything
    ]
    update = build_graph(triples(changed), previous=first, max_community_size=SIZE)
    full = build_graph(triples(changed), max_community_size=SIZE)
    assert by_key(update) == by_key(full)
    etna = update.entity_ids()["mount etna"]
    catania = update.entity_ids()["catania"]
    # the edited chunk is a new chunk node: every entity it names, before or after, is touched
    assert update.info["entities_touched"] == len({"mount etna", "sicili", "east coast", "catania"})
    touched = [c for c in update.communities if etna in c.entities or catania in c.entities]
    assert touched and update.info["summaries_kept"] < len(update.communities)
    before = communities_by_keys(first)
    for c in touched:  # the communities that hold the changed chunk's entities are new
        assert (c.level, frozenset(update.keys[e] for e in c.entities)) not in before


def test_an_update_of_an_old_graph_without_fingerprints_builds_afresh(tmp_path):
    first = build_graph(triples(chunks()), max_community_size=SIZE)
    first.chunk_fps = []  # a graph saved before updates existed
    again = build_graph(triples(chunks()), previous=first, max_community_size=SIZE)
    assert "updated" not in again.info and again.communities == build_graph(triples(chunks()), max_community_size=SIZE).communities


def test_the_graph_keeps_its_chunk_fingerprints(tmp_path):
    graph = build_graph(triples(chunks()))
    back = KnowledgeGraph.load(graph.save(tmp_path / "graph"))
    assert back.chunk_fps == [chunk_fingerprint(c) for c in chunks()]


def test_store_compaction_and_damaged_files(tmp_path):
    store = ExtractionStore(tmp_path, OfflineExtractor.name)
    reader = OfflineExtractor()
    items = [(chunk_fingerprint(c), (reader.extract(c.text, c.title), None)) for c in chunks()]
    store.write(items[:3])
    store.write(items[3:])
    assert store.read() == dict(items)
    live = [fp for fp, _ in items[1:5]]
    assert store.compact(live) == len(items) - 4
    assert set(store.read()) == set(live) and len(list(store.root.glob("*.jsonl"))) == 1
    assert store.compact(live) == 0
    broken = store.root / "broken.jsonl"
    broken.write_text('{"fp": "x", "m": [\n')
    assert store.fingerprints() == set(live) and not broken.exists()


def test_llm_answers_are_stored_and_failed_ones_are_not(tmp_path):
    store = ExtractionStore(tmp_path, "llm-v1")
    answered = Extraction((("Shirley Temple", "person", "An actress."),), (("Shirley Temple", "Kiss and Tell", "starred in"),))
    entries = [("a", ([], answered)), ("b", ([], None))]
    store.write(storable(entries, llm=object()))
    assert store.read() == {"a": ([], answered)}
    assert storable(entries, llm=None) == entries
    assert merge_reports([{"asked": 8, "cost_usd": 0.5, "problems": ["x"]}, {"asked": 2, "cost_usd": None, "problems": []}]) == {
        "asked": 10, "cost_usd": None, "problems": ["x"]}
    row = json.loads((next(store.root.glob("*.jsonl"))).read_text())
    assert row["x"] == [[list(e) for e in answered.entities], [list(r) for r in answered.relations]]
    assert row["m"] == []


def test_an_update_embeds_only_the_new_names(tmp_path):
    from tests.unit.test_graph import bag_of_words

    asked = []

    def embed(texts):
        asked.append(list(texts))
        return bag_of_words(texts)

    everything = chunks()
    first = build_graph(triples([c for c in everything if c.doc_id != "tides"]), embed=embed)
    update = build_graph(triples(everything), previous=first, embed=embed)
    assert asked[1] == ["Tides"] and update.info["names_embedded"] == 1
    full = build_graph(triples(everything), embed=bag_of_words)
    assert update.name_entities.tolist() == full.name_entities.tolist()
    assert (update.name_vectors == full.name_vectors).all()
