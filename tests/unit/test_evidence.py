"""The offline compression scorer's evidence model (retrieve/evidence.py): its features, its
probabilities and its fit, on hand-made numbers."""

from __future__ import annotations

import math

import numpy as np
import pytest

from llmframe_ray.retrieve import evidence


def test_features_place_each_sentence_against_the_questions_best_and_its_passages():
    # passage 0 holds sentences 0-1 (best 0.5), passage 1 sentence 2 (0.4), passage 3 sentence 3
    rows = evidence.features([0.5, 0.2, 0.4, 0.1], [1.0, 0.0, 0.5, 0.25], [0, 0, 1, 3])
    assert rows == pytest.approx(np.array([
        [0.5, 0.0, 0.0, 1.0, 0.0],
        [0.2, -0.3, 0.0, 0.0, 0.0],
        [0.4, -0.1, -0.1, 0.5, math.log(2)],
        [0.1, -0.4, -0.4, 0.25, math.log(4)],
    ]))
    assert evidence.features([], [], []).shape == (0, len(evidence.FEATURES))


def test_probabilities_are_the_logistic_of_the_weighted_features():
    cos, overlap, owner = [0.5, 0.2], [1.0, 0.0], [0, 1]
    # only the overlap, weight 2, bias -1: sigmoid(1) and sigmoid(-1)
    assert evidence.probabilities(cos, overlap, owner, evidence.Model((0, 0, 0, 2.0, 0), -1.0)) == pytest.approx(
        [1 / (1 + math.exp(-1)), 1 / (1 + math.exp(1))])
    # the passage's distance from the best (-0.3 for passage 1) and its rank (log 2)
    assert evidence.probabilities(cos, overlap, owner, evidence.Model((0, 0, 10.0, 0, -1.0), 0.0)) == pytest.approx(
        [0.5, 1 / (1 + math.exp(3 + math.log(2)))])
    for model in (evidence.EMBEDDER, evidence.CROSS_ENCODER):  # the fitted models: a higher score is likelier evidence
        shipped = evidence.probabilities([0.6, 0.3], [0.5, 0.5], [0, 0], model)
        assert shipped[0] > shipped[1]


def test_fit_recovers_the_weights_that_drew_the_labels():
    rng = np.random.default_rng(7)
    x = rng.normal(size=(40_000, 2)) * [1.0, 3.0] + [0.5, -1.0]
    y = rng.random(len(x)) < 1 / (1 + np.exp(-(1.5 * x[:, 0] - 0.4 * x[:, 1] - 2.0)))
    model = evidence.fit(x, y)
    assert model.weights == pytest.approx((1.5, -0.4), abs=0.06) and model.bias == pytest.approx(-2.0, abs=0.08)
    with pytest.raises(ValueError) as raised:
        evidence.fit(x, np.zeros(len(x)))
    assert str(raised.value) == "fitting the evidence model needs rows of both labels"
