"""Rerank the head of a ranked hit list with a cross-encoder ("fuse, then rerank").

The first `depth` hits are rescored by the cross-encoder, then ordered by one of
(LLMFRAME_RERANKER_FUSION):
- `score` (the default): each hit's first-stage score and its cross-encoder score, each mapped
  linearly onto [0, 1] over the head (its best 1, its worst 0), added with the weights below.
  The cross-encoder then corrects the first stage by as much as it is sure: a wide margin moves
  a hit, near-equal scores leave the first stage's order (README "Reranking": chosen over RRF on
  held-out SciFact train claims). A head of two maps each list onto {0, 1}, so there, as with
  RRF, the cross-encoder reorders only with a weight above 1;
- `rrf`: Reciprocal Rank Fusion of the two orders (k = LLMFRAME_RERANKER_RRF_K), which keeps
  ranks only;
- `none`: the cross-encoder's order alone (ties keep their incoming order).
The hit's score is the fused score. Hits below the depth keep their incoming order after the
reranked ones. Each reranked hit records the cross-encoder's own position under
`ranks["rerank"]`.

The cross-encoder has a weight in that fusion (the first stage's is 1). Set
(LLMFRAME_RERANKER_WEIGHT), it is that number. Unset, it follows the reranker's distance from
home (domain_weight): the cosine of the centroid of the corpus it was trained on (model card)
and the served index's centroid (index/domain.py), kept between DOMAIN_FLOOR and 1. On its own
corpus a reranker keeps weight 1; far from it, where the card says nothing, or for a model
trained without judgments, it counts half as much as the first stage. Measured on the five
bundled collections (README "Reranking out of its domain"): SciFact-trained, weight 1 fell
below hybrid on Cranfield and HotpotQA.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np

from llmframe_ray.models.cross_encoder import CrossEncoder, rerank_order
from llmframe_ray.retrieve.fusion import reciprocal_rank_fusion
from llmframe_ray.types import Choice, Hit, RankedList

RERANK = "rerank"
FIRST_STAGE = "first_stage"
DOMAIN_FLOOR = 0.5


def domain_weight(similarity: float | None) -> float:
    """The cross-encoder's fusion weight for a corpus whose centroid has this cosine with the
    reranker's training corpus (None: unknown, treated as far)."""
    return DOMAIN_FLOOR if similarity is None else min(1.0, max(DOMAIN_FLOOR, similarity))


class RerankFusion(Choice):
    """How the reranked head is ordered: the cross-encoder's and the first stage's scores
    combined, RRF of their orders, or the cross-encoder's order alone."""

    SCORE = "score"
    RRF = "rrf"
    NONE = "none"


@dataclass(frozen=True)
class RerankParams:
    """Reranking as a step after retrieval: on by default or not, how many hits it rescores,
    and how its order is combined with the first stage's (the search path, the served app and
    the evaluation all apply it through these methods)."""

    enabled: bool = False
    depth: int = 25  # README "Reranking": held-out train queries and other corpora (LLMFRAME_RERANKER_DEPTH)
    fusion: RerankFusion = RerankFusion.SCORE
    rrf_k: int = 20
    weight: float | None = None  # the cross-encoder's weight in the fusion; None: by domain (domain_weight)

    def __post_init__(self) -> None:
        object.__setattr__(self, "fusion", RerankFusion.from_str(self.fusion))
        if self.depth < 1:
            raise ValueError(f"rerank depth must be >= 1, got {self.depth}")
        if self.weight is not None and self.weight < 0:
            raise ValueError(f"the reranker's fusion weight must be >= 0, got {self.weight}")

    def weight_for(self, similarity: float | None) -> float:
        """The weight set, or the one the reranker's domain similarity gives."""
        return self.weight if self.weight is not None else domain_weight(similarity)

    def wanted(self, top_k: int, rerank: bool) -> int:
        """How many first-stage hits to retrieve for `top_k` results."""
        return max(top_k, self.depth) if rerank else top_k

    def passages(self, hits: Sequence[Hit]) -> list[str]:
        """What the cross-encoder reads: the head's passages, in order."""
        return [h.passage for h in hits[: self.depth]]

    def apply(
        self, query: str, hits: Sequence[Hit], scores: Sequence[float], fusion: RerankFusion | None = None,
        weight: float = 1.0,
    ) -> list[Hit]:
        """The hits with the head reordered by its cross-encoder `scores` (of `passages`), the
        cross-encoder counted with `weight` in the fusion (`weight_for` gives it); `fusion`
        overrides the configured one."""
        fusion = self.fusion if fusion is None else fusion
        return rerank_hits(query, hits, None, self.depth, fusion, self.rrf_k, scores=scores, weight=weight)


def rerank_hits(
    query: str,
    hits: Sequence[Hit],
    encoder: CrossEncoder | None,
    depth: int,
    fusion: RerankFusion = RerankFusion.NONE,
    rrf_k: int = 20,
    *,
    scores: Sequence[float] | None = None,
    weight: float = 1.0,
) -> list[Hit]:
    """Rerank the head; `scores` (the cross-encoder's scores of the head, in order) skips the
    model call, so one scoring pass can give every fused order. `weight`: the cross-encoder's
    weight in the fusion (the first stage's is 1); `rrf_k`: RRF's k."""
    fusion = RerankFusion.from_str(fusion)
    if depth < 1:
        raise ValueError(f"rerank depth must be >= 1, got {depth}")
    if weight < 0:
        raise ValueError(f"the reranker's fusion weight must be >= 0, got {weight}")
    head, tail = list(hits[:depth]), list(hits[depth:])
    if not head:
        return []
    if scores is None:
        if encoder is None:
            raise ValueError("rerank_hits needs an encoder or the scores")
        scores = encoder.score(query, [h.passage for h in head])
    elif len(scores) != len(head):
        raise ValueError(f"got {len(scores)} scores for {len(head)} reranked hits")
    order = rerank_order(scores)
    own_rank = {i: pos for pos, i in enumerate(order, 1)}
    if fusion is RerankFusion.NONE:
        final = [(i, float(scores[i])) for i in order]
    elif fusion is RerankFusion.SCORE:
        final = score_fusion([h.score for h in head], scores, weight)
    else:  # RRF, the only other member
        lists = [
            RankedList(RERANK, tuple(f"{i:06d}" for i in order), tuple(float(scores[i]) for i in order)),
            RankedList(FIRST_STAGE, tuple(f"{i:06d}" for i in range(len(head))), tuple(h.score for h in head)),
        ]
        # exact ties fall to the better single rank, then the key: the incoming position
        fused = reciprocal_rank_fusion(lists, k=rrf_k, weights=(weight, 1.0))
        final = [(int(item.key), item.score) for item in fused]
    reranked = [
        replace(head[i], score=score, rank=pos, ranks={**head[i].ranks, RERANK: own_rank[i]})
        for pos, (i, score) in enumerate(final, 1)
    ]
    rest = [replace(h, rank=len(reranked) + pos) for pos, h in enumerate(tail, 1)]
    return reranked + rest


def unit_range(values: Sequence[float], what: str) -> np.ndarray:
    """`values` mapped linearly onto [0, 1], the largest to 1 and the smallest to 0; all equal
    (one value included): all 0, so they order nothing. A value that is not a finite number is
    refused, naming `what` gave it."""
    array = np.asarray(values, dtype=np.float64)
    if not np.isfinite(array).all():
        raise ValueError(f"{what} gave a score that is not a finite number: {array[~np.isfinite(array)][0]}")
    low, span = (array.min(), array.max() - array.min()) if array.size else (0.0, 0.0)
    return (array - low) / span if span > 0 else np.zeros_like(array)


def score_fusion(first: Sequence[float], cross: Sequence[float], weight: float) -> list[tuple[int, float]]:
    """(position, fused score) of the head, best first: each list's scores on [0, 1] over the
    head (`unit_range`), the first stage's counted once and the cross-encoder's `weight` times.
    Equal fused scores keep the incoming order."""
    fused = unit_range(first, "the first stage") + weight * unit_range(cross, "the cross-encoder")
    return [(int(i), float(fused[i])) for i in np.argsort(-fused, kind="stable")]
