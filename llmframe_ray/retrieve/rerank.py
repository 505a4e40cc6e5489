"""Rerank the head of a ranked hit list with a cross-encoder ("fuse, then rerank").

The first `depth` hits are rescored by the cross-encoder. With `fusion_k` None they are sorted
by that score (ties keep their incoming order). With `fusion_k` set (the default in the
pipeline: LLMFRAME_RERANKER_FUSION=rrf, k = LLMFRAME_RRF_K) the cross-encoder's order and the
incoming (hybrid) order of the head are fused with Reciprocal Rank Fusion, equal weights, and
the hit's score is the fused score: the cross-encoder then corrects the first stage instead of
replacing it (on held-out SciFact train queries: see README "Reranking"). Hits below the depth
keep their incoming order after the reranked ones. Each reranked hit records the
cross-encoder's own position under `ranks["rerank"]`.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

from llmframe_ray.models.cross_encoder import CrossEncoder, rerank_order
from llmframe_ray.retrieve.fusion import reciprocal_rank_fusion
from llmframe_ray.types import Hit, RankedList

RERANK = "rerank"
FIRST_STAGE = "first_stage"


def passage_of(hit: Hit) -> str:
    """What the cross-encoder reads for a hit: title, newline, chunk text."""
    return f"{hit.title}\n{hit.text}" if hit.title else hit.text


def rerank_hits(
    query: str,
    hits: Sequence[Hit],
    encoder: CrossEncoder | None,
    depth: int,
    fusion_k: int | None = None,
    *,
    scores: Sequence[float] | None = None,
) -> list[Hit]:
    """Rerank the head; `scores` (the cross-encoder's scores of the head, in order) skips the
    model call, so one scoring pass can give both the fused and the plain order."""
    if depth < 1:
        raise ValueError(f"rerank depth must be >= 1, got {depth}")
    head, tail = list(hits[:depth]), list(hits[depth:])
    if not head:
        return []
    if scores is None:
        if encoder is None:
            raise ValueError("rerank_hits needs an encoder or the scores")
        scores = encoder.score(query, [passage_of(h) for h in head])
    elif len(scores) != len(head):
        raise ValueError(f"got {len(scores)} scores for {len(head)} reranked hits")
    order = rerank_order(scores)
    own_rank = {i: pos for pos, i in enumerate(order, 1)}
    if fusion_k is None:
        final = [(i, float(scores[i])) for i in order]
    else:
        lists = [
            RankedList(RERANK, tuple(f"{i:06d}" for i in order), tuple(float(scores[i]) for i in order)),
            RankedList(FIRST_STAGE, tuple(f"{i:06d}" for i in range(len(head))), tuple(h.score for h in head)),
        ]
        # exact ties fall to the better single rank, then the key: the incoming position
        final = [(int(item.key), item.score) for item in reciprocal_rank_fusion(lists, k=fusion_k)]
    reranked = [
        replace(head[i], score=score, rank=pos, ranks={**head[i].ranks, RERANK: own_rank[i]})
        for pos, (i, score) in enumerate(final, 1)
    ]
    rest = [replace(h, rank=len(reranked) + pos) for pos, h in enumerate(tail, 1)]
    return reranked + rest
