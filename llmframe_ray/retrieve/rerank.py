"""Rerank the head of a ranked hit list with a cross-encoder ("fuse, then rerank").

The first `depth` hits are rescored by the cross-encoder and sorted by that score (ties keep
their incoming order); hits below the depth keep their incoming order after them. Each reranked
hit records its new position under `ranks["rerank"]`.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

from llmframe_ray.models.cross_encoder import CrossEncoder, rerank_order
from llmframe_ray.types import Hit

RERANK = "rerank"


def passage_of(hit: Hit) -> str:
    """What the cross-encoder reads for a hit: title, newline, chunk text."""
    return f"{hit.title}\n{hit.text}" if hit.title else hit.text


def rerank_hits(query: str, hits: Sequence[Hit], encoder: CrossEncoder, depth: int) -> list[Hit]:
    if depth < 1:
        raise ValueError(f"rerank depth must be >= 1, got {depth}")
    head, tail = list(hits[:depth]), list(hits[depth:])
    if not head:
        return []
    scores = encoder.score(query, [passage_of(h) for h in head])
    reranked = [
        replace(head[i], score=float(scores[i]), rank=pos, ranks={**head[i].ranks, RERANK: pos})
        for pos, i in enumerate(rerank_order(scores), 1)
    ]
    rest = [replace(h, rank=len(reranked) + pos) for pos, h in enumerate(tail, 1)]
    return reranked + rest
