"""The array form of shard merging (retrieve/candidates.py) and the compiled RRF
(retrieve/compiled.py) against the reference implementations: the tuple sort they replaced and
fusion.reciprocal_rank_fusion."""

import random

import numpy as np
import pytest

from llmframe_ray.retrieve.candidates import ShardAnswer, concat_keys, dense_codes, first_occurrences, merge_shards
from llmframe_ray.retrieve.compiled import fuse_chunks, fuse_documents
from llmframe_ray.retrieve.fusion import reciprocal_rank_fusion
from llmframe_ray.types import RankedList


def test_merge_orders_by_score_then_document_then_row_across_shards():
    per_shard = {
        0: (np.array([4, 9]), np.array([0.5, 0.25], dtype=np.float32), np.array(["b", "c"])),
        1: (np.array([2, 1]), np.array([0.5, 0.5], dtype=np.float32), np.array(["a", "b"])),
    }
    merged = merge_shards("bm25", per_shard, limit=3)
    assert list(zip(merged.shards.tolist(), merged.rows.tolist(), merged.doc_keys.tolist())) == [
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
        got = list(zip((-merged.scores).tolist(), merged.doc_keys.tolist(), merged.rows.tolist(), merged.shards.tolist()))
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
        got = list(zip((-merged.scores).tolist(), merged.doc_keys.tolist(), merged.rows.tolist(), merged.shards.tolist()))
        assert got == expected
        assert merged.rows.dtype == np.int64 and merged.scores.dtype == np.float64


@pytest.mark.parametrize("seed", range(10))
def test_dense_codes_and_first_occurrences_agree_with_np_unique(seed):
    rng = random.Random(seed)
    n = rng.randrange(0, 60)
    for values in (
        np.array([f"doc-{rng.randrange(15)}" for _ in range(n)], dtype=np.str_),
        np.array([rng.randrange(15) for _ in range(n)], dtype=np.int64),
        # int64 keys anywhere in range (the compiled path hashes them)
        np.array([rng.choice([-(2**63), -7, 0, 2**40 + 3, 2**63 - 1, rng.randrange(-(2**62), 2**62)]) for _ in range(n)], dtype=np.int64),
    ):
        distinct, first, inverse = np.unique(values, return_index=True, return_inverse=True)
        codes, firsts = dense_codes(values)
        assert codes.tolist() == inverse.tolist()
        assert firsts.tolist() == first.tolist()
        assert first_occurrences(values).tolist() == sorted(first.tolist())


def random_lists(rng):
    """Ranked chunk lists over a few documents, each document in one shard, rows in document
    order within a shard (as an index stores them); chunk keys as strings that sort like
    (document, row, shard)."""
    n_docs = rng.randrange(1, 25)
    shard_of = [rng.randrange(3) for _ in range(n_docs)]
    chunks, next_row = [], [0, 0, 0]
    for doc in range(n_docs):
        for _ in range(rng.randrange(1, 4)):
            chunks.append((doc, next_row[shard_of[doc]], shard_of[doc]))
            next_row[shard_of[doc]] += 1
    lists = [rng.sample(chunks, rng.randrange(0, len(chunks) + 1)) for _ in range(rng.randrange(2, 4))]
    weights = [rng.choice([0.5, 1.0, 2.0]) for _ in lists]
    return lists, weights, rng.choice([0, 20, 60])


def as_arrays(lists):
    flat = [chunk for chunks in lists for chunk in chunks]
    docs, rows, shards = (np.array([c[i] for c in flat], dtype=np.int64) for i in range(3))
    bounds = np.cumsum([0, *(len(chunks) for chunks in lists)], dtype=np.int64)
    return docs, rows, shards, bounds


def chunk_key(chunk):
    return f"{chunk[0]:03d}|{chunk[1]:03d}|{chunk[2]}"


def ranked(names, keys):
    return [RankedList(name, k, [1.0] * len(k)) for name, k in zip(names, keys)]


@pytest.mark.parametrize("seed", range(40))
def test_fuse_chunks_equals_reciprocal_rank_fusion(seed):
    rng = random.Random(seed)
    lists, weights, k = random_lists(rng)
    depth, limit = rng.choice([1, 3, 8, 100]), rng.choice([1, 5, 10, 100])
    names = [f"r{i}" for i in range(len(lists))]
    reference = reciprocal_rank_fusion(
        ranked(names, [[chunk_key(c) for c in chunks[:depth]] for chunks in lists]), k=k, weights=weights, limit=limit
    )
    docs, rows, shards, bounds = as_arrays(lists)
    where, scores, ranks = fuse_chunks(docs, rows, shards, bounds, np.array(weights), k, depth, limit)
    assert [chunk_key((docs[p], rows[p], shards[p])) for p in where.tolist()] == [item.key for item in reference]
    assert scores.tolist() == [item.score for item in reference]  # the same sums, bit for bit
    got_ranks = [{name: r for name, r in zip(names, column) if r > 0} for column in ranks.T.tolist()]
    assert got_ranks == [dict(item.ranks) for item in reference]


@pytest.mark.parametrize("seed", range(40))
def test_fuse_documents_equals_two_reference_fusions(seed):
    # Documents: RRF over each list's first `depth` distinct documents. Each is represented by
    # its first chunk in the RRF of the whole chunk lists.
    rng = random.Random(seed)
    lists, weights, k = random_lists(rng)
    depth, limit = rng.choice([1, 3, 8, 100]), rng.choice([1, 5, 10, 100])
    names = [f"r{i}" for i in range(len(lists))]
    doc_lists = [list(dict.fromkeys(f"{c[0]:03d}" for c in chunks))[:depth] for chunks in lists]
    reference = reciprocal_rank_fusion(ranked(names, doc_lists), k=k, weights=weights, limit=limit)
    chunk_order = reciprocal_rank_fusion(ranked(names, [[chunk_key(c) for c in chunks] for chunks in lists]), k=k, weights=weights)
    best_chunk = {}
    for item in chunk_order:
        best_chunk.setdefault(item.key[:3], item.key)
    docs, rows, shards, bounds = as_arrays(lists)
    where, scores, ranks = fuse_documents(docs, rows, shards, bounds, np.array(weights), k, depth, limit)
    assert [chunk_key((docs[p], rows[p], shards[p])) for p in where.tolist()] == [best_chunk[item.key] for item in reference]
    assert scores.tolist() == [item.score for item in reference]
    got_ranks = [{name: r for name, r in zip(names, column) if r > 0} for column in ranks.T.tolist()]
    assert got_ranks == [dict(item.ranks) for item in reference]


def test_fusion_of_empty_lists_is_empty():
    empty = np.zeros(0, dtype=np.int64)
    for fuse in (fuse_chunks, fuse_documents):
        where, scores, ranks = fuse(empty, empty, empty, np.zeros(3, dtype=np.int64), np.ones(2), 60, 10, 10)
        assert (where.tolist(), scores.tolist(), ranks.shape) == ([], [], (2, 0))


def test_concat_keys_never_turns_integer_keys_into_strings():
    ints = np.array([10, 9], dtype=np.int64)
    # numpy alone would give ['10', '9'] here, which sorts 10 before 9
    assert concat_keys([ints, np.array([], dtype=np.str_)]).tolist() == [10, 9]
    assert concat_keys([]).dtype == np.int64
    with pytest.raises(TypeError, match=r"document keys of different kinds cannot be ranked together: \['<U1', 'int64'\]"):
        concat_keys([ints, np.array(["a"])])


def test_shard_answer_slices_each_query_and_empty():
    answer = ShardAnswer.of(
        [(np.array([3, 1]), np.array([0.9, 0.8])), (np.zeros(0, dtype=np.int64), np.zeros(0))],
        lambda rows: np.array([f"doc{r}" for r in rows.tolist()]),
    )
    assert answer.as_lists() == [[(3, pytest.approx(0.9), "doc3"), (1, pytest.approx(0.8), "doc1")], []]
    assert (answer.count(0), answer.count(1), len(answer)) == (2, 0, 2)
    assert ShardAnswer.empty(3).as_lists() == [[], [], []]
