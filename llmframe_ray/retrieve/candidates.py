"""Shard results -> ranked candidate lists: merge across shards, aggregate chunks to documents.

These are the composition steps shared by the in-process pipeline and the Serve DAG.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from llmframe_ray.types import RankedList


@dataclass(frozen=True)
class ChunkRef:
    """A chunk addressed by (shard, row), with its document id.

    The chunk's text and stable id are read from the store only for the hits that are returned,
    never for every candidate.
    """

    shard: int
    row: int
    doc_id: str

    @property
    def key(self) -> str:
        """Unique per chunk, and ordered the same way whatever the shard layout: by document id,
        then row, which within a document is position order (rows are stored in (doc_id,
        position) order, and all chunks of a document share a shard). Fusion breaks exact
        ties by key, so chunk-level hybrid results do not depend on how the index is sharded."""
        return f"{self.doc_id}\x1f{self.row:012d}\x1f{self.shard}"


@dataclass(frozen=True)
class Candidates:
    """One ranker's candidates for one query: chunks best first, with scores."""

    ranker: str
    refs: tuple[ChunkRef, ...]
    scores: tuple[float, ...]

    @property
    def n_documents(self) -> int:
        return len({ref.doc_id for ref in self.refs})

    def chunk_list(self, limit: int | None = None) -> RankedList:
        refs, scores = self.refs[:limit], self.scores[:limit]
        return RankedList(self.ranker, tuple(r.key for r in refs), scores)

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
    per_shard: Mapping[int, Sequence[tuple[int, float, str]]],
    limit: int,
) -> Candidates:
    """Merge each shard's (row, score, doc_id) list into one list, best first.

    `per_shard` maps a shard number to its list. Equal scores are ordered by document id, then
    row, so documents tie the same way however the corpus is split into shards (all chunks of a
    document live in one shard).
    """
    scored = [
        (ChunkRef(shard, row, doc_id), float(score))
        for shard, results in per_shard.items()
        for row, score, doc_id in results
    ]
    scored.sort(key=lambda pair: (-pair[1], pair[0].doc_id, pair[0].row, pair[0].shard))
    scored = scored[:limit]
    return Candidates(ranker, tuple(p[0] for p in scored), tuple(p[1] for p in scored))
