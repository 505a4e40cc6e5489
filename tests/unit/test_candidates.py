"""The array form of shard merging and RRF (retrieve/candidates.py) against the reference
implementations: the tuple sort it replaced and fusion.reciprocal_rank_fusion."""

import random

import numpy as np
import pytest

from llmframe_ray.retrieve.candidates import (
    ShardAnswer,
    chunk_codes,
    dense_codes,
    first_occurrences,
    fuse_codes,
    merge_shards,
    split,
)
from llmframe_ray.retrieve.fusion import reciprocal_rank_fusion
from llmframe_ray.types import RankedList


def test_merge_orders_by_score_then_document_then_row_across_shards():
    per_shard = {
        0: (np.array([4, 9]), np.array([0.5, 0.25], dtype=np.float32), np.array(["b", "c"])),
        1: (np.array([2, 1]), np.array([0.5, 0.5], dtype=np.float32), np.array(["a", "b"])),
    }
    merged = merge_shards("bm25", per_shard, limit=3)
    assert list(zip(merged.shards.tolist(), merged.rows.tolist(), merged.doc_ids.tolist())) == [
        (1, 2, "a"), (1, 1, "b"), (0, 4, "b"),
    ]
    assert merged.scores.tolist() == [0.5, 0.5, 0.5]
    assert merged.first_per_document().tolist() == [0, 1]  # b's best chunk is row 1 of shard 1


def test_merge_matches_the_tuple_sort_on_random_ties():
    rng = random.Random(7)
    for _ in range(50):
        per_shard, tuples = {}, []
        for shard in range(3):
            n = rng.randrange(0, 12)
            rows = np.array(rng.sample(range(100), n), dtype=np.int64)
            scores = np.array([rng.choice([0.25, 0.5, 0.75]) for _ in range(n)], dtype=np.float32)
            docs = np.array([f"d{rng.randrange(6)}-{shard}" for _ in range(n)], dtype=np.str_)
            per_shard[shard] = (rows, scores, docs)
            tuples += [(-float(s), str(d), int(r), shard) for r, s, d in zip(rows, scores, docs)]
        merged = merge_shards("dense", per_shard, limit=15)
        expected = sorted(tuples)[:15]
        got = list(zip((-merged.scores).tolist(), merged.doc_ids.tolist(), merged.rows.tolist(), merged.shards.tolist()))
        assert got == expected


def test_one_shard_keeps_its_order_which_is_the_tuple_sort():
    # A shard answers best first with ties by row, and its rows are in document id order.
    rng = random.Random(3)
    for _ in range(50):
        n = rng.randrange(0, 30)
        rows = np.array(sorted(rng.sample(range(200), n)), dtype=np.int64)
        docs = np.array([f"d{r // 7:03d}" for r in rows.tolist()], dtype=np.str_)
        scores = np.array([rng.choice([0.25, 0.5, 0.75]) for _ in range(n)], dtype=np.float32)
        order = np.lexsort((rows, -scores))
        merged = merge_shards("bm25", {2: (rows[order], scores[order], docs[order])}, limit=12)
        expected = sorted((-float(s), str(d), int(r), 2) for r, s, d in zip(rows, scores, docs))[:12]
        got = list(zip((-merged.scores).tolist(), merged.doc_ids.tolist(), merged.rows.tolist(), merged.shards.tolist()))
        assert got == expected
        assert merged.rows.dtype == np.int64 and merged.scores.dtype == np.float64


@pytest.mark.parametrize("seed", range(10))
def test_dense_codes_and_first_occurrences_agree_with_np_unique(seed):
    rng = random.Random(seed)
    n = rng.randrange(0, 60)
    for values in (
        np.array([f"doc-{rng.randrange(15)}" for _ in range(n)], dtype=np.str_),
        np.array([rng.randrange(15) for _ in range(n)], dtype=np.int64),
    ):
        distinct, first, inverse = np.unique(values, return_index=True, return_inverse=True)
        codes, firsts = dense_codes(values)
        assert codes.tolist() == inverse.tolist()
        assert firsts.tolist() == first.tolist()
        assert first_occurrences(values).tolist() == sorted(first.tolist())


@pytest.mark.parametrize("seed", range(20))
def test_fuse_codes_equals_reciprocal_rank_fusion(seed):
    rng = random.Random(seed)
    universe = [f"k{i:03d}" for i in range(rng.randrange(1, 40))]
    lists = [rng.sample(universe, rng.randrange(0, len(universe) + 1)) for _ in range(rng.randrange(1, 4))]
    weights = [rng.choice([0.5, 1.0, 2.0]) for _ in lists]
    k = rng.choice([0, 20, 60])
    reference = reciprocal_rank_fusion(
        [RankedList(f"r{i}", keys, [1.0] * len(keys)) for i, keys in enumerate(lists)], k=k, weights=weights, limit=10
    )
    joined = np.concatenate([np.array(keys, dtype=np.str_) for keys in lists])
    all_codes, first = dense_codes(joined)
    codes, distinct = split(all_codes, [len(keys) for keys in lists]), joined[first]
    fused = fuse_codes(codes, weights, k, len(distinct), limit=10)
    assert distinct[fused.codes].tolist() == [item.key for item in reference]
    assert fused.scores.tolist() == [item.score for item in reference]  # the same sums, bit for bit
    ranks = [{f"r{i}": int(r) for i, r in enumerate(column) if r > 0} for column in fused.ranks.T.tolist()]
    assert ranks == [dict(item.ranks) for item in reference]


def test_chunk_codes_follow_document_row_shard_order():
    parts = [
        (np.array(["b", "a"]), np.array([3, 7]), np.array([0, 1])),
        (np.array(["a", "b"]), np.array([7, 2]), np.array([1, 0])),
    ]
    codes, representative = chunk_codes(parts)
    # distinct chunks in key order: (a, 7, 1), (b, 2, 0), (b, 3, 0)
    assert [c.tolist() for c in codes] == [[2, 0], [0, 1]]
    assert representative.tolist() == [1, 3, 0]  # positions in the concatenated parts


def test_shard_answer_slices_each_query_and_empty():
    answer = ShardAnswer.of(
        [(np.array([3, 1]), np.array([0.9, 0.8])), (np.zeros(0, dtype=np.int64), np.zeros(0))],
        lambda rows: np.array([f"doc{r}" for r in rows.tolist()]),
    )
    assert answer.as_lists() == [[(3, pytest.approx(0.9), "doc3"), (1, pytest.approx(0.8), "doc1")], []]
    assert (answer.count(0), answer.count(1), len(answer)) == (2, 0, 2)
    assert ShardAnswer.empty(3).as_lists() == [[], [], []]
