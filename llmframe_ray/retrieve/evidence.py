"""Compression's evidence models: how likely a sentence of a retrieved passage is evidence for the
question, from the sentence scores the stage already has (the query encoder's cosines offline, or
the logits of a reranker trained on rationale sentences).

    features of sentence i of passage p, for one question (scores s, lexical overlaps o):
        s[i]                          its score (cosine or logit; the title + sentence, as compress.py scores it)
        s[i] - max(s)                 how far it is below the question's best sentence
        max(s of p) - max(s)          how far its passage's best is below the question's best
        o[i]                          the share of the question's content stems it holds
        log(1 + rank of p)            its hit's rank (0: the first hit)
    probability = 1 / (1 + exp(-(bias + weights . features)))

Logistic regressions (`fit`) on SciFact's claims_train claims: for each claim, the sentences of its
top 5 documents, labelled by the gold rationale sentences (`benchmarks/compression.py --split
train --fit`):
- EMBEDDER: all-MiniLM-L6-v2's cosines (the local embedder) of hybrid's top 5, 809 claims; used
  with that embedder only;
- CROSS_ENCODER: the int8 logits of a reranker trained with `--rationales` on half of the train
  claims, of its reranked top 5, on the 404 claims it held out; used with a deployed reranker
  whose card says it was trained so.

Ray-free and numpy only: compress.py turns the probabilities into a selection.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

FEATURES = ("score", "below_best", "passage_below_best", "overlap", "log_rank")


@dataclass(frozen=True)
class Model:
    """Weights in raw feature units, in FEATURES' order, and the bias."""

    weights: tuple[float, ...]
    bias: float


# benchmarks/compression.py --dataset ../shared/eval/scifact --split train --fit (37,915 sentences, 938 gold)
EMBEDDER = Model((3.5553, 0.4066, 8.6784, 4.7006, -1.0856), -5.7424)
# the same with --scorer cross-encoder --reranker M --precision int8 --held-out --rerank, M trained with
# --rationales and validation_fraction 0.5 (19,074 sentences, 463 gold)
CROSS_ENCODER = Model((0.2867, 0.3135, 0.2783, 3.0537, -0.9691), -5.4059)


def features(scores: Sequence[float], overlap: Sequence[float], owner: Sequence[int]) -> np.ndarray:
    """One row of FEATURES per sentence (`owner[i]`: the rank of sentence i's passage among the
    hits, 0 first)."""
    s = np.asarray(scores, dtype=np.float64)
    if not len(s):
        return np.zeros((0, len(FEATURES)))
    rank = np.asarray(owner, dtype=np.int64)
    best = np.full(rank.max() + 1, -np.inf)
    np.maximum.at(best, rank, s)
    top = s.max()
    return np.column_stack([s, s - top, best[rank] - top, np.asarray(overlap, dtype=np.float64), np.log1p(rank)])


def probabilities(scores: Sequence[float], overlap: Sequence[float], owner: Sequence[int], model: Model = EMBEDDER) -> list[float]:
    """Each sentence's probability of being evidence for the question (the module docstring)."""
    x = features(scores, overlap, owner)
    return (1.0 / (1.0 + np.exp(-(model.bias + x @ np.asarray(model.weights, dtype=np.float64))))).tolist()


def fit(x: np.ndarray, y: np.ndarray, l2: float = 1e-2, iterations: int = 50) -> Model:
    """Logistic regression of labels `y` (0/1) on rows `x` (Newton's method on standardised
    features, L2 penalty `l2` on the weights but not the bias), in raw feature units."""
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
    return Model(tuple(float(v) for v in raw), float(w[0] - raw @ mean))
