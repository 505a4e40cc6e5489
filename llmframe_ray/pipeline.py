"""The retrieval stages composed in one process, without Ray.

    query -> check -> retrieval plan (retrieve/plan.py) answered by direct calls -> [rerank]

The Serve Retriever runs the same plan with deployment handle calls.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence


from llmframe_ray.config import Settings
from llmframe_ray.errors import IndexLoadError, ModelError
from llmframe_ray.index.shard import IndexShard
from llmframe_ray.index.versions import IndexDirectory
from llmframe_ray.models.cross_encoder import CrossEncoder
from llmframe_ray.models.embedder import Embedder, check_query_text
from llmframe_ray.retrieve.plan import (
    BM25,
    DENSE,
    Encode,
    FusionSettings,
    ReadChunks,
    Request,
    ResultLevel,
    SearchShard,
    ShardFacts,
    bm25_consistency_problem,
    retrieval_plan,
    run_plan,
    search_shard,
)
from llmframe_ray.retrieve.rerank import rerank_hits
from llmframe_ray.types import Hit, SearchMode


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
        self.fusion = fusion_settings(settings)
        if embedder is not None:
            check_model(self.shards[0].manifest.model, embedder.info())
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

        if mode in (SearchMode.BM25, SearchMode.HYBRID):
            problem = bm25_consistency_problem([ShardFacts.of(s) for s in self.shards])
            if problem is not None:
                raise IndexLoadError(problem)
        plan = retrieval_plan(
            checked, mode, level, wanted, [len(s) for s in self.shards], self.fusion
        )
        results = run_plan(plan, self.answer)
        if rerank:
            results = [
                rerank_hits(q, hits, self.reranker, self.settings.reranker_depth, self.settings.reranker_fusion_k)
                for q, hits in zip(checked, results)
            ]
        return [hits[:top_k] for hits in results]

    def answer(self, request: Request) -> Any:
        """Answer one request of a retrieval plan from the loaded shards and models."""
        if isinstance(request, Encode):
            return self.embedder.embed(list(request.texts))
        if isinstance(request, SearchShard):
            return search_shard(self.shards[request.shard], request.ranker, request.inputs, request.k)
        if isinstance(request, ReadChunks):
            return self.shards[request.shard].chunks(list(request.rows))
        raise TypeError(f"not a retrieval plan request: {request!r}")


def fusion_settings(settings: Settings) -> FusionSettings:
    return FusionSettings(
        rrf_k=settings.rrf_k,
        weights={BM25: settings.bm25_weight, DENSE: settings.dense_weight},
        fusion_depth=settings.fusion_depth,
    )


def check_model(model: Mapping[str, Any], embedder: Mapping[str, Any]) -> None:
    """The index's embedding model (`model`, from its manifest) must be the embedder's (`info()`)."""
    name, dim = model.get("name"), model.get("dim")
    # a hosted model's dimension may be unknown (0) until its first call
    if name != embedder["name"] or (embedder["dim"] and dim != embedder["dim"]):
        raise ModelError(
            f"the index was built with embedding model {name!r} (dim {dim}), but the loaded "
            f"embedder is {embedder['name']!r} (dim {embedder['dim']}); rebuild the index or change "
            "EMBEDDING_PROVIDER"
        )
