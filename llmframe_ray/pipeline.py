"""The retrieval stages composed in one process, without Ray.

    query -> check -> [encode] -> search every shard (bm25 and/or dense)
          -> merge shards -> (documents: best chunk per document) -> RRF (hybrid) -> top-k hits
"""

from __future__ import annotations

import enum
from pathlib import Path
from typing import Sequence

import numpy as np

from llmframe_ray.config import Settings
from llmframe_ray.errors import ModelError
from llmframe_ray.index.shard import IndexShard
from llmframe_ray.index.versions import IndexDirectory
from llmframe_ray.models.embedder import Embedder, check_query_text
from llmframe_ray.retrieve.candidates import Candidates, ChunkRef, merge_shard_results
from llmframe_ray.retrieve.fusion import reciprocal_rank_fusion
from llmframe_ray.types import Hit, SearchMode

BM25 = SearchMode.BM25.value
DENSE = SearchMode.DENSE.value


class ResultLevel(str, enum.Enum):
    """Whether hits are chunks, or documents represented by their best chunk."""

    CHUNK = "chunk"
    DOCUMENT = "document"

    @classmethod
    def from_str(cls, value: str | ResultLevel) -> ResultLevel:
        if isinstance(value, ResultLevel):
            return value
        try:
            return cls(str(value).strip().lower())
        except ValueError:
            valid = ", ".join(m.value for m in cls)
            raise ValueError(f"unknown result level {value!r}; valid levels: {valid}") from None


class Pipeline:
    """Search an index's shards with BM25, dense retrieval, or both fused with RRF."""

    def __init__(
        self, shards: Sequence[IndexShard], embedder: Embedder | None, settings: Settings
    ) -> None:
        if not shards:
            raise ValueError("a pipeline needs at least one index shard")
        self.shards = list(shards)
        self.embedder = embedder
        self.settings = settings
        self.max_chunks_per_doc = max(s.manifest.max_chunks_per_doc for s in self.shards)
        self.total_chunks = sum(len(s) for s in self.shards)
        if embedder is not None:
            _check_model(self.shards[0].manifest.model, embedder)

    @classmethod
    def open(cls, index_dir: Path, settings: Settings, embedder: Embedder | None) -> Pipeline:
        loaded = IndexDirectory(index_dir).load()
        return cls(loaded.shards, embedder, settings)

    @property
    def default_mode(self) -> SearchMode:
        return SearchMode.HYBRID if self.settings.hybrid_search_enabled else SearchMode.DENSE

    def search(
        self,
        query: str,
        mode: str | SearchMode | None = None,
        top_k: int = 10,
        level: str | ResultLevel = ResultLevel.DOCUMENT,
        *,
        truncate: bool = False,
    ) -> list[Hit]:
        return self.search_batch([query], mode, top_k, level, truncate=truncate)[0]

    def search_batch(
        self,
        queries: Sequence[str],
        mode: str | SearchMode | None = None,
        top_k: int = 10,
        level: str | ResultLevel = ResultLevel.DOCUMENT,
        *,
        truncate: bool = False,
    ) -> list[list[Hit]]:
        """Answer many queries at once: one encoder call, one search call per shard and ranker.

        A query longer than the embedder's limit is an error unless `truncate` is set, in which
        case the embedder sees its first tokens only (BM25 always sees all of it).
        """
        mode = self.default_mode if mode is None else SearchMode.from_str(mode)
        level = ResultLevel.from_str(level)
        if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
            raise ValueError(f"top_k must be a positive integer, got {top_k!r}")
        uses_dense = mode in (SearchMode.DENSE, SearchMode.HYBRID)
        if uses_dense and self.embedder is None:
            raise ModelError(f"mode {mode.value!r} needs an embedder; none was loaded")
        check = self.embedder.check_query if uses_dense and not truncate else check_query_text
        checked = [check(q) for q in queries]
        if not checked:
            return []

        depth = top_k if mode is not SearchMode.HYBRID else max(top_k, self.settings.fusion_depth)
        chunk_k = depth if level is ResultLevel.CHUNK else depth * self.max_chunks_per_doc
        chunk_k = min(chunk_k, self.total_chunks)

        per_ranker: dict[str, list[Candidates]] = {}
        if mode in (SearchMode.BM25, SearchMode.HYBRID):
            per_ranker[BM25] = self._sparse_candidates(checked, chunk_k)
        if uses_dense:
            per_ranker[DENSE] = self._dense_candidates(checked, chunk_k)

        results = []
        for i in range(len(checked)):
            candidates = [per_ranker[name][i] for name in (BM25, DENSE) if name in per_ranker]
            results.append(self._hits(candidates, level, depth, top_k))
        return results

    # stages
    def _sparse_candidates(self, queries: list[str], k: int) -> list[Candidates]:
        per_shard = [shard.search_sparse(queries, min(k, len(shard))) for shard in self.shards]
        return [
            merge_shard_results(BM25, [res[i] for res in per_shard], self._describe, k)
            for i in range(len(queries))
        ]

    def _dense_candidates(self, queries: list[str], k: int) -> list[Candidates]:
        vectors = np.ascontiguousarray(self.embedder.embed(queries), dtype=np.float32)
        per_shard = [shard.search_dense(vectors, min(k, len(shard))) for shard in self.shards]
        return [
            merge_shard_results(DENSE, [res[i] for res in per_shard], self._describe, k)
            for i in range(len(queries))
        ]

    def _describe(self, shard: int, row: int) -> tuple[str, str]:
        chunk = self.shards[shard].chunk(row)
        return chunk.chunk_id, chunk.doc_id

    def _hits(
        self, candidates: list[Candidates], level: ResultLevel, depth: int, top_k: int
    ) -> list[Hit]:
        if level is ResultLevel.CHUNK:
            lists = [c.chunk_list(depth) for c in candidates]
            refs = {ref.chunk_id: ref for c in candidates for ref in c.refs[:depth]}
            best = refs
        else:
            lists, best = [], {}
            for c in candidates:
                ranked, best_chunks = c.document_list(depth)
                lists.append(ranked)
                for doc_id, ref in best_chunks.items():
                    best.setdefault(doc_id, ref)
            if len(candidates) > 1:
                best = self._best_fused_chunks(candidates, best)

        if len(lists) == 1:
            only = lists[0]
            items = [
                (key, score, {only.name: pos + 1})
                for pos, (key, score) in enumerate(zip(only.keys[:top_k], only.scores[:top_k]))
            ]
        else:
            weights = {BM25: self.settings.bm25_weight, DENSE: self.settings.dense_weight}
            fused = reciprocal_rank_fusion(
                lists, k=self.settings.rrf_k, weights=weights, limit=top_k
            )
            items = [(f.key, f.score, dict(f.ranks)) for f in fused]
        return [self._hit(best[key], score, rank, ranks) for rank, (key, score, ranks) in enumerate(items, 1)]

    def _best_fused_chunks(
        self, candidates: list[Candidates], fallback: dict[str, ChunkRef]
    ) -> dict[str, ChunkRef]:
        """Each document's chunk that ranks highest when the chunk lists are fused."""
        refs = {ref.chunk_id: ref for c in candidates for ref in c.refs}
        fused = reciprocal_rank_fusion([c.chunk_list() for c in candidates], k=self.settings.rrf_k)
        best: dict[str, ChunkRef] = {}
        for item in fused:
            ref = refs[item.key]
            best.setdefault(ref.doc_id, ref)
        return {doc_id: best.get(doc_id, ref) for doc_id, ref in fallback.items()}

    def _hit(self, ref: ChunkRef, score: float, rank: int, ranks: dict[str, int]) -> Hit:
        chunk = self.shards[ref.shard].chunk(ref.row)
        return Hit(
            doc_id=chunk.doc_id,
            chunk_id=chunk.chunk_id,
            text=chunk.text,
            title=chunk.title,
            score=float(score),
            rank=rank,
            ranks=ranks,
        )


def _check_model(model: dict, embedder: Embedder) -> None:
    name, dim = model.get("name"), model.get("dim")
    if name != embedder.name or dim != embedder.dim:
        raise ModelError(
            f"the index was built with embedding model {name!r} (dim {dim}), but the loaded "
            f"embedder is {embedder.name!r} (dim {embedder.dim}); rebuild the index or change "
            "EMBEDDING_PROVIDER"
        )
