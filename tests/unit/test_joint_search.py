"""Shards held by one process searched as one (retrieve/joint.py): the merged top k must be
exactly what merging every shard's own top k gives (candidates.py order rules), for both
rankers, with ties at the cut, string and integer document keys, on the int8 prefilter's path
and on the shard-by-shard path."""

import gc
import weakref
from dataclasses import replace

import numpy as np
import pytest

from llmframe_ray.config import load_settings
from llmframe_ray.index import prefilter
from llmframe_ray.index.dense import DenseIndex
from llmframe_ray.index.store import share_document_keys
from llmframe_ray.index.versions import IndexDirectory
from llmframe_ray.ingest.build import publish_shards
from llmframe_ray.retrieve.candidates import merge_parts
from llmframe_ray.retrieve import joint
from llmframe_ray.retrieve.joint import search_together
from llmframe_ray.retrieve.pipeline import Pipeline
from llmframe_ray.retrieve.plan import Ranker, search_shard
from llmframe_ray.types import Chunk

WORDS = "moon tide ocean lava ice bee honey iron rust tea leaf salt wind rain sand".split()
DIM = 16


def corpus(n_docs, seed):
    """Documents of 1-3 chunks with short texts from a small vocabulary (many equal BM25
    scores) and vectors from a few distinct values (many equal inner products)."""
    rng = np.random.default_rng(seed)
    chunks = []
    for d in range(n_docs):
        for position in range(int(rng.integers(1, 4))):
            text = " ".join(rng.choice(WORDS, size=int(rng.integers(1, 4))))
            chunks.append(Chunk(f"{d}-{position}", f"doc{d:05d}", position, text))
    vectors = rng.choice([-1.0, 0.0, 0.5, 1.0], size=(len(chunks), DIM)).astype(np.float32)
    return chunks, vectors


@pytest.fixture(scope="module", params=[(1200, 4, 3), (90, 3, 5)], ids=["prefilter", "shard-by-shard"])
def shards(request, tmp_path_factory):
    n_docs, n_shards, seed = request.param
    chunks, vectors = corpus(n_docs, seed)
    params = load_settings().params().index
    directory = IndexDirectory(tmp_path_factory.mktemp("joint") / "index")
    publish_shards(directory, chunks, vectors, params, {"name": "random", "provider": "test", "dim": DIM, "max_length": 64}, shards=n_shards)
    return directory.load().shards


def per_shard_merge(held, ranker, inputs, k):
    """The plan's old way: each shard's own top k, merged, cut at k."""
    answers = [(s, search_shard(shard, ranker, inputs, min(k, len(shard)))) for s, shard in held]
    return [merge_parts(ranker.value, [a.part(q, s) for s, a in answers], k) for q in range(len(inputs))]


def same(answer, merged):
    for q, expected in enumerate(merged):
        shards, rows, scores, keys = answer.part(q, -1)
        assert shards.tolist() == expected.shards.tolist()
        assert rows.tolist() == expected.rows.tolist()
        assert scores.astype(np.float64).tobytes() == expected.scores.tobytes()
        assert keys.tolist() == expected.doc_keys.tolist()


@pytest.mark.parametrize("shared_keys", [False, True])
@pytest.mark.parametrize("k", [1, 7, 40, 150])
def test_dense_together_equals_each_shard_merged(shards, shared_keys, k):
    held = list(enumerate(share_document_keys([s.store for s in shards]) if shared_keys else [s.store for s in shards]))
    held = [(i, replace(shards[i], store=store)) for i, store in held]
    rng = np.random.default_rng(k)
    queries = rng.choice([-1.0, 0.0, 0.5, 1.0], size=(12, DIM)).astype(np.float32)
    queries[3] = queries[2]  # a repeated query
    total = sum(len(s) for s in shards)
    answer = search_together(held, False, queries, k)
    same(answer, per_shard_merge(held, Ranker.DENSE, queries, k))
    assert answer.offsets.tolist() == [min(k, total) * q for q in range(13)]


@pytest.mark.parametrize("k", [1, 5, 60, 500])
def test_bm25_together_equals_each_shard_merged(shards, k):
    held = list(enumerate(shards))
    queries = ["moon", "moon tide", "salt salt wind", "nothing here", "lava ice bee honey", "the rain"]
    answer = search_together(held, True, queries, k)
    same(answer, per_shard_merge(held, Ranker.BM25, queries, k))
    assert answer.count(3) == 0  # no term in the corpus


def test_the_prefilter_path_is_taken_where_it_should_be(shards, monkeypatch):
    total = sum(len(s) for s in shards)
    assert total >= prefilter.MIN_ROWS or total < 300  # the fixtures: one on each path
    calls = []
    real = prefilter.Int8Prefilter.candidates
    monkeypatch.setattr(prefilter.Int8Prefilter, "candidates", lambda self, q, k: calls.append(1) or real(self, q, k))
    search_together(list(enumerate(shards)), False, np.ones((1, DIM), dtype=np.float32), 10)
    assert len(calls) == (1 if prefilter.usable(total, 10) else 0)  # one scan over every shard's rows


def test_empty_and_missing_shards_are_left_out(shards):
    held = [(0, None), *[(i + 1, s) for i, s in enumerate(shards)]]
    answer = search_together(held, True, ["moon"], 5)
    assert 0 not in answer.shards.tolist()
    none = search_together([(0, None)], False, np.ones((2, DIM), dtype=np.float32), 5)
    assert none.offsets.tolist() == [0, 0, 0]


def test_a_group_makes_its_shared_prefilter_once_and_lets_it_go_with_its_shards(shards, monkeypatch):
    made = []
    real = prefilter.Int8Prefilter.of
    monkeypatch.setattr(prefilter.Int8Prefilter, "of", lambda *indexes: made.append(len(indexes)) or real(*indexes))
    group = [replace(s, dense=DenseIndex.build(s.dense.vectors(range(len(s))), s.dense.params)) for s in shards]
    query = np.ones((1, DIM), dtype=np.float32)
    if not prefilter.usable(sum(len(s) for s in shards), 10):  # too few rows: shard by shard, exact scans
        search_together(list(enumerate(group)), False, query, 10)
        assert made == []
        return
    first = search_together(list(enumerate(group)), False, query, 10)
    again = search_together(list(enumerate(group)), False, query, 10)
    assert made == [len(shards)]  # one prefilter over all of them, made once
    assert again.rows.tolist() == first.rows.tolist()
    search_together(list(enumerate(group[::-1])), False, query, 10)  # another group: its own
    assert made == [len(shards), len(shards)]
    assert all(s.dense._prefilter is None for s in group)  # no shard made one of its own
    firsts = [weakref.ref(group[0].dense), weakref.ref(group[-1].dense)]
    assert all(ref() in joint._SHARED for ref in firsts)
    kept = len(joint._SHARED)
    del group
    gc.collect()
    assert [ref() for ref in firsts] == [None, None] and len(joint._SHARED) == kept - 2


def test_the_group_numbers_rows_in_the_order_rules_ties(shards):
    held = list(enumerate(share_document_keys([s.store for s in shards])))
    held = [(i, replace(shards[i], store=store)) for i, store in held]
    group = joint._group(held)
    assert len(group) == sum(len(s) for s in shards)
    ties = list(zip(group.keys.tolist(), group.row.tolist(), group.shard.tolist()))
    assert ties == sorted(ties) and len(set(ties)) == len(ties)
    for i, (_, shard) in enumerate(held):  # position maps each shard's rows back to themselves
        at = group.position[group.offsets[i] : group.offsets[i + 1]]
        assert group.shard[at].tolist() == [i] * len(shard) and group.row[at].tolist() == list(range(len(shard)))


def test_bm25_over_the_group_equals_bm25_shard_by_shard(shards, monkeypatch):
    held = list(enumerate(shards))
    queries = ["moon", "tide tide ocean", "salt wind rain sand", "nothing here"]
    grouped = search_together(held, True, queries, 60)
    monkeypatch.setattr(joint, "JOINT_BM25_ROWS", 0)  # as a group too large for joint postings
    one_by_one = search_together(held, True, queries, 60)
    for name in ("rows", "shards", "doc_keys", "offsets"):
        assert getattr(grouped, name).tolist() == getattr(one_by_one, name).tolist()
    assert grouped.scores.tobytes() == one_by_one.scores.tobytes()


def test_joint_postings_hold_terms_that_only_some_shards_have(tmp_path):
    texts = ["zebra moon", "moon", "tide", "zebra zebra tide", "ocean", "moon tide", "lava", "ice moon"]
    chunks = [Chunk(f"c{d}", f"doc{d}", 0, text) for d, text in enumerate(texts)]
    vectors = np.eye(len(texts), DIM, dtype=np.float32)
    directory = IndexDirectory(tmp_path / "index")
    publish_shards(directory, chunks, vectors, load_settings().params().index,
                   {"name": "random", "provider": "test", "dim": DIM, "max_length": 64}, shards=3)
    loaded = directory.load().shards
    held = list(enumerate(loaded))
    assert {i for i, s in held if "zebra" in s.sparse.postings()[3]} != {i for i, _ in held}  # not in every shard
    queries = ["zebra", "zebra moon moon", "tide ocean", "unknown"]
    answer = search_together(held, True, queries, 5)
    same(answer, per_shard_merge(held, Ranker.BM25, queries, 5))
    assert sorted(key for _, _, key in answer.as_lists()[0]) == ["doc0", "doc3"]


def test_a_group_is_made_once_and_let_go_with_its_shards(shards, monkeypatch):
    made = []
    real = joint._Group
    monkeypatch.setattr(joint, "_Group", lambda live: made.append(len(live)) or real(live))
    group = [replace(s) for s in shards]  # new shard objects: a group of their own
    held = list(enumerate(group))
    first = search_together(held, True, ["moon tide"], 10)
    again = search_together(held, True, ["moon tide"], 10)
    assert made == [len(shards)] and again.rows.tolist() == first.rows.tolist()
    search_together(list(enumerate(group[::-1])), True, ["moon tide"], 10)  # the same shards as other ids
    assert made == [len(shards), len(shards)]
    ref = weakref.ref(group[-1])
    assert ref() in joint._GROUPS
    del group, held
    gc.collect()
    assert ref() is None


def test_a_pipeline_prepares_its_group_when_it_loads_not_on_the_first_query(shards, monkeypatch):
    made, built = [], []
    real_group, real_postings = joint._Group, joint._Group.postings
    monkeypatch.setattr(joint, "_Group", lambda live: made.append(len(live)) or real_group(live))
    monkeypatch.setattr(real_group, "postings", lambda self, live: built.append(1) or real_postings(self, live))
    pipeline = Pipeline([replace(s) for s in shards], None)
    assert made == [len(shards)] and len(built) == 1
    group = joint._GROUPS[pipeline.shards[0]][1]
    assert group._postings is not None  # made, not only asked for
    prefilter_made = joint._SHARED.get(pipeline.shards[0].dense) is not None
    assert prefilter_made == (len(group) >= prefilter.MIN_ROWS)
    hits = pipeline.search("moon tide", "bm25", 5)
    assert made == [len(shards)] and hits  # the query used the prepared group


def test_a_group_that_no_search_would_use_is_not_made(shards, monkeypatch):
    made = []
    monkeypatch.setattr(joint, "_Group", lambda live: made.append(len(live)))
    monkeypatch.setattr(joint, "JOINT_BM25_ROWS", 0)  # BM25 shard by shard
    monkeypatch.setattr(joint, "_shared_prefilter", lambda indexes: None)  # as for ANN indexes
    joint.prepare(list(enumerate(replace(s) for s in shards)))
    assert made == []


def test_a_lone_or_empty_shard_prepares_nothing(shards, monkeypatch):
    made = []
    monkeypatch.setattr(joint, "_Group", lambda live: made.append(len(live)))
    joint.prepare([(0, replace(shards[0])), (1, None)])
    joint.prepare([])
    assert made == []
