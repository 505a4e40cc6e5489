"""The retrieval stages composed in one process, without Ray.

    query -> check -> retrieval plan (retrieve/plan.py) answered by direct calls -> [rerank]

The Serve Retriever (serve/retriever.py) runs the same plan over batches of requests.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from llmframe_ray.errors import IndexLoadError, ModelError
from llmframe_ray.index.domain import shards_similarity
from llmframe_ray.index.metadata import Filter
from llmframe_ray.index.params import check_model
from llmframe_ray.index.shard import IndexShard
from llmframe_ray.index.store import share_document_keys
from llmframe_ray.index.versions import IndexDirectory
from llmframe_ray.models.cross_encoder import CrossEncoder
from llmframe_ray.models.embedder import Embedder, check_query_text
from llmframe_ray.retrieve.joint import prepare as prepare_together, search_together
from llmframe_ray.retrieve.params import RetrievalParams
from llmframe_ray.retrieve.facts import ShardFacts, bm25_consistency_problem
from llmframe_ray.retrieve.drive import DirectCalls, run_plan
from llmframe_ray.retrieve.plan import Ranker, ResultLevel, ShardResults, retrieval_plan, search_shard
from llmframe_ray.retrieve.rerank import RerankParams
from llmframe_ray.retrieve.strategy import GRAPH_MISSING, StrategyError
from llmframe_ray.types import Chunk, Hit, SearchMode


class Pipeline:
    """Search an index's shards with BM25, dense retrieval, or both fused with RRF; rerank."""

    def __init__(
        self,
        shards: Sequence[IndexShard],
        embedder: Embedder | None,
        retrieval: RetrievalParams | None = None,
        reranker: CrossEncoder | None = None,
        rerank: RerankParams | None = None,
    ) -> None:
        if not shards:
            raise ValueError("a pipeline needs at least one index shard")
        self.retrieval = RetrievalParams() if retrieval is None else retrieval
        self.rerank = RerankParams() if rerank is None else rerank
        prepared = [self.retrieval.prepare(s) for s in shards]
        keyed = share_document_keys([s.store for s in prepared])
        self.shards = [replace(shard, store=store) for shard, store in zip(prepared, keyed)]
        prepare_together(list(enumerate(self.shards)))  # first_stage searches them as one
        self.embedder = embedder
        self.reranker = reranker
        self.graph: Any = None  # a GraphSearch (graph/search.py) for the graph modes: load_graph
        self.max_chunks_per_doc = max(s.manifest.max_chunks_per_doc for s in self.shards)
        self.total_chunks = sum(len(s) for s in self.shards)
        self.bm25_problem = bm25_consistency_problem([ShardFacts.of(s) for s in self.shards])
        if embedder is not None:
            check_model(self.shards[0].manifest.model, embedder.info())
        self.rerank_weight = self.rerank.weight_for(self.domain_similarity()) if reranker is not None else 1.0

    def domain_similarity(self) -> float | None:
        """Cosine of the reranker's training-corpus centroid and these shards' (index/domain.py);
        None without a reranker, a centroid in its card, or a weight set (nothing to decide)."""
        if self.reranker is None or self.rerank.weight is not None:
            return None
        return shards_similarity(getattr(self.reranker, "card", {}), self.shards)

    @classmethod
    def open(
        cls,
        index_dir: Path,
        embedder: Embedder | None,
        retrieval: RetrievalParams | None = None,
        reranker: CrossEncoder | None = None,
        rerank: RerankParams | None = None,
    ) -> Pipeline:
        params = retrieval or RetrievalParams()
        loaded = IndexDirectory(index_dir).load(verify=params.verify_on_load, memory_limit_mb=params.memory_limit_mb)
        pipeline = cls(loaded.shards, embedder, retrieval, reranker, rerank)
        pipeline.load_graph(loaded.path, loaded.shard_ids)
        return pipeline

    def load_graph(self, version_path: Path, shard_ids: Sequence[int], params: Any = None) -> None:
        """Hold the knowledge graph of the version these shards (ids `shard_ids`) come from, if
        it has one (`params`: GraphParams; default the retrieval settings')."""
        from llmframe_ray.graph.search import GraphSearch

        stores = [s.store for s in self.shards]
        self.graph = GraphSearch.open(version_path, stores, shard_ids, params or self.retrieval.graph)

    @property
    def default_mode(self) -> SearchMode:
        return self.retrieval.default_mode

    def search(
        self,
        query: str,
        mode: str | SearchMode | None = None,
        top_k: int = 10,
        level: str | ResultLevel = ResultLevel.DOCUMENT,
        *,
        truncate: bool = False,
        rerank: bool | None = None,
        where: Filter | None = None,
        alpha: float | None = None,
    ) -> list[Hit]:
        return self.search_batch([query], mode, top_k, level, truncate=truncate, rerank=rerank, where=where, alpha=alpha)[0]

    def search_batch(
        self,
        queries: Sequence[str],
        mode: str | SearchMode | None = None,
        top_k: int = 10,
        level: str | ResultLevel = ResultLevel.DOCUMENT,
        *,
        truncate: bool = False,
        rerank: bool | None = None,
        where: Filter | None = None,
        alpha: float | None = None,
    ) -> list[list[Hit]]:
        """Answer many queries at once: one encoder call, one search call per shard and ranker.
        `where` (index/metadata.py) ranks only the chunks whose documents it selects; `alpha`
        weights dense against BM25 in hybrid fusion (retrieve/strategy.py).

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
        rerank = self.rerank.enabled if rerank is None else rerank
        if rerank and self.reranker is None:
            raise ModelError(
                "reranking was asked for but no reranker is loaded (LLMFRAME_RERANKER_MODEL)"
            )
        checked = self.check_queries(queries, mode, truncate)
        results = self.first_stage(checked, mode, self.rerank.wanted(top_k, rerank), level, where, alpha)
        if rerank:
            results = [
                self.rerank.apply(q, hits, self.reranker.score(q, self.rerank.passages(hits)), weight=self.rerank_weight)
                if hits else hits
                for q, hits in zip(checked, results)
            ]
        return [hits[:top_k] for hits in results]

    def check_queries(self, queries: Sequence[str], mode: SearchMode, truncate: bool = False) -> list[str]:
        """The queries stripped and checked for the mode (too long for the embedder: an error
        unless `truncate`)."""
        uses_dense = mode.uses_dense
        if mode.uses_graph and self.graph is None:
            raise StrategyError("retrieval_strategy", GRAPH_MISSING)
        if uses_dense and self.embedder is None:
            raise ModelError(f"mode {mode.value!r} needs an embedder; none was loaded")
        check = self.embedder.check_query if uses_dense and not truncate else check_query_text
        return [check(q) for q in queries]

    def first_stage(
        self, checked: Sequence[str], mode: SearchMode, top_k: int, level: str | ResultLevel = ResultLevel.DOCUMENT,
        where: Filter | None = None, alpha: float | None = None,
    ) -> list[list[Hit]]:
        """Each checked query's top `top_k` hits of the mode, before any reranking."""
        if not checked:
            return []
        if mode.uses_bm25 and self.bm25_problem is not None:
            raise IndexLoadError(self.bm25_problem)
        plan = retrieval_plan(
            checked, mode, ResultLevel.from_str(level), top_k, [len(s) for s in self.shards],
            self.retrieval.fusion.with_alpha(alpha),
            together=[range(len(self.shards))],  # one process holds them all: searched as one
            where=where,
        )
        return run_plan(plan, _DirectBackend(self))


class _DirectBackend(DirectCalls):
    """The plan's requests (retrieve/drive.py: PlanBackend) answered by direct calls."""

    def __init__(self, pipeline: Pipeline) -> None:
        self.pipeline = pipeline

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        return self.pipeline.embedder.embed(list(texts))

    def search(self, shard: int, ranker: Ranker, inputs: Any, k: int, where: Filter | None = None) -> ShardResults:
        return search_shard(self.pipeline.shards[shard], ranker, inputs, k, where)

    def search_together(
        self, shards: Sequence[int], ranker: Ranker, inputs: Any, k: int, where: Filter | None = None
    ) -> ShardResults:
        held = [(s, self.pipeline.shards[s]) for s in shards]
        return search_together(held, Ranker.from_str(ranker) is Ranker.BM25, inputs, k, where)

    def search_graph(self, queries: Sequence[str], k: int, level: ResultLevel, where: Filter | None = None,
                     vectors: np.ndarray | None = None) -> ShardResults:
        if self.pipeline.graph is None:
            raise StrategyError("retrieval_strategy", GRAPH_MISSING)
        return self.pipeline.graph.search(queries, k, level, where, vectors)

    def read_chunks(self, shard: int, rows: Sequence[int]) -> list[Chunk]:
        return self.pipeline.shards[shard].chunks(list(rows))
