"""Contextual compression's selection and cutting (retrieve/compress.py), and the strategy
vocabulary (retrieve/strategy.py): exact choices on hand-made scores."""

from __future__ import annotations

import pickle
from dataclasses import replace

import numpy as np
import pytest

from llmframe_ray.retrieve.compress import (
    CompressionParams,
    Split,
    apply,
    combined,
    cosines,
    lexical_overlap,
    scoring_text,
    scores_sentences,
    select,
    sentence_scores,
    uses_cross_encoder,
    whole_passages,
)
from llmframe_ray.retrieve import evidence
from llmframe_ray.retrieve.strategy import GRAPH_MISSING, Strategy, StrategyError, alpha_weights, resolve
from llmframe_ray.types import Hit, SearchMode


def hit(doc: str, text: str, title: str = "") -> Hit:
    return Hit(doc_id=doc, chunk_id=f"{doc}#0", text=text, title=title, score=1.0, rank=1, ranks={"bm25": 1})


HITS = [
    hit("a", "Alpha one. Beta two is here. Gamma three. Delta.", title="T"),
    hit("b", "Zeta. Eta."),
]


def test_split_follows_the_chunkers_sentences_and_estimates_tokens():
    split = Split.of_hits(HITS)
    assert split.sentences == ["Alpha one.", "Beta two is here.", "Gamma three.", "Delta.", "Zeta.", "Eta."]
    assert split.owner == [0, 0, 0, 0, 1, 1]
    assert split.tokens == [3, 5, 3, 2, 2, 1]  # (characters + 3) // 4


def test_every_passage_keeps_its_best_sentence_then_quota_then_the_best_overall():
    split = Split.of_hits(HITS)
    scores = [0.1, 0.9, 0.2, 0.5, 0.3, 0.1]
    # best of each: Beta (5) + Zeta (2) = 7; quotas (half of 8 by length) fit nothing more; Delta (2) would
    # pass 8, Eta (1) fits
    assert select(split, scores, CompressionParams(budget_tokens=8)) == [False, True, False, False, True, True]
    assert select(split, scores, CompressionParams(budget_tokens=1)) == [False, True, False, False, True, False]
    # budget 16: passage a's quota (0.5 * 16 * 13 / 16 = 6.5) takes nothing past Beta; then, best first,
    # Delta, Gamma, Alpha and Eta all fit overall (7 + 2 + 3 + 3 + 1 = 16)
    assert select(split, scores, CompressionParams(budget_tokens=16)) == [True] * 6
    by_threshold = select(split, scores, CompressionParams(budget_tokens=None, threshold=0.4))
    assert by_threshold == [False, True, False, True, True, False]


def test_passages_the_reranker_rates_near_the_best_are_kept_whole_over_the_budget():
    split = Split.of_hits(HITS)
    scores = [0.1, 0.9, 0.2, 0.5, 0.3, 0.1]
    assert whole_passages([2.0, 1.2, -3.0], 1.0) == {0, 1}
    assert whole_passages([2.0, 1.2], 0.5) == {0}
    assert whole_passages([2.0, 1.2], None) == set() and whole_passages([], 1.0) == set()
    # passage b whole (3 tokens), then passage a's best, Beta (5): 8 spent, over the passage budget of 4
    params = CompressionParams(budget_tokens=100, passage_budget_tokens=4)
    assert select(split, scores, params, whole={1}) == [False, True, False, False, True, True]
    # passage a whole (13) and b's best, Zeta (2): the budget of 16 then has room for Eta (1)
    assert select(split, scores, CompressionParams(budget_tokens=16, passage_budget_tokens=16), whole={0}) == [True] * 6
    assert select(split, scores, CompressionParams(budget_tokens=15, passage_budget_tokens=15), whole={0}) == [True] * 5 + [False]


def test_the_passage_budget_applies_only_where_passages_are_kept_whole():
    params = CompressionParams(budget_tokens=750, passage_budget_tokens=550)
    assert params.budget(whole=True) == 550 and params.budget(whole=False) == 750
    assert params.with_budget(40).budget(whole=True) == 40  # a request's budget is the budget either way
    by_threshold = params.with_budget(None, threshold=0.2)  # a request's threshold without a budget
    assert by_threshold.threshold == 0.2 and by_threshold.budget(whole=True) is None
    assert CompressionParams(budget_tokens=750, passage_budget_tokens=None).budget(whole=True) == 750
    threshold_only = CompressionParams(budget_tokens=None, threshold=0.5, passage_budget_tokens=550)
    assert threshold_only.budget(whole=True) is None
    split = Split.of_hits(HITS)
    scores = [0.1, 0.9, 0.2, 0.5, 0.3, 0.1]
    # Beta, Zeta and Eta make 8 tokens: the budget of 8 takes nothing more; with passage b whole,
    # the passage budget of 10 also takes Delta (2), a's next best
    params = CompressionParams(budget_tokens=8, passage_budget_tokens=10)
    assert select(split, scores, params) == [False, True, False, False, True, True]
    assert select(split, scores, params, whole={1}) == [False, True, False, True, True, True]


def test_a_relative_threshold_keeps_what_scores_near_the_best_sentence_and_fills_no_budget():
    split = Split.of_hits(HITS)
    scores = [0.1, 0.9, 0.2, 0.5, 0.3, 0.1]
    params = CompressionParams(budget_tokens=100, relative=0.45)
    # within 0.45 of Beta (0.9): Delta (0.5); and Zeta, passage b's best; the budget of 100 takes nothing more
    assert select(split, scores, params, relative=True) == [False, True, False, True, True, False]
    # without a reranker's passage scores (relative=False) the budget rule applies as before
    assert select(split, scores, params) == [True] * 6
    # a request's budget (or threshold) replaces the relative rule
    assert params.with_budget(8).relative is None
    assert select(split, scores, params.with_budget(8), relative=True) == [False, True, False, False, True, True]
    # a configured threshold still keeps what reaches it
    with_threshold = CompressionParams(budget_tokens=100, relative=0.1, threshold=0.15)
    assert select(split, scores, with_threshold, relative=True) == [False, True, True, True, True, False]


def test_under_the_relative_rule_a_passage_far_below_the_best_sentence_keeps_nothing_and_leaves_the_list():
    split = Split.of_hits(HITS)
    scores = [0.1, 0.9, 0.2, 0.5, 0.3, 0.1]
    params = CompressionParams(budget_tokens=100, relative=0.45, passage_drop=0.2)
    # the relative cut is 0.45; passage b's best (Zeta, 0.3) is 0.15 under it: kept at a drop of
    # 0.2, dropped at 0.1 (and at 0: a passage must then reach the cut)
    assert select(split, scores, params, relative=True) == [False, True, False, True, True, False]
    dropped = select(split, scores, replace(params, passage_drop=0.1), relative=True)
    assert dropped == [False, True, False, True, False, False]
    assert select(split, scores, replace(params, passage_drop=0.0), relative=True) == dropped
    assert select(split, [0.1, 0.9, 0.2, 0.5, 0.6, 0.1], replace(params, passage_drop=0.0), relative=True) == [
        False, True, False, True, True, False]
    kept = apply(HITS, split, dropped)
    assert [(h.doc_id, h.text) for h in kept] == [("a", "... Beta two is here. ... Delta.")]
    # what reaches a configured threshold stays; the drop applies under the relative rule only
    assert select(split, scores, replace(params, passage_drop=0.1, threshold=0.3), relative=True) == [
        False, True, False, True, True, False]
    assert select(split, scores, replace(params, passage_drop=0.0)) == [True] * 6


def test_under_the_relative_rule_a_question_that_keeps_little_is_topped_up_to_the_floor_share():
    # passages 0 and 1 reach the cut (4.0) with one sentence each: 20 of the 100 tokens kept;
    # passage 2's best (-3.0) is under the drop's floor (3.0): it keeps nothing, floor or not
    split = Split(sentences=[f"s{i}" for i in range(7)], owner=[0, 0, 0, 1, 1, 2, 2], tokens=[10, 30, 10, 10, 10, 15, 15])
    scores = [5.0, 1.0, 0.8, 4.5, 0.5, -3.0, -3.5]
    params = CompressionParams(budget_tokens=100, relative=1.0, passage_drop=1.0, floor_share=None)
    alone = [True, False, False, True, False, False, False]
    assert select(split, scores, params, relative=True) == alone
    assert select(split, scores, replace(params, floor_share=0.0), relative=True) == alone
    assert select(split, scores, replace(params, floor_share=0.15), relative=True) == alone  # already over it
    # up to 35 tokens, best first: s1 (30 more) would pass it and is skipped, s2 (10) fits, s4 would pass it
    assert select(split, scores, replace(params, floor_share=0.35), relative=True) == [
        True, False, True, True, False, False, False]
    # up to 60: s1 and s2 reach it exactly, and nothing more is added
    assert select(split, scores, replace(params, floor_share=0.6), relative=True) == [
        True, True, True, True, False, False, False]
    # the whole share: every sentence of the passages that keep any, none of the dropped one
    assert select(split, scores, replace(params, floor_share=1.0), relative=True) == [True] * 5 + [False] * 2
    # the budget rule fills its budget and has no floor
    budget = replace(params, budget_tokens=25, relative=None)
    assert select(split, scores, replace(budget, floor_share=1.0)) == select(split, scores, budget)
    assert CompressionParams().floor_share == 0.2


def test_with_the_evidence_rule_the_sentences_likely_enough_are_kept_and_passages_with_none_leave():
    split = Split(sentences=[f"s{i}" for i in range(6)], owner=[0, 0, 1, 1, 2, 2], tokens=[10] * 6)
    probs = [0.9, 0.01, 0.3, 0.2, 0.05, 0.04]
    params = CompressionParams(budget_tokens=10, evidence=0.25)
    assert select(split, probs, params, evidence=True) == [True, False, True, False, False, False]
    assert select(split, probs, replace(params, evidence=0.1), evidence=True) == [True, False, True, True, False, False]
    # none likely enough: the question's best sentence alone
    assert select(split, probs, replace(params, evidence=0.95), evidence=True) == [True] + [False] * 5
    assert select(Split.of([]), [], params, evidence=True) == []  # no hits: nothing to keep, no error
    assert select(split, probs, params, whole={2}, evidence=True) == [True, False, True, False, False, False]  # none whole
    # passage 2 kept nothing: its hit leaves the compressed list
    hits = [hit(d, "x") for d in "abc"]
    assert [h.doc_id for h in apply(hits, split, select(split, probs, params, evidence=True))] == ["a", "b"]
    # without the rule (a request's budget) the budget is filled, each passage keeping its best
    assert params.with_budget(10).evidence is None
    assert select(split, probs, params.with_budget(10)) == [True, False, True, False, True, False]


def test_under_the_evidence_rule_each_scorer_reads_its_own_evidence_model():
    scores, overlap, owner, passages = [0.6, 0.1, 0.3], [0.5, 0.0, 0.0], [0, 0, 1], [2.0, 1.0]
    got, rule = sentence_scores(scores, overlap, CompressionParams(), owner)
    assert rule and got == pytest.approx(evidence.probabilities(scores, overlap, owner, evidence.EMBEDDER))
    got, rule = sentence_scores(scores, overlap, CompressionParams(), owner, cross_encoder=True, passage_scores=passages)
    assert rule and got == pytest.approx(evidence.probabilities(scores, overlap, owner, evidence.CROSS_ENCODER))
    assert evidence.EMBEDDER != evidence.CROSS_ENCODER
    assert sentence_scores([], [], CompressionParams(), []) == ([], True)
    # without the rule: combined scores, the passage scores read beside a cross-encoder's only
    params = CompressionParams(evidence=None, lexical=0.0, passage=0.0)
    assert sentence_scores(scores, overlap, params, owner, False, passages) == (combined(scores, overlap, params, owner), False)
    assert sentence_scores(scores, overlap, params, owner, True, passages) == (
        combined(scores, overlap, params, owner, passages), False)


def test_auto_scores_sentences_with_the_cross_encoder_only_where_it_was_trained_on_sentences():
    rationale, passages = {"data": {"rationale_groups": 935}}, {"data": {"groups": 828}}
    auto = CompressionParams()
    assert uses_cross_encoder(auto, True, rationale)
    assert not uses_cross_encoder(auto, True, passages) and not uses_cross_encoder(auto, True, None)  # the embedder's rule
    assert uses_cross_encoder(CompressionParams(evidence=None), True, passages)  # that rule off: the reranker's scores
    assert not uses_cross_encoder(auto, False, {}) and not uses_cross_encoder(auto, True, {})  # no reranker; no card data
    assert uses_cross_encoder(CompressionParams(relative=4.5), True, passages)  # a relative threshold: the reranker's scores
    assert uses_cross_encoder(auto.with_budget(300), True, passages)  # a request's budget: as before the evidence rule
    assert uses_cross_encoder(CompressionParams(scorer="cross-encoder"), True, passages)
    assert uses_cross_encoder(CompressionParams(scorer="cross-encoder"), False, {})  # asked for: the stage says it is missing
    assert not uses_cross_encoder(CompressionParams(scorer="embedder"), True, rationale)
    assert uses_cross_encoder(CompressionParams(scorer="llm"), True, rationale)  # its offline fallback
    assert not uses_cross_encoder(CompressionParams(scorer="llm"), True, passages)


def test_the_passage_prior_lowers_sentences_of_passages_the_reranker_rates_below_the_best():
    params = CompressionParams(lexical=0.0, passage=0.0, passage_prior=0.5)
    # passage 1 scores 2.0 below passage 0: its sentences lose 0.5 x 2.0
    assert combined([0.5, 0.4, 0.9], [0.0] * 3, params, [0, 0, 1], [3.0, 1.0]) == pytest.approx([0.5, 0.4, -0.1])
    assert combined([0.5, 0.4, 0.9], [0.0] * 3, params, [0, 0, 1], []) == pytest.approx([0.5, 0.4, 0.9])  # no reranker
    assert combined([0.5, 0.4, 0.9], [0.0] * 3, replace(params, passage_prior=0.0), [0, 0, 1], [3.0, 1.0]) == pytest.approx([0.5, 0.4, 0.9])


def test_a_reranker_trained_on_rationale_sentences_switches_to_its_evidence_rule_or_the_relative_rule():
    sentences_card = {"data": {"dataset": "scifact", "rationale_groups": 935}}
    assert scores_sentences(sentences_card) and not scores_sentences({"data": {"groups": 9}}) and not scores_sentences({})
    params = CompressionParams()
    rule = lambda p: (p.evidence, p.relative, p.passage_margin)
    assert (params.relative, params.rationale_relative, params.rationale_evidence, params.passage_margin) == (None, 6.25, 0.002, 1.0)
    assert rule(params) == (0.0068, None, 1.0)  # the offline scorer's
    assert params.for_reranker({"data": {}}) == replace(params, evidence=None)  # the budget, never the embedder's rule
    assert rule(params.for_reranker(sentences_card)) == (0.002, None, None)
    assert rule(CompressionParams(relative=2.0).for_reranker(sentences_card)) == (None, 2.0, 1.0)  # a set one stays
    switched = CompressionParams(rationale_evidence=None).for_reranker(sentences_card)
    assert rule(switched) == (None, 6.25, None)
    assert rule(CompressionParams(rationale_evidence=None, rationale_relative=None).for_reranker(sentences_card)) == (None, None, 1.0)
    # under the relative rule a sentence is scored on its own (with the prior), not its passage's best
    ruled = replace(switched, lexical=0.0)
    assert combined([2.0, 1.0, 0.5], [0.0] * 3, ruled, [0, 0, 1], [1.0, 0.0]) == pytest.approx([2.0, 1.0, -0.5])
    assert combined([2.0, 1.0, 0.5], [0.0] * 3, replace(params, lexical=0.0), [0, 0, 1], [1.0, 0.0]) == pytest.approx([4.0, 3.0, -1.0])


def test_apply_marks_cuts_and_keeps_ids():
    split = Split.of_hits(HITS)
    kept = apply(HITS, split, [False, True, False, True, True, False])
    assert [h.text for h in kept] == ["... Beta two is here. ... Delta.", "Zeta. ..."]
    assert [(h.doc_id, h.chunk_id, h.title, h.rank) for h in kept] == [(h.doc_id, h.chunk_id, h.title, h.rank) for h in HITS]
    assert [h.text for h in apply(HITS, split, [True] * 6)] == [h.text for h in HITS]


def test_scores_combine_model_and_lexical_overlap():
    assert lexical_overlap("vitamin D fractures", ["Fracture rates fell with vitamin D.", "No effect."]) == [1.0, 0.0]
    assert lexical_overlap("the of", ["anything"]) == [0.0]  # no content words: no overlap
    q = np.array([1.0, 0.0], dtype=np.float32)
    assert cosines(q, [np.array([0.6, 0.8], dtype=np.float32), None]) == pytest.approx([0.6, 0.0])
    assert combined([0.5, 0.1], [1.0, 0.0], CompressionParams(lexical=0.3)) == pytest.approx([0.8, 0.1])
    assert scoring_text("Title", "x" * 2000) == "Title\n" + "x" * 994


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"budget_tokens": None}, "compression needs a token budget or a score threshold"),
    ({"budget_tokens": 0}, "budget_tokens must be at least 1, got 0"),
    ({"quota": 1.5}, "quota must be within [0, 1], got 1.5"),
    ({"passage_margin": -0.5}, "passage_margin must be at least 0, got -0.5"),
    ({"passage_budget_tokens": 0}, "passage_budget_tokens must be at least 1, got 0"),
    ({"relative": -1.0}, "relative must be at least 0, got -1.0"),
    ({"passage_prior": -0.5}, "passage_prior must be at least 0, got -0.5"),
    ({"passage_drop": -1.0}, "passage_drop must be at least 0, got -1.0"),
    ({"floor_share": 1.5}, "floor_share must be within [0, 1], got 1.5"),
    ({"evidence": 0.0}, "evidence must be within (0, 1), got 0.0"),
    ({"evidence": 1.0}, "evidence must be within (0, 1), got 1.0"),
    ({"rationale_evidence": -0.1}, "rationale_evidence must be within (0, 1), got -0.1"),
    ({"scorer": "bm25"}, "unknown compression scorer 'bm25'; valid compression scorers: auto, embedder, cross-encoder, llm"),
])
def test_bad_compression_params(kwargs, message):
    with pytest.raises(ValueError) as raised:
        CompressionParams(**kwargs)
    assert str(raised.value) == message


def test_strategies_resolve_to_modes():
    assert resolve(None, None, SearchMode.HYBRID) == resolve("hybrid", None, SearchMode.DENSE)
    assert resolve("sparse", "bm25", SearchMode.HYBRID).mode is SearchMode.BM25
    plan = resolve("compressed", None, SearchMode.DENSE)
    assert (plan.strategy, plan.mode, plan.compress) == (Strategy.COMPRESSED, SearchMode.HYBRID, True)
    assert resolve(None, "dense", SearchMode.HYBRID).strategy is Strategy.DENSE
    assert resolve("graph", None, SearchMode.HYBRID).mode is SearchMode.GRAPH  # refused later without a graph
    assert resolve("hybrid-graph", None, SearchMode.DENSE) == resolve(None, "hybrid-graph", SearchMode.DENSE)
    assert resolve(None, "hybrid-graph", SearchMode.DENSE).strategy is Strategy.HYBRID_GRAPH
    error = pickle.loads(pickle.dumps(StrategyError("retrieval_strategy", GRAPH_MISSING)))  # as a replica raises it
    assert (type(error), error.field, str(error)) == (StrategyError, "retrieval_strategy", GRAPH_MISSING)
    with pytest.raises(StrategyError) as raised:
        resolve("dense", "hybrid", SearchMode.HYBRID)
    assert raised.value.field == "mode"


def test_alpha_maps_to_rrf_weights():
    assert alpha_weights(0.5) == {"dense": 1.0, "bm25": 1.0}
    assert alpha_weights(0.75) == {"dense": 1.5, "bm25": 0.5}
    assert alpha_weights(0) == {"dense": 0.0, "bm25": 2.0}
    for bad in (-0.1, 1.01, True):
        with pytest.raises(StrategyError, match="alpha|must be a number"):
            alpha_weights(bad)
