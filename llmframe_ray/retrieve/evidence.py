"""The offline compression scorer's evidence model: how likely a sentence of a retrieved passage is
evidence for the question, from the query encoder's cosines and nothing else a model must run.

    features of sentence i of passage p, for one question (cosines c, lexical overlaps o):
        c[i]                          its cosine with the question (title + sentence, as compress.py embeds it)
        c[i] - max(c)                 how far it is below the question's best sentence
        max(c of p) - max(c)          how far its passage's best is below the question's best
        o[i]                          the share of the question's content stems it holds
        log(1 + rank of p)            its hit's rank (0: the first hit)
    probability = 1 / (1 + exp(-(bias + weights . features)))

A logistic regression, fitted (`fit`) on SciFact's claims_train claims: for each claim, the
sentences of hybrid's top 5 documents, labelled by the gold rationale sentences
(`benchmarks/compression.py --split train --fit`). The weights below are that fit's; the
cosines are all-MiniLM-L6-v2's (the local embedder), so the model is used with that embedder only.

Ray-free and numpy only: compress.py turns the probabilities into a selection.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

FEATURES = ("cosine", "below_best", "passage_below_best", "overlap", "log_rank")

# benchmarks/compression.py --dataset ../shared/eval/scifact --split train --fit (809 claims,
# 37,915 sentences, 938 of them gold rationale); raw feature units, in FEATURES' order
WEIGHTS = (3.5553, 0.4066, 8.6784, 4.7006, -1.0856)
BIAS = -5.7424


def features(cosines: Sequence[float], overlap: Sequence[float], owner: Sequence[int]) -> np.ndarray:
    """One row of FEATURES per sentence (`owner[i]`: the rank of sentence i's passage among the
    hits, 0 first)."""
    c = np.asarray(cosines, dtype=np.float64)
    if not len(c):
        return np.zeros((0, len(FEATURES)))
    rank = np.asarray(owner, dtype=np.int64)
    best = np.full(rank.max() + 1, -np.inf)
    np.maximum.at(best, rank, c)
    top = c.max()
    return np.column_stack([c, c - top, best[rank] - top, np.asarray(overlap, dtype=np.float64), np.log1p(rank)])


def probabilities(cosines: Sequence[float], overlap: Sequence[float], owner: Sequence[int],
                  weights: Sequence[float] = WEIGHTS, bias: float = BIAS) -> list[float]:
    """Each sentence's probability of being evidence for the question (the module docstring)."""
    x = features(cosines, overlap, owner)
    return (1.0 / (1.0 + np.exp(-(bias + x @ np.asarray(weights, dtype=np.float64))))).tolist()


def fit(x: np.ndarray, y: np.ndarray, l2: float = 1e-2, iterations: int = 50) -> tuple[tuple[float, ...], float]:
    """Logistic regression of labels `y` (0/1) on rows `x` (Newton's method on standardised
    features, L2 penalty `l2` on the weights but not the bias): (weights in raw units, bias)."""
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if not len(x) or y.min() == y.max():
        raise ValueError("fitting the evidence model needs rows of both labels")
    mean, scale = x.mean(axis=0), x.std(axis=0)
    scale[scale == 0] = 1.0
    z = np.column_stack([np.ones(len(x)), (x - mean) / scale])
    penalty = l2 * np.diag(np.r_[0.0, np.ones(x.shape[1])])
    w = np.zeros(z.shape[1])
    for _ in range(iterations):
        p = 1.0 / (1.0 + np.exp(-(z @ w)))
        step = np.linalg.solve((z * (p * (1 - p))[:, None]).T @ z + penalty, z.T @ (p - y) + penalty @ w)
        w -= step
        if np.abs(step).max() < 1e-10:
            break
    raw = w[1:] / scale
    return tuple(float(v) for v in raw), float(w[0] - raw @ mean)
