"""Ingress: the FastAPI app (serve/http.py) with its stages reached through deployment handles."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, AsyncIterator, Awaitable, Callable, Mapping, Sequence

import numpy as np
from ray import serve
from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError
from ray.serve.exceptions import BackPressureError, DeploymentUnavailableError
from ray.serve.handle import DeploymentHandle

from llmframe_ray.errors import LLMFrameError
from llmframe_ray.index.metadata import Filter
from llmframe_ray.index.domain import similarity
from llmframe_ray.retrieve.plan import ResultLevel
from llmframe_ray.api.auth import ApiKeys
from llmframe_ray.api.documents import DocumentLimits, DocumentsApi
from llmframe_ray.api.http import create_app
from llmframe_ray.api.params import ServiceParams
from llmframe_ray.serve.metrics_hub import scrape, start_pushing
from llmframe_ray.serve.replica import unwrap
from llmframe_ray.serve.retriever import RetrieverArgs, RetrieverCore
from llmframe_ray.api.failures import StageTimeoutError, StageUnavailableError
from llmframe_ray.api.service import RagService
from llmframe_ray.api.stages import Retrieved
from llmframe_ray.generate.base import Completion, Message, StreamEnd, Usage
from llmframe_ray.retrieve.rewrite import QueryRewrite, Rewrite, RewriteParams
from llmframe_ray.types import SearchMode

logger = logging.getLogger(__name__)
LOST = (RayActorError, ActorDiedError, ActorUnavailableError)
ATTEMPTS = 2  # a call whose replica died is sent once more (Serve routes it to a live one)
PROBE_TIMEOUT_S = 5.0


class ServeStages:
    """The RagService stages as calls to the app's deployments."""

    def __init__(
        self,
        retriever: DeploymentHandle | RetrieverCore,
        reranker: DeploymentHandle | None,
        generator: DeploymentHandle,
        sessions: DeploymentHandle,
        probes: Mapping[str, DeploymentHandle],
        batched: Mapping[str, DeploymentHandle],
        timeout_s: float = 30.0,
    ) -> None:
        self.timeout_s = timeout_s
        self.retriever, self.reranker, self.generator, self.sessions = retriever, reranker, generator, sessions
        self.probes, self.batched = dict(probes), dict(batched)
        self.has_reranker = reranker is not None

    async def _call(self, stage: str, send: Callable[[], Awaitable[Any]], *, bounded: bool = True) -> Any:
        """`send()`'s answer; sent once more if its replica died; cancelled after the stage
        timeout when `bounded` (a generation is bounded by the request's deadline instead)."""
        timeout_s = self.timeout_s if bounded else None
        attempt = 1
        while True:
            try:
                return await asyncio.wait_for(send(), timeout_s)
            except asyncio.TimeoutError:
                raise StageTimeoutError(
                    f"the {stage} stage did not answer within {timeout_s:g} s (LLMFRAME_STAGE_TIMEOUT_S)"
                ) from None
            except Exception as exc:
                cause = unwrap(exc)
                if isinstance(cause, LLMFrameError):
                    raise cause from None
                if isinstance(cause, (BackPressureError, DeploymentUnavailableError)):
                    logger.warning("the %s stage refused a request: %s", stage, cause)
                    raise StageUnavailableError(f"the {stage} stage is overloaded; retry shortly") from None
                if not isinstance(cause, LOST) and not isinstance(exc, LOST):
                    raise
                if attempt >= ATTEMPTS:
                    logger.error("the %s stage is unavailable: %s", stage, cause)  # Ray's text stays in the log
                    raise StageUnavailableError(f"the {stage} stage is unavailable; retry shortly") from None
                attempt += 1

    async def retrieve(
        self, query: str, mode: SearchMode, level: ResultLevel, top_k: int, where: Filter | None = None,
        alpha: float | None = None,
    ) -> Retrieved:
        if isinstance(self.retriever, RetrieverCore):  # here; its shard groups may still be replicas
            return await self._call("retriever", lambda: self.retriever.retrieve(query, mode, level, top_k, where, alpha))
        return await self._call("retriever", lambda: self.retriever.retrieve.remote(query, mode, level, top_k, where, alpha))

    async def embed_texts(self, texts: list[str]) -> list[np.ndarray | None]:
        if isinstance(self.retriever, RetrieverCore):
            return await self._call("retriever", lambda: self.retriever.embed_texts(texts))
        return await self._call("retriever", lambda: self.retriever.embed_texts.remote(texts))

    async def extract_sentences(
        self, question: str, passages: list[list[str]], budget_tokens: int, timeout_s: float
    ) -> tuple[list[bool], Usage] | None:
        send = lambda: self.generator.extract.remote(question, passages, budget_tokens, timeout_s)  # noqa: E731
        return await self._call("generator", send)

    async def rewrite(self, kind: QueryRewrite, question: str, history: Sequence[Message], params: RewriteParams) -> Rewrite:
        send = lambda: self.generator.rewrite.remote(kind, question, list(history), params)  # noqa: E731
        return await self._call("generator", send)

    async def rerank_scores(self, query: str, passages: list[str]) -> list[float]:
        return await self._call("reranker", lambda: self.reranker.score.remote(query, passages))

    async def rerank_card(self) -> Mapping[str, Any]:
        return await self._call("reranker", lambda: self.reranker.card.remote())

    async def rerank_similarity(self, version: str) -> float | None:
        """The Reranker's card against the version's centroid (the Retriever reads it from disk)."""
        card = await self._call("reranker", lambda: self.reranker.card.remote())
        if isinstance(self.retriever, RetrieverCore):
            vector, model = await self.retriever.domain_centroid(version)
        else:
            vector, model = await self._call("retriever", lambda: self.retriever.domain_centroid.remote(version))
        return similarity(card, None if vector is None else np.asarray(vector, dtype=np.float32), model)

    async def generate(self, messages: list[Message], system: str, max_tokens: int, temperature: float) -> Completion:
        # retried only when the replica died; provider failures were handled by the chain
        send = lambda: self.generator.generate.remote(messages, system, max_tokens, temperature)  # noqa: E731
        return await self._call("generator", send, bounded=False)

    async def generate_stream(
        self, messages: list[Message], system: str, max_tokens: int, temperature: float
    ) -> AsyncIterator[str | StreamEnd]:
        stream = self.generator.options(stream=True).stream.remote(messages, system, max_tokens, temperature)
        try:
            async for item in stream:
                yield item
        except Exception as exc:
            cause = unwrap(exc)
            if isinstance(cause, LLMFrameError):
                raise cause from None
            logger.error("the generator stream failed: %s", cause)
            raise StageUnavailableError("the generator stream failed") from None

    async def session_history(self, session_id: str) -> list[Message]:
        return await self._call("sessions", lambda: self.sessions.history.remote(session_id))

    async def session_append(self, session_id: str, question: str, answer: str) -> None:
        await self._call("sessions", lambda: self.sessions.append.remote(session_id, question, answer))

    async def tokens_spent(self, owner: str) -> int:
        return await self._call("sessions", lambda: self.sessions.tokens_spent.remote(owner))

    async def charge_tokens(self, owner: str, tokens: int) -> None:
        await self._call("sessions", lambda: self.sessions.charge_tokens.remote(owner, tokens))

    async def readiness(self) -> dict[str, str]:
        async def probe(handle: Any) -> str:
            if isinstance(handle, RetrieverCore):
                return handle.ready()
            try:
                return await asyncio.wait_for(handle.ready.remote(), PROBE_TIMEOUT_S)
            except Exception as exc:
                logger.warning("readiness probe failed: %s", unwrap(exc))  # details for the operator only
                return "not ready"

        names = list(self.probes)
        states = await asyncio.gather(*(probe(self.probes[n]) for n in names))
        return dict(zip(names, states))

    async def index_info(self) -> dict[str, Any]:
        if isinstance(self.retriever, RetrieverCore):
            return self.retriever.index_info()
        return await self._call("retriever", lambda: self.retriever.index_info.remote())

    async def graph_query(self, method: str, args: dict[str, Any]) -> Any:
        if isinstance(self.retriever, RetrieverCore):
            return await self._call("retriever", lambda: self.retriever.graph_query(method, args))
        return await self._call("retriever", lambda: self.retriever.graph_query.remote(method, args))

    async def reload(self) -> dict[str, Any]:
        if isinstance(self.retriever, RetrieverCore):
            return await self.retriever.reload()
        return await self._call("retriever", lambda: self.retriever.reload.remote())

    async def stats(self) -> dict[str, Any]:
        names = list(self.batched)

        async def batch_stats(handle: Any) -> dict[str, float]:
            return handle.batch_stats() if isinstance(handle, RetrieverCore) else await handle.batch_stats.remote()

        values = await asyncio.gather(*(batch_stats(self.batched[n]) for n in names))
        usage = await self.generator.usage.remote()
        return {"note": "counters of the replica that answered, since it started", **dict(zip(names, values)), "Generator": usage}


# Short queues so that overload is answered with fast 503s instead of answers past the deadline
# (README "Reliability and security"); deployment files for replicas that mostly wait on other
# replicas raise them.
@serve.deployment(ray_actor_options={"num_cpus": 0.1}, max_ongoing_requests=64, max_queued_requests=128)
@serve.ingress()
class Ingress:
    async def __init__(
        self,
        retriever: DeploymentHandle | RetrieverArgs,
        reranker: DeploymentHandle | None,
        generator: DeploymentHandle,
        sessions: DeploymentHandle,
        probes: Mapping[str, DeploymentHandle],
        batched: Mapping[str, DeploymentHandle],
        keys: ApiKeys,
        params: ServiceParams,
        documents: tuple[str, DocumentLimits, DeploymentHandle] | None = None,  # index, limits, Writer
    ) -> None:
        self.keys = keys  # digests only: the keys themselves never leave the app builder
        self.sessions = sessions  # also sums every replica's metrics for GET /metrics
        self.documents = None
        if documents is not None:
            index_dir, limits, writer = documents
            self.documents = DocumentsApi(index_dir, limits, poke=lambda: writer.poke.remote())
        if isinstance(retriever, RetrieverArgs):  # retrieval in this process: no hop
            retriever = await RetrieverCore(retriever).start()
            probes, batched = {**probes, "Retriever": retriever}, {**batched, "Retriever": retriever}
        stages = ServeStages(retriever, reranker, generator, sessions, probes, batched, params.limits.stage_timeout_s)
        self.service = RagService(stages, params)
        start_pushing()

    def __serve_build_asgi_app__(self) -> Any:
        return create_app(self.service, self.keys, self.documents, lambda: scrape(self.sessions, "Ingress"))
