"""The API's request paths, composed once over abstract stages.

    search: check -> retrieve (top max(k, rerank depth)) -> [rerank the head] -> top k
    query:  search -> generate an answer with citations (whole, or as events)

`Stages` is implemented by Serve deployment handles (serve/ingress.py) and by direct in-process
calls (serve/local.py); the ranking itself lives in the core (retrieve/plan.py, rerank.py).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, AsyncIterator, Protocol

from llmframe_ray.config import Settings
from llmframe_ray.errors import LLMFrameError, QueryError
from llmframe_ray.retrieve.plan import ResultLevel
from llmframe_ray.retrieve.rerank import passage_of, rerank_hits
from llmframe_ray.serve.schemas import (
    AnswerOut,
    HitOut,
    QueryRequest,
    QueryResponse,
    SearchRequest,
    SearchResponse,
)
from llmframe_ray.types import Answer, Hit, SearchMode


class FieldError(LLMFrameError, ValueError):
    """A request field whose value this server cannot serve (HTTP 422)."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}")


class StageUnavailableError(LLMFrameError):
    """A stage of the app could not answer (HTTP 503)."""


@dataclass(frozen=True)
class Retrieved:
    version: str
    hits: list[Hit]


class Stages(Protocol):
    has_reranker: bool

    async def retrieve(self, query: str, mode: SearchMode, level: ResultLevel, top_k: int) -> Retrieved: ...

    async def rerank_scores(self, query: str, passages: list[str]) -> list[float]: ...

    async def answer(self, question: str, hits: list[Hit]) -> Answer: ...

    def answer_events(self, question: str, hits: list[Hit]) -> AsyncIterator[str | Answer]: ...

    async def readiness(self) -> dict[str, str]: ...

    async def index_info(self) -> dict[str, Any]: ...

    async def reload(self) -> dict[str, Any]: ...

    async def stats(self) -> dict[str, Any]: ...


def _ms(start: float) -> float:
    return round((time.perf_counter() - start) * 1000, 2)


@dataclass(frozen=True)
class Ranked:
    version: str
    mode: SearchMode
    reranked: bool
    hits: list[Hit]
    timings_ms: dict[str, float]


class RagService:
    def __init__(self, stages: Stages, settings: Settings) -> None:
        self.stages = stages
        self.settings = settings

    @property
    def default_mode(self) -> SearchMode:
        return SearchMode.HYBRID if self.settings.hybrid_search_enabled else SearchMode.DENSE

    async def search(self, request: SearchRequest) -> SearchResponse:
        ranked = await self._ranked(
            "query", request.query, request.mode, ResultLevel(request.level), request.top_k, request.rerank
        )
        return SearchResponse(
            version=ranked.version,
            mode=ranked.mode.value,
            level=request.level,
            reranked=ranked.reranked,
            hits=[HitOut.of(h) for h in ranked.hits],
            timings_ms=ranked.timings_ms,
        )

    async def query(self, request: QueryRequest) -> QueryResponse:
        ranked = await self.retrieve_for_answer(request)
        start = time.perf_counter()
        answer = await self.stages.answer(request.question, ranked.hits)
        timings = {**ranked.timings_ms, "generate": _ms(start)}
        timings["total"] = round(sum(v for k, v in timings.items() if k != "total"), 2)
        return QueryResponse(
            **AnswerOut.of(answer).model_dump(),
            version=ranked.version,
            mode=ranked.mode.value,
            reranked=ranked.reranked,
            timings_ms=timings,
        )

    async def retrieve_for_answer(self, request: QueryRequest) -> Ranked:
        """The passages an answer is written from (errors here come before any streamed byte)."""
        return await self._ranked(
            "question", request.question, request.mode, ResultLevel.DOCUMENT, request.top_k, request.rerank
        )

    async def answer_events(self, question: str, ranked: Ranked) -> AsyncIterator[tuple[str, dict]]:
        """Server-Sent Event payloads: `delta` {text}..., `citations`, then `done`."""
        start = time.perf_counter()
        async for item in self.stages.answer_events(question, ranked.hits):
            if isinstance(item, str):
                yield "delta", {"text": item}
                continue
            answer = AnswerOut.of(item)
            yield "citations", {"cited": answer.cited, "citations": [c.model_dump() for c in answer.citations]}
            timings = {**ranked.timings_ms, "generate": _ms(start)}
            timings["total"] = round(sum(v for k, v in timings.items() if k != "total"), 2)
            yield "done", {
                "provider": answer.provider,
                "model": answer.model,
                "finish_reason": answer.finish_reason,
                "version": ranked.version,
                "mode": ranked.mode.value,
                "reranked": ranked.reranked,
                "timings_ms": timings,
            }

    async def _ranked(
        self, field: str, text: str, mode: str | None, level: ResultLevel, top_k: int, rerank: bool | None
    ) -> Ranked:
        settings = self.settings
        if len(text) > settings.max_query_chars:
            raise FieldError(field, f"is {len(text)} characters long; the limit is {settings.max_query_chars} (LLMFRAME_MAX_QUERY_CHARS)")
        if top_k > settings.max_top_k:
            raise FieldError("top_k", f"must be at most {settings.max_top_k} (LLMFRAME_MAX_TOP_K), got {top_k}")
        search_mode = self.default_mode if mode is None else SearchMode.from_str(mode)
        rerank = settings.reranker_enabled if rerank is None else rerank
        if rerank and not self.stages.has_reranker:
            raise FieldError(
                "rerank", "this server has no reranker (deploy it with a reranker model: LLMFRAME_RERANKER_ENABLED=true)"
            )
        depth = settings.reranker_depth
        start = time.perf_counter()
        try:
            retrieved = await self.stages.retrieve(
                text, search_mode, level, max(top_k, depth) if rerank else top_k
            )
        except QueryError as exc:
            raise FieldError(field, str(exc)) from None
        timings = {"retrieve": _ms(start)}
        hits = retrieved.hits
        if rerank and hits:
            start = time.perf_counter()
            head = hits[:depth]
            scores = await self.stages.rerank_scores(text, [passage_of(h) for h in head])
            hits = rerank_hits(text, hits, None, depth, settings.reranker_fusion_k, scores=scores)
            timings["rerank"] = _ms(start)
        timings["total"] = round(sum(timings.values()), 2)
        return Ranked(retrieved.version, search_mode, rerank, hits[:top_k], timings)

