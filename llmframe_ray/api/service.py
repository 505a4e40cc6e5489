"""The API's request paths, composed once over abstract stages.

    search: check -> retrieve (top max(k, rerank depth)) -> [rerank the head] -> top k
    query:  search -> prompt with numbered context (+ session history) -> provider chain
            -> answer with its [n] markers mapped to the hits, usage and cost (whole, or as events)

`Stages` is implemented by Serve deployment handles (serve/ingress.py) and by direct in-process
calls (serve/local.py); the ranking itself lives in the core (retrieve/plan.py, rerank.py).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, AsyncIterator

from llmframe_ray.api.failures import BudgetExceededError, FieldError
from llmframe_ray.api import metrics
from llmframe_ray.api.ranking import Ask, Ranked, Ranking, ms, with_total
from llmframe_ray.api.stages import Stages
from llmframe_ray.index.metadata import Filter
from llmframe_ray.retrieve.plan import ResultLevel
from llmframe_ray.generate.base import Message, StreamEnd, Usage
from llmframe_ray.api.params import ServiceParams
from llmframe_ray.generate.costs import PriceTable
from llmframe_ray.generate.prompts import SYSTEM_PROMPT, build_messages, cite
from llmframe_ray.generate.sessions import estimate_tokens, seconds_to_utc_midnight
from llmframe_ray.api.openai_compat import (
    FINISH,
    ChatRequest,
    ChatTurnError,
    chat_turn,
    chunk_body,
    completion_body,
    extras,
    new_id,
    usage_of,
)
from llmframe_ray.api.schemas import (
    AnswerOut,
    UsageOut,
    HitOut,
    QueryRequest,
    QueryResponse,
    SearchRequest,
    SearchResponse,
)
from llmframe_ray.types import Answer, Hit, SearchMode

logger = logging.getLogger(__name__)


STREAM_MODEL = "llmframe-rag"  # chunks before the last: the answering model is known at the end


async def prepend(first: Any, rest: AsyncIterator[Any]) -> AsyncIterator[Any]:
    """`first`, then the items of `rest`."""
    yield first
    async for item in rest:
        yield item


def _generated(ranked: Ranked, start: float) -> dict[str, float]:
    """The request's timings with the generation that began at `start` (observed for /metrics)."""
    generate = ms(start)
    metrics.observe_stage("generate", generate / 1000.0)
    return with_total({**ranked.timings_ms, "generate": generate})


def _session_key(owner: str, session_id: str | None) -> str | None:
    return None if session_id is None else f"{owner}/{session_id}"


@dataclass(frozen=True)
class ChatTurn:
    messages: list[Message]
    system: str
    max_tokens: int
    temperature: float
    ranked: Ranked


class RagService:
    def __init__(self, stages: Stages, params: ServiceParams) -> None:
        self.stages = stages
        self.params = params
        self.prices = PriceTable.from_json(params.generation.prices)
        self.ranking = Ranking(stages, params)

    @property
    def default_mode(self) -> SearchMode:
        return self.params.default_mode

    async def search(self, request: SearchRequest, where: Filter | None = None, owner: str = "") -> SearchResponse:
        """`where`: the caller's namespace and the request's filter (api/tenants.py)."""
        ranked = await self._ranked(Ask.of(request, "query", request.query, ResultLevel(request.level), where), owner)
        return SearchResponse(
            version=ranked.version,
            mode=ranked.mode.value,
            retrieval_strategy=ranked.strategy.value,
            level=request.level,
            reranked=ranked.reranked,
            rewrites=list(ranked.rewrites),
            hits=[HitOut.of(h) for h in ranked.hits],
            timings_ms=ranked.timings_ms,
            warnings=list(ranked.warnings),
        )

    async def query(self, request: QueryRequest, owner: str = "", where: Filter | None = None) -> QueryResponse:
        """`owner` (a digest of the caller's API key) keys the session with the client's id."""
        await self._admit(owner)
        session = _session_key(owner, request.session_id)
        history = await self._history(session)
        ranked = await self.retrieve_for_answer(request, where, owner, history)
        start = time.perf_counter()
        completion = await self.stages.generate(
            build_messages(request.question, ranked.hits, history), SYSTEM_PROMPT,
            self.params.generation.max_tokens, self.params.generation.temperature,
        )
        await self._charge(owner, completion.usage)
        answer = self._answer(completion.text, completion.usage, completion.model, completion.provider, completion.finish_reason, ranked.hits)
        await self._remember(session, request.question, completion.text)
        return QueryResponse(
            **answer.model_dump(),
            session_id=request.session_id,
            version=ranked.version,
            mode=ranked.mode.value,
            retrieval_strategy=ranked.strategy.value,
            reranked=ranked.reranked,
            rewrites=list(ranked.rewrites),
            timings_ms=_generated(ranked, start),
            warnings=list(ranked.warnings),
        )

    async def retrieve_for_answer(
        self, request: QueryRequest, where: Filter | None = None, owner: str = "", history: list[Message] | None = None
    ) -> Ranked:
        """The passages an answer is written from (errors here come before any streamed byte);
        `history`: the session's turns (read here when not given), for conversational rewriting."""
        if history is None:
            history = await self._history(_session_key(owner, request.session_id))
        return await self._ranked(Ask.of(request, "question", request.question, ResultLevel.DOCUMENT, where, history), owner)

    async def answer_events(self, request: QueryRequest, ranked: Ranked, owner: str = "") -> AsyncIterator[tuple[str, dict]]:
        """Server-Sent Event payloads: `delta` {text}..., `citations`, then `done`."""
        await self._admit(owner)
        session = _session_key(owner, request.session_id)
        history = await self._history(session)
        messages = build_messages(request.question, ranked.hits, history)
        start = time.perf_counter()
        parts: list[str] = []
        stream = self.stages.generate_stream(
            messages, SYSTEM_PROMPT, self.params.generation.max_tokens, self.params.generation.temperature
        )
        async for item in self._metered(owner, SYSTEM_PROMPT, messages, parts, stream):
            if isinstance(item, str):
                parts.append(item)
                yield "delta", {"text": item}
                continue
            text = "".join(parts)
            answer = self._answer(text, item.usage, item.model, item.provider, item.finish_reason, ranked.hits)
            await self._remember(session, request.question, text)
            yield "citations", {"cited": answer.cited, "citations": [c.model_dump() for c in answer.citations]}
            yield "done", {
                "provider": answer.provider,
                "model": answer.model,
                "finish_reason": answer.finish_reason,
                "usage": answer.usage.model_dump(),
                "session_id": request.session_id,
                "version": ranked.version,
                "mode": ranked.mode.value,
                "reranked": ranked.reranked,
                "retrieval_strategy": ranked.strategy.value,
                "rewrites": list(ranked.rewrites),
                "timings_ms": _generated(ranked, start),
            }

    async def chat_turn(self, request: ChatRequest, owner: str = "", where: Filter | None = None) -> ChatTurn:
        """Question, history, system prompt and passages of a chat request (errors before any byte)."""
        await self._admit(owner)
        try:
            question, history, extra = chat_turn(request, self.params.session_token_budget)
        except ChatTurnError as exc:
            raise FieldError(exc.field, str(exc)) from None
        ranked = await self._ranked(Ask.of(request, "messages", question, ResultLevel.DOCUMENT, where, history), owner)
        system = f"{SYSTEM_PROMPT}\n\n{extra}" if extra else SYSTEM_PROMPT
        cap = self.params.generation.max_tokens  # LLMFRAME_LLM_MAX_TOKENS bounds what a request may ask
        asked = next((v for v in (request.max_completion_tokens, request.max_tokens) if v is not None), cap)
        max_tokens = min(asked, cap)
        temperature = self.params.generation.temperature if request.temperature is None else request.temperature
        return ChatTurn(build_messages(question, ranked.hits, history), system, max_tokens, temperature, ranked)

    async def chat(self, request: ChatRequest, owner: str = "", where: Filter | None = None) -> dict[str, Any]:
        turn = await self.chat_turn(request, owner, where)
        start = time.perf_counter()
        c = await self.stages.generate(turn.messages, turn.system, turn.max_tokens, turn.temperature)
        await self._charge(owner, c.usage)
        answer = self._answer(c.text, c.usage, c.model, c.provider, c.finish_reason, turn.ranked.hits)
        return completion_body(new_id(), answer, self._meta(turn.ranked, start))

    async def chat_chunks(self, request: ChatRequest, turn: ChatTurn, owner: str = "") -> AsyncIterator[dict[str, Any]]:
        """`chat.completion.chunk` bodies: the role, the text deltas, the finish (with the
        citations), and the usage when the client asked for it."""
        chat_id, start, parts = new_id(), time.perf_counter(), []
        stream = self._metered(
            owner, turn.system, turn.messages, parts,
            self.stages.generate_stream(turn.messages, turn.system, turn.max_tokens, turn.temperature),
        )
        first = await anext(stream)  # the provider answered before the first chunk goes out
        yield chunk_body(chat_id, STREAM_MODEL, {"role": "assistant", "content": ""})
        async for item in prepend(first, stream):
            if isinstance(item, str):
                parts.append(item)
                yield chunk_body(chat_id, STREAM_MODEL, {"content": item})
                continue
            answer = self._answer("".join(parts), item.usage, item.model, item.provider, item.finish_reason, turn.ranked.hits)
            finish = FINISH.get(answer.finish_reason, answer.finish_reason)
            yield chunk_body(chat_id, answer.model, {}, finish, **extras(answer, self._meta(turn.ranked, start)))
            if request.stream_options is not None and request.stream_options.include_usage:
                yield {**chunk_body(chat_id, answer.model, {}), "choices": [], "usage": usage_of(answer)}

    @staticmethod
    def _meta(ranked: Ranked, start: float) -> dict[str, Any]:
        timings = _generated(ranked, start)
        return {
            "version": ranked.version, "mode": ranked.mode.value, "retrieval_strategy": ranked.strategy.value,
            "reranked": ranked.reranked, "rewrites": list(ranked.rewrites), "timings_ms": timings,
        }

    def _answer(
        self, text: str, usage: Usage, model: str, provider: str, finish_reason: str, hits: list[Hit]
    ) -> AnswerOut:
        """The answer with its [n] markers mapped to the hits, its usage and cost."""
        answer = Answer(text, cite(text, hits), provider, model, finish_reason)
        cost = self.prices.cost(model, usage)
        metrics.observe_answer(provider, model, finish_reason, usage.input_tokens, usage.output_tokens, cost)
        return AnswerOut.of(answer, UsageOut(input_tokens=usage.input_tokens, output_tokens=usage.output_tokens, cost_usd=cost))

    async def _admit(self, owner: str) -> None:
        """Refuse a generation when the caller's key has spent LLMFRAME_DAILY_TOKENS_PER_KEY."""
        budget = self.params.daily_tokens_per_key
        if budget and owner and await self.stages.tokens_spent(owner) >= budget:
            raise BudgetExceededError(
                f"this API key has used its {budget} generation tokens for today "
                "(LLMFRAME_DAILY_TOKENS_PER_KEY); the count restarts at 00:00 UTC",
                seconds_to_utc_midnight(time.time()),
            )

    async def _charge(self, owner: str, usage: Usage) -> None:
        await self._charge_tokens(owner, usage.input_tokens + usage.output_tokens)

    async def _charge_tokens(self, owner: str, tokens: int) -> None:
        """Count tokens against the key's budget; a failure to count never fails the answer."""
        if not (self.params.daily_tokens_per_key and owner):
            return
        try:
            await self.stages.charge_tokens(owner, tokens)
        except Exception as exc:  # noqa: BLE001 - the answer was produced (and billed) already
            logger.warning("could not count %d tokens against a key's budget: %s", tokens, exc)

    async def _metered(
        self, owner: str, system: str, messages: list[Message], parts: list[str], stream: AsyncIterator[str | StreamEnd]
    ) -> AsyncIterator[str | StreamEnd]:
        """`stream`, with its tokens counted against the key's budget: the provider's usage at
        its end; when it ends early (the client left, the stream broke), an estimate from the
        prompt and the text produced so far (`parts`, which the caller fills)."""
        received = counted = False
        try:
            async for item in stream:
                received = True
                if isinstance(item, StreamEnd):
                    counted = True
                    await self._charge(owner, item.usage)
                yield item
        finally:
            if received and not counted:
                prompt = system + "".join(m.content for m in messages)
                await self._charge_tokens(owner, estimate_tokens(prompt) + estimate_tokens("".join(parts)))

    async def _ranked(self, ask: Ask, owner: str) -> Ranked:
        """The request's passages; the LLM tokens of its query rewriting count against the key."""
        ranked = await self.ranking.ranked(ask)
        metrics.observe_ranking(ranked.version, ranked.mode.value, ranked.strategy.value, ranked.timings_ms)
        if ranked.usage is not None:
            await self._charge(owner, ranked.usage)
        return ranked

    async def _history(self, session_id: str | None) -> list[Message]:
        return [] if session_id is None else await self.stages.session_history(session_id)

    async def _remember(self, session_id: str | None, question: str, answer: str) -> None:
        if session_id is not None:
            await self.stages.session_append(session_id, question, answer)
