"""What retrieval needs to know of the shards of a version without their files, and whether
their BM25 scores can be merged."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from llmframe_ray.index.shard import IndexShard


@dataclass(frozen=True)
class ShardFacts:
    """What retrieval needs to know of one shard of a version, without its files."""

    size: int  # chunks; 0 for a shard left empty
    n_tokens: int  # BM25 document lengths summed
    corpus: Mapping[str, Any] | None  # the corpus-wide BM25 statistics it was scored with
    model: Mapping[str, Any]  # the embedding model its vectors come from

    @classmethod
    def of(cls, shard: IndexShard) -> ShardFacts:
        corpus = shard.sparse.corpus
        return cls(
            size=len(shard),
            n_tokens=shard.sparse.n_tokens,
            corpus=None if corpus is None else dict(corpus),
            model=dict(shard.manifest.model),
        )


def bm25_consistency_problem(shards: Sequence[ShardFacts]) -> str | None:
    """Why BM25 scores of these shards cannot be merged into one ranking (None when they can).

    Shards rank like one index only if each was scored with the statistics of all of them
    together (see SparseIndex.build): the same recorded corpus, whose size is theirs combined.
    Empty shards take no part.
    """
    live = [s for s in shards if s.size > 0]
    if len(live) <= 1:
        return None
    total = {"n_docs": sum(s.size for s in live), "n_tokens": sum(s.n_tokens for s in live)}
    spaces = [(s.corpus or {}).get("namespaces") for s in live]
    if any(s.corpus is None or {k: s.corpus.get(k) for k in total} != total for s in live) or any(
        part != spaces[0] for part in spaces
    ):
        return (
            f"BM25 over these {len(live)} shards would rank differently from one index: their "
            "scores were not computed with corpus-wide statistics (rebuild the index with "
            "`llmframe-ray ingest`), so use mode 'dense'"
        )
    return None
