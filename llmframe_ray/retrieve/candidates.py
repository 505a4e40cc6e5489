"""Shard results -> ranked candidate lists: merge across shards, aggregate chunks to documents.

These are the composition steps shared by the in-process pipeline and the Serve DAG.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from llmframe_ray.types import RankedList


@dataclass(frozen=True, order=True)
class ChunkRef:
    """A chunk addressed by (shard, row); `chunk_id` is its global, stable name."""

    shard: int
    row: int
    chunk_id: str
    doc_id: str


@dataclass(frozen=True)
class Candidates:
    """One ranker's candidates for one query: chunks best first, with scores."""

    ranker: str
    refs: tuple[ChunkRef, ...]
    scores: tuple[float, ...]

    def chunk_list(self, limit: int | None = None) -> RankedList:
        refs, scores = self.refs[:limit], self.scores[:limit]
        return RankedList(self.ranker, tuple(r.chunk_id for r in refs), scores)

    def document_list(self, limit: int | None = None) -> tuple[RankedList, dict[str, ChunkRef]]:
        """Documents ranked by their best chunk; also each document's best chunk."""
        best: dict[str, ChunkRef] = {}
        doc_ids: list[str] = []
        doc_scores: list[float] = []
        for ref, score in zip(self.refs, self.scores):
            if ref.doc_id in best:
                continue
            best[ref.doc_id] = ref
            doc_ids.append(ref.doc_id)
            doc_scores.append(score)
            if limit is not None and len(doc_ids) >= limit:
                break
        return RankedList(self.ranker, tuple(doc_ids), tuple(doc_scores)), best


def merge_shard_results(
    ranker: str,
    per_shard: Sequence[Sequence[tuple[int, float]]],
    describe: Callable[[int, int], tuple[str, str]],
    limit: int,
) -> Candidates:
    """Merge each shard's (row, score) list into one list, best first.

    `describe(shard, row)` returns (chunk_id, doc_id). Equal scores are ordered by chunk id so
    that the result does not depend on how the corpus was split into shards.
    """
    scored: list[tuple[ChunkRef, float]] = []
    for shard, results in enumerate(per_shard):
        for row, score in results:
            chunk_id, doc_id = describe(shard, row)
            scored.append((ChunkRef(shard, row, chunk_id, doc_id), float(score)))
    scored.sort(key=lambda pair: (-pair[1], pair[0].chunk_id))
    scored = scored[:limit]
    return Candidates(ranker, tuple(p[0] for p in scored), tuple(p[1] for p in scored))
