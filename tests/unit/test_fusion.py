import pytest

from llmframe_ray.retrieve.fusion import reciprocal_rank_fusion
from llmframe_ray.types import RankedList


def ranked(name, keys):
    return RankedList(name, tuple(keys), tuple(float(len(keys) - i) for i in range(len(keys))))


def test_rrf_order_and_scores_match_hand_computation():
    bm25 = ranked("bm25", ["a", "b", "c"])
    dense = ranked("dense", ["b", "d", "a"])
    fused = reciprocal_rank_fusion([bm25, dense], k=60)
    assert [f.key for f in fused] == ["b", "a", "d", "c"]
    assert [f.score for f in fused] == [
        1 / 62 + 1 / 61,  # b: bm25 #2, dense #1
        1 / 61 + 1 / 63,  # a: bm25 #1, dense #3
        1 / 62,  # d: dense #2
        1 / 63,  # c: bm25 #3
    ]
    assert [dict(f.ranks) for f in fused] == [
        {"bm25": 2, "dense": 1},
        {"bm25": 1, "dense": 3},
        {"dense": 2},
        {"bm25": 3},
    ]


def test_hit_found_by_only_one_ranker_survives():
    bm25 = ranked("bm25", ["only-bm25", "shared"])
    dense = ranked("dense", ["shared", "other"])
    fused = reciprocal_rank_fusion([bm25, dense])
    assert [f.key for f in fused] == ["shared", "only-bm25", "other"]
    assert dict(fused[1].ranks) == {"bm25": 1}
    assert fused[1].score == 1 / 61


def test_ties_broken_by_best_rank_then_key():
    # k=0: a = 1/2 + 1/2 = 1.0, b = 1/1, c = 1/1 -> equal scores.
    fused = reciprocal_rank_fusion([ranked("x", ["b", "a"]), ranked("y", ["c", "a"])], k=0)
    assert [f.score for f in fused] == [1.0, 1.0, 1.0]
    assert [f.key for f in fused] == ["b", "c", "a"]


def test_equal_scores_same_best_rank_order_by_key_regardless_of_list_order():
    first = reciprocal_rank_fusion([ranked("x", ["q", "p"]), ranked("y", ["p", "q"])])
    second = reciprocal_rank_fusion([ranked("y", ["p", "q"]), ranked("x", ["q", "p"])])
    assert [f.key for f in first] == [f.key for f in second] == ["p", "q"]


def test_weights_by_name_and_by_position():
    bm25 = ranked("bm25", ["a", "b"])
    dense = ranked("dense", ["b", "a"])
    by_name = reciprocal_rank_fusion([bm25, dense], k=10, weights={"dense": 2.0})
    assert [f.key for f in by_name] == ["b", "a"]
    assert by_name[0].score == 1 / 12 + 2 / 11
    by_position = reciprocal_rank_fusion([bm25, dense], k=10, weights=[3.0, 1.0])
    assert [f.key for f in by_position] == ["a", "b"]
    assert by_position[0].score == 3 / 11 + 1 / 12


def test_any_number_of_lists_and_limit():
    lists = [ranked(f"r{i}", ["x", "y", "z"][i:] + ["x", "y", "z"][:i]) for i in range(3)]
    fused = reciprocal_rank_fusion(lists, limit=2)
    assert len(fused) == 2
    # every key has ranks 1, 2 and 3 once: equal scores, best rank 1 each -> key order
    assert [f.key for f in fused] == ["x", "y"]


def test_empty_inputs():
    assert reciprocal_rank_fusion([]) == []
    assert reciprocal_rank_fusion([ranked("bm25", [])]) == []


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"k": -1}, "RRF k must be >= 0, got -1"),
        ({"weights": [1.0]}, "got 1 weights for 2 ranked lists"),
        ({"weights": {"sparse": 1.0}}, "weights given for unknown ranked lists: ['sparse']"),
        ({"weights": [1.0, -0.5]}, "RRF weights must be >= 0, got [-0.5]"),
    ],
)
def test_invalid_arguments(kwargs, message):
    lists = [ranked("bm25", ["a"]), ranked("dense", ["a"])]
    with pytest.raises(ValueError) as err:
        reciprocal_rank_fusion(lists, **kwargs)
    assert str(err.value) == message


def test_duplicate_list_names_rejected():
    with pytest.raises(ValueError, match="distinct names"):
        reciprocal_rank_fusion([ranked("bm25", ["a"]), ranked("bm25", ["b"])])


def test_ranked_list_rejects_duplicates_and_length_mismatch():
    with pytest.raises(ValueError, match="contains a key more than once"):
        RankedList("bm25", ("a", "a"), (1.0, 0.5))
    with pytest.raises(ValueError, match="has 2 keys but 1 scores"):
        RankedList("bm25", ("a", "b"), (1.0,))
