"""The retrieval plan's steps (retrieve/plan.py): what it asks, in which order."""

import numpy as np
import pytest

from llmframe_ray.retrieve.drive import DirectCalls, run_plan
from llmframe_ray.retrieve.candidates import ShardAnswer
from llmframe_ray.retrieve.plan import BM25, DENSE, Encode, FusionParams, ResultLevel, SearchShard, retrieval_plan
from llmframe_ray.types import SearchMode


def steps_of(plan):
    """Drive a plan with empty answers; each step as (request kind, ranker) names."""
    steps = []
    try:
        requests = next(plan)
        while True:
            steps.append([(type(r).__name__, getattr(getattr(r, "ranker", ""), "value", "")) for r in requests])
            answers = [
                np.ones((len(r.texts), 4), dtype=np.float32) if isinstance(r, Encode)
                else ShardAnswer.empty(len(r.inputs))
                for r in requests
            ]
            requests = plan.send(answers)
    except StopIteration:
        return steps


def test_in_process_the_first_bm25_searches_come_before_the_encoding_in_one_step():
    plan = retrieval_plan(["a", "b"], SearchMode.HYBRID, ResultLevel.DOCUMENT, 10, [5, 7], FusionParams())
    steps = steps_of(plan)
    assert steps[0] == [("SearchShard", BM25), ("SearchShard", BM25), ("Encode", "")]
    assert steps[1] == [("SearchShard", DENSE), ("SearchShard", DENSE)]
    assert len(steps) == 2  # empty answers: every list is exhausted, nothing to read


def test_with_vectors_given_both_rankers_search_in_the_first_step():
    vectors = np.ones((1, 4), dtype=np.float32)
    plan = retrieval_plan(["a"], SearchMode.HYBRID, ResultLevel.DOCUMENT, 10, [5], FusionParams(), vectors)
    assert steps_of(plan) == [[("SearchShard", BM25), ("SearchShard", DENSE)]]


def test_each_ranker_asks_the_same_k_in_its_first_round():
    plan = retrieval_plan(["a"], SearchMode.HYBRID, ResultLevel.DOCUMENT, 10, [1000], FusionParams(fusion_depth=50))
    first = next(plan)
    second = plan.send([ShardAnswer.empty(1), np.ones((1, 4), dtype=np.float32)])
    assert [r.k for r in first if isinstance(r, SearchShard)] == [100]
    assert [r.k for r in second] == [100]


@pytest.mark.parametrize("mode", ["bm25", "dense", "hybrid"])
def test_a_plan_over_empty_shards_ends_with_no_hits(mode):
    class Backend(DirectCalls):
        def encode(self, texts):
            return np.ones((len(texts), 4), dtype=np.float32)

    plan = retrieval_plan(["q"], SearchMode.from_str(mode), ResultLevel.DOCUMENT, 10, [0, 0], FusionParams())
    assert run_plan(plan, Backend()) == [[]]
