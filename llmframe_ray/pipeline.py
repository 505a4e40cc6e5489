"""The retrieval stages composed in one process, without Ray.

    query -> check -> [encode] -> search every shard (bm25 and/or dense)
          -> merge shards -> (documents: best chunk per document) -> RRF (hybrid) -> top-k hits
"""

from __future__ import annotations

import enum
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from llmframe_ray.config import Settings
from llmframe_ray.errors import IndexLoadError, ModelError
from llmframe_ray.index.shard import IndexShard
from llmframe_ray.index.versions import IndexDirectory
from llmframe_ray.models.cross_encoder import CrossEncoder
from llmframe_ray.models.embedder import Embedder, check_query_text
from llmframe_ray.retrieve.candidates import Candidates, ChunkRef, merge_shard_results
from llmframe_ray.retrieve.fusion import reciprocal_rank_fusion
from llmframe_ray.retrieve.rerank import rerank_hits
from llmframe_ray.types import Hit, SearchMode, parse_enum

BM25 = SearchMode.BM25.value
DENSE = SearchMode.DENSE.value


class ResultLevel(str, enum.Enum):
    """Whether hits are chunks, or documents represented by their best chunk."""

    CHUNK = "chunk"
    DOCUMENT = "document"

    @classmethod
    def from_str(cls, value: str | ResultLevel) -> ResultLevel:
        return parse_enum(cls, value, "result level")


class Pipeline:
    """Search an index's shards with BM25, dense retrieval, or both fused with RRF."""

    def __init__(
        self,
        shards: Sequence[IndexShard],
        embedder: Embedder | None,
        settings: Settings,
        reranker: CrossEncoder | None = None,
    ) -> None:
        if not shards:
            raise ValueError("a pipeline needs at least one index shard")
        self.shards = list(shards)
        self.embedder = embedder
        self.reranker = reranker
        self.settings = settings
        self.max_chunks_per_doc = max(s.manifest.max_chunks_per_doc for s in self.shards)
        self.total_chunks = sum(len(s) for s in self.shards)
        self._weights = {BM25: settings.bm25_weight, DENSE: settings.dense_weight}
        if embedder is not None:
            _check_model(self.shards[0].manifest.model, embedder)
        for shard in self.shards:  # search-time ANN settings come from the settings, not the build
            shard.dense.set_search_params(
                hnsw_ef_search=settings.hnsw_ef_search, ivf_nprobe=settings.ivf_nprobe
            )

    @classmethod
    def open(
        cls,
        index_dir: Path,
        settings: Settings,
        embedder: Embedder | None,
        reranker: CrossEncoder | None = None,
    ) -> Pipeline:
        loaded = IndexDirectory(index_dir).load()
        return cls(loaded.shards, embedder, settings, reranker)

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
        rerank: bool | None = None,
    ) -> list[Hit]:
        return self.search_batch([query], mode, top_k, level, truncate=truncate, rerank=rerank)[0]

    def search_batch(
        self,
        queries: Sequence[str],
        mode: str | SearchMode | None = None,
        top_k: int = 10,
        level: str | ResultLevel = ResultLevel.DOCUMENT,
        *,
        truncate: bool = False,
        rerank: bool | None = None,
    ) -> list[list[Hit]]:
        """Answer many queries at once: one encoder call, one search call per shard and ranker.

        A query longer than the embedder's limit is an error unless `truncate` is set, in which
        case the embedder sees its first tokens only (BM25 always sees all of it). With `rerank`
        (default: RERANKER_ENABLED) the mode's top `reranker_depth` hits are rescored by the
        cross-encoder before the top `top_k` are returned.
        """
        if isinstance(queries, str):
            raise TypeError("search_batch takes a sequence of queries, not one string")
        mode = self.default_mode if mode is None else SearchMode.from_str(mode)
        level = ResultLevel.from_str(level)
        if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
            raise ValueError(f"top_k must be a positive integer, got {top_k!r}")
        rerank = self.settings.reranker_enabled if rerank is None else rerank
        if rerank and self.reranker is None:
            raise ModelError(
                "reranking was asked for but no reranker is loaded (LLMFRAME_RERANKER_MODEL)"
            )
        wanted = max(top_k, self.settings.reranker_depth) if rerank else top_k
        uses_dense = mode in (SearchMode.DENSE, SearchMode.HYBRID)
        if uses_dense and self.embedder is None:
            raise ModelError(f"mode {mode.value!r} needs an embedder; none was loaded")
        check = self.embedder.check_query if uses_dense and not truncate else check_query_text
        checked = [check(q) for q in queries]
        if not checked:
            return []

        depth = wanted if mode is not SearchMode.HYBRID else max(wanted, self.settings.fusion_depth)
        per_ranker: dict[str, list[Candidates]] = {}
        if mode in (SearchMode.BM25, SearchMode.HYBRID):
            problem = bm25_consistency_problem(self.shards)
            if problem is not None:
                raise IndexLoadError(problem)
            per_ranker[BM25] = self._candidates(
                BM25, lambda shard, rows, k: shard.search_sparse([checked[i] for i in rows], k),
                len(checked), depth, level,
            )
        if uses_dense:
            vectors = np.ascontiguousarray(self.embedder.embed(checked), dtype=np.float32)
            per_ranker[DENSE] = self._candidates(
                DENSE, lambda shard, rows, k: shard.search_dense(vectors[rows], k),
                len(checked), depth, level,
            )

        results = []
        for i in range(len(checked)):
            candidates = [per_ranker[name][i] for name in (BM25, DENSE) if name in per_ranker]
            hits = self._hits(candidates, level, depth, wanted)
            if rerank:
                hits = rerank_hits(
                    checked[i], hits, self.reranker, self.settings.reranker_depth, self.settings.reranker_fusion_k
                )
            results.append(hits[:top_k])
        return results

    # stages
    def _candidates(
        self,
        ranker: str,
        search: Callable[[IndexShard, list[int], int], list[list[tuple[int, float]]]],
        n_queries: int,
        depth: int,
        level: ResultLevel,
    ) -> list[Candidates]:
        """Each query's best chunks from every shard, merged, enough to rank `depth` items.

        At document level the number of chunks needed for `depth` distinct documents is not
        known in advance: start at 2 x depth and double, for the queries still short of
        `depth` documents, until they have them or the shards have nothing more to give.
        """
        out: list[Candidates | None] = [None] * n_queries
        pending = list(range(n_queries))
        k = depth if level is ResultLevel.CHUNK else 2 * depth
        while pending:
            k = min(k, self.total_chunks)
            per_shard = [search(shard, pending, min(k, len(shard))) for shard in self.shards]
            still_short = []
            for j, i in enumerate(pending):
                lists = [res[j] for res in per_shard]
                merged = merge_shard_results(ranker, lists, self._doc_id, k)
                exhausted = all(len(lst) < min(k, len(s)) for lst, s in zip(lists, self.shards))
                enough = level is ResultLevel.CHUNK or merged.n_documents >= depth
                if enough or exhausted or k >= self.total_chunks:
                    out[i] = merged
                else:
                    still_short.append(i)
            pending = still_short
            k *= 2
        return out

    def _doc_id(self, shard: int, row: int) -> str:
        return self.shards[shard].doc_id(row)

    def _hits(
        self, candidates: list[Candidates], level: ResultLevel, depth: int, top_k: int
    ) -> list[Hit]:
        if level is ResultLevel.CHUNK:
            lists = [c.chunk_list(depth) for c in candidates]
            best = {ref.key: ref for c in candidates for ref in c.refs[:depth]}
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
            fused = reciprocal_rank_fusion(
                lists, k=self.settings.rrf_k, weights=self._weights, limit=top_k
            )
            items = [(f.key, f.score, dict(f.ranks)) for f in fused]
        return [self._hit(best[key], score, rank, ranks) for rank, (key, score, ranks) in enumerate(items, 1)]

    def _best_fused_chunks(
        self, candidates: list[Candidates], fallback: dict[str, ChunkRef]
    ) -> dict[str, ChunkRef]:
        """Each document's chunk that ranks highest when the chunk lists are fused."""
        refs = {ref.key: ref for c in candidates for ref in c.refs}
        fused = reciprocal_rank_fusion(
            [c.chunk_list() for c in candidates], k=self.settings.rrf_k, weights=self._weights
        )
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


def bm25_consistency_problem(shards: Sequence[IndexShard]) -> str | None:
    """Why BM25 scores of these shards cannot be merged into one ranking (None when they can).

    Shards rank like one index only if each was scored with the statistics of all of them
    together (see SparseIndex.build): the same recorded corpus, whose size is theirs combined.
    """
    if len(shards) == 1:
        return None
    recorded = [shard.sparse.corpus for shard in shards]
    total = {"n_docs": sum(len(s) for s in shards), "n_tokens": sum(s.sparse.n_tokens for s in shards)}
    if any(r is None or dict(r) != total for r in recorded):
        return (
            f"BM25 over these {len(shards)} shards would rank differently from one index: their "
            "scores were not computed with corpus-wide statistics (rebuild the index with "
            "`llmframe-ray ingest`), so use mode 'dense'"
        )
    return None


def _check_model(model: dict, embedder: Embedder) -> None:
    name, dim = model.get("name"), model.get("dim")
    # a hosted model's dimension may be unknown (0) until its first call
    if name != embedder.name or (embedder.dim and dim != embedder.dim):
        raise ModelError(
            f"the index was built with embedding model {name!r} (dim {dim}), but the loaded "
            f"embedder is {embedder.name!r} (dim {embedder.dim}); rebuild the index or change "
            "EMBEDDING_PROVIDER"
        )
