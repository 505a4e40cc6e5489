"""The API's stages answered in this process (no Ray): for tests, benchmarks and debugging.

The same RagService and HTTP app run over these as over the Serve deployments, so the in-process
path and the served one differ only in how a stage is reached.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, AsyncIterator, Mapping, Sequence

import numpy as np

from llmframe_ray.generate.base import Completion, Message, Provider, StreamEnd, Usage
from llmframe_ray.generate.chain import ProviderParams, provider_chain
from llmframe_ray.generate.extractive_provider import ExtractiveProvider
from llmframe_ray.generate.fallback import FallbackProvider
from llmframe_ray.generate.extracting import extract_sentences
from llmframe_ray.generate.rewriting import has_llm, rewrite_query
from llmframe_ray.generate.sessions import SessionParams, SessionStore, TokenLedger
from llmframe_ray.index.metadata import Filter
from llmframe_ray.index.domain import shards_similarity
from llmframe_ray.index.versions import IndexDirectory
from llmframe_ray.models.cross_encoder import CrossEncoder
from llmframe_ray.models.embedder import EmbedderParams, embed_each, load_embedder
from llmframe_ray.retrieve.params import RetrievalParams
from llmframe_ray.retrieve.pipeline import Pipeline
from llmframe_ray.retrieve.plan import ResultLevel
from llmframe_ray.retrieve.rewrite import QueryRewrite, Rewrite, RewriteParams
from llmframe_ray.api.stages import Retrieved
from llmframe_ray.types import SearchMode


class LocalStages:
    def __init__(
        self,
        index_dir: Path,
        pipeline: Pipeline,
        version: str,
        reranker: CrossEncoder | None = None,
        provider: Provider | None = None,
        sessions: SessionStore | None = None,
    ) -> None:
        self.index = IndexDirectory(index_dir)
        self.pipeline = pipeline
        self.version = version
        self.reranker = reranker
        self.provider = provider if provider is not None else FallbackProvider([ExtractiveProvider()])
        self.sessions = sessions if sessions is not None else SessionStore(2000, 1000)
        self.ledger = TokenLedger()
        self.has_reranker = reranker is not None
        self._lock = asyncio.Lock()  # one model call at a time, as one replica would

    @classmethod
    def open(
        cls,
        index_dir: Path,
        embedder: EmbedderParams,
        retrieval: RetrievalParams,
        providers: ProviderParams,
        sessions: SessionParams,
        reranker: CrossEncoder | None = None,
    ) -> LocalStages:
        loaded = IndexDirectory(index_dir).load(memory_limit_mb=retrieval.memory_limit_mb)
        pipeline = Pipeline(loaded.shards, load_embedder(embedder), retrieval)
        pipeline.load_graph(loaded.path, loaded.shard_ids)
        store = SessionStore(sessions.token_budget, sessions.max_sessions)
        return cls(index_dir, pipeline, loaded.version, reranker, provider_chain(providers), store)

    async def retrieve(
        self, query: str, mode: SearchMode, level: ResultLevel, top_k: int, where: Filter | None = None,
        alpha: float | None = None,
    ) -> Retrieved:
        # In this thread, like a Serve replica's retrieval: a search is a few milliseconds, and
        # a hand-off to another thread cost up to 2 (serve/retriever.py). Yield first, so that
        # concurrent callers take turns and a caller's latency includes its wait.
        await asyncio.sleep(0)
        hits = self.pipeline.search(query, mode, top_k, level, rerank=False, where=where, alpha=alpha)
        return Retrieved(self.version, hits)

    async def embed_texts(self, texts: list[str]) -> list[np.ndarray | None]:
        encoded = embed_each(self.pipeline.embedder, texts)
        return [None if isinstance(v, BaseException) else v for v in encoded]

    async def extract_sentences(
        self, question: str, passages: list[list[str]], budget_tokens: int, timeout_s: float
    ) -> tuple[list[bool], Usage] | None:
        if not has_llm(self.provider):
            return None
        keep, usage, _, _ = await extract_sentences(self.provider, question, passages, budget_tokens, timeout_s)
        return keep, usage

    async def rewrite(
        self, kind: QueryRewrite, question: str, history: Sequence[Message], params: RewriteParams
    ) -> Rewrite:
        return await rewrite_query(self.provider, kind, question, history, params)

    async def rerank_scores(self, query: str, passages: list[str]) -> list[float]:
        async with self._lock:
            scores = await asyncio.to_thread(self.reranker.score, query, passages)
        return [float(s) for s in scores]

    async def rerank_card(self) -> Mapping[str, Any]:
        return dict(getattr(self.reranker, "card", None) or {})

    async def rerank_similarity(self, version: str) -> float | None:
        return await asyncio.to_thread(shards_similarity, getattr(self.reranker, "card", {}), self.pipeline.shards)

    async def generate(self, messages: list[Message], system: str, max_tokens: int, temperature: float) -> Completion:
        return await self.provider.generate(messages, system=system, max_tokens=max_tokens, temperature=temperature)

    async def generate_stream(
        self, messages: list[Message], system: str, max_tokens: int, temperature: float
    ) -> AsyncIterator[str | StreamEnd]:
        async for item in self.provider.stream(messages, system=system, max_tokens=max_tokens, temperature=temperature):
            yield item

    async def session_history(self, session_id: str) -> list[Message]:
        return self.sessions.history(session_id)

    async def session_append(self, session_id: str, question: str, answer: str) -> None:
        self.sessions.append(session_id, question, answer)

    async def tokens_spent(self, owner: str) -> int:
        return self.ledger.spent(owner)

    async def charge_tokens(self, owner: str, tokens: int) -> None:
        self.ledger.charge(owner, tokens)

    async def readiness(self) -> dict[str, str]:
        return {"pipeline": "ready"}

    async def index_info(self) -> dict[str, Any]:
        return self.index.describe(self.version)

    async def graph_query(self, method: str, args: dict[str, Any]) -> Any:
        from llmframe_ray.graph.inspect import graph_query

        return graph_query(self.pipeline.graph, method, args)

    async def reload(self) -> dict[str, Any]:
        return {"version": self.version, "switched": False, "reason": "the in-process app does not reload"}

    async def stats(self) -> dict[str, Any]:
        return {}
