"""The HTTP API (FastAPI): routes, API-key auth, body size limit, errors, Server-Sent Events.

    GET  /healthz            alive (no key needed)
    GET  /readyz             every stage up and the index loaded (no key needed)
    GET  /v1/index           the served version's manifest
    POST /v1/index/reload    switch to the index's CURRENT version now (admin key)
    GET  /v1/stats           batch sizes seen by the batched stages, usage (admin key)
    POST /v1/search          ranked hits
    POST /v1/query           an answer with citations; `stream: true` answers as SSE

Every error body is {"error": {"type", "message", "field"}}. Per-key limits (api/limits.py)
answer 429 with Retry-After.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import Any, AsyncIterator, Awaitable, Callable, TypeVar

from fastapi import Depends, FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException as FrameworkHTTPError

from llmframe_ray.errors import IndexLoadError, LLMFrameError
from llmframe_ray.generate.base import ProviderError
from llmframe_ray.api.auth import ApiKeys, first_headers, key_owner, presented_key
from llmframe_ray.api.limits import KeyLimiter, LimitExceeded, LimitRequests
from llmframe_ray.api.openai_compat import ChatRequest
from llmframe_ray.api.page import add_metrics_and_page
from llmframe_ray.api.schemas import ErrorResponse, QueryRequest, QueryResponse, SearchRequest, SearchResponse, document_limits
from llmframe_ray.api.failures import BudgetExceededError, FieldError, NotFoundError, StageTimeoutError, StageUnavailableError
from llmframe_ray.api.documents import DocumentsApi
from llmframe_ray.api.graph_routes import add_graph_routes
from llmframe_ray.api.tenants import index_view, scope
from llmframe_ray.index.metadata import Filter
from llmframe_ray.api.service import RagService, prepend

logger = logging.getLogger(__name__)
T = TypeVar("T")
PROVIDER_FAILED = "no answer provider could answer; the server log has the details"
# `stream: true` answers as Server-Sent Events (the OpenAPI schema says so beside the JSON body)
SSE_EVENT = {
    "type": "object", "required": ["data"],
    "properties": {"event": {"type": "string"}, "data": {"type": "string", "description": "JSON"}},
}
STREAM_DOC = {"content": {"text/event-stream": {"schema": SSE_EVENT}}, "description": "JSON, or with `stream: true` Server-Sent Events"}
# Errors that the framework raises itself (no route, wrong method, a body it cannot decode),
# answered in the API's error shape like every other error.
FRAMEWORK_ERRORS = {
    400: ("invalid_request", "the body could not be read: send UTF-8 JSON"),
    404: ("not_found", "no such route; GET /openapi.json lists them"),
    405: ("method_not_allowed", "this route does not take that method"),
}


class ApiError(Exception):
    def __init__(self, status: int, kind: str, message: str, field: str | None = None, headers: dict | None = None) -> None:
        super().__init__(message)
        self.status, self.kind, self.message, self.field, self.headers = status, kind, message, field, headers


def error_response(status: int, kind: str, message: str, field: str | None = None, headers: dict | None = None) -> JSONResponse:
    body = {"error": {"type": kind, "message": message, "field": field}}
    return JSONResponse(body, status_code=status, headers=headers)


UNAUTHORIZED = "a valid API key is required (X-API-Key header or Authorization: Bearer)"


def _unauthorized() -> JSONResponse:
    return error_response(401, "unauthorized", UNAUTHORIZED, headers={"WWW-Authenticate": "Bearer"})


class BodyLimit:
    """ASGI middleware in front of the app: a /v1/ request without a valid key is refused before
    its body is read (401); a body over `limit` bytes is refused by Content-Length or as it
    streams in (413); a body that takes longer than `read_timeout_s` to arrive is refused (408),
    so slow clients cannot hold the replica's request slots."""

    def __init__(
        self, app: Any, limit: int, keys: ApiKeys | None = None, read_timeout_s: float = 10.0, upload_limit: int | None = None
    ) -> None:
        self.app, self.limit, self.keys, self.read_timeout_s = app, limit, keys, read_timeout_s
        self.upload_limit = upload_limit  # POST /v1/documents (LLMFRAME_UPLOAD_MAX_BYTES)

    def _too_large(self, size: str, limit: int, setting: str) -> JSONResponse:
        return error_response(413, "request_too_large", f"request body is {size} bytes; the limit is {limit} ({setting})")

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        if self.keys is not None and scope.get("path", "").startswith("/v1/"):
            if not self.keys.allows(presented_key(first_headers(scope))):
                await _unauthorized()(scope, receive, send)
                return
        limit, setting = self.limit, "LLMFRAME_MAX_REQUEST_BYTES"
        if self.upload_limit is not None and scope.get("method") == "POST" and scope.get("path") == "/v1/documents":
            limit, setting = self.upload_limit, "LLMFRAME_UPLOAD_MAX_BYTES"
        length = headers.get(b"content-length")
        if length is not None and length.isdigit() and int(length) > limit:
            await self._too_large(length.decode(), limit, setting)(scope, receive, send)
            return
        # Read the whole body first (it is small by design): a body sent without a length
        # is stopped as soon as it passes the limit, and the app sees it only when it fits.
        body = bytearray()
        try:
            async with asyncio.timeout(self.read_timeout_s):
                while True:
                    message = await receive()
                    if message["type"] != "http.request":  # the client went away
                        return
                    body += message.get("body", b"")
                    if len(body) > limit:
                        await self._too_large(f"more than {limit}", limit, setting)(scope, receive, send)
                        return
                    if not message.get("more_body", False):
                        break
        except TimeoutError:
            await error_response(
                408, "request_timeout",
                f"the request body did not arrive within {self.read_timeout_s:g} s (LLMFRAME_BODY_READ_TIMEOUT_S)",
            )(scope, receive, send)
            return
        replayed = False

        async def replay() -> dict:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": bytes(body), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


class Deadline:
    """ASGI middleware: a request whose response has not started within `seconds` is cancelled
    and answered 504 (a stream, once started, is bounded by its own per-item timeouts)."""

    def __init__(self, app: Any, seconds: float) -> None:
        self.app, self.seconds = app, seconds

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not self.seconds:
            await self.app(scope, receive, send)
            return
        started = asyncio.Event()

        async def watched_send(message: dict) -> None:
            if message["type"] == "http.response.start":
                started.set()
            await send(message)

        task = asyncio.ensure_future(self.app(scope, receive, watched_send))
        waiter = asyncio.ensure_future(started.wait())
        try:
            await asyncio.wait({task, waiter}, timeout=self.seconds, return_when=asyncio.FIRST_COMPLETED)
            if not started.is_set() and not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
                await error_response(
                    504, "request_timeout",
                    f"no answer within {self.seconds:g} s (LLMFRAME_REQUEST_TIMEOUT_S); the request was cancelled",
                )(scope, receive, send)
                return
            await task
        except BaseException:  # this request was cancelled (the client went away): so is its work
            task.cancel()
            raise
        finally:
            waiter.cancel()


def _field_of(loc: tuple) -> str:
    parts = [str(p) for p in loc if p != "body"]
    if not parts or parts[0].isdigit():  # JSON that does not parse: loc is ("body", position)
        return "body"
    return ".".join(parts)


def create_app(
    service: RagService, keys: ApiKeys, documents: DocumentsApi | None = None,
    scrape: Callable[[], Awaitable[bytes]] | None = None,
) -> FastAPI:
    """The HTTP app over a service's stages; `scrape`: where GET /metrics comes from, when not
    from this process alone (api/page.py)."""
    app = FastAPI(
        title="llmframe-ray",
        version="1",
        description="Hybrid retrieval (BM25 + dense, RRF), cross-encoder reranking and answers with citations.",
        responses={
            status: {"model": ErrorResponse} for status in (400, 401, 403, 404, 405, 408, 413, 422, 429, 500, 502, 503, 504)
        },
    )

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        return error_response(exc.status, exc.kind, exc.message, exc.field, exc.headers)

    @app.exception_handler(FrameworkHTTPError)
    async def _framework_error(request: Request, exc: FrameworkHTTPError) -> JSONResponse:
        kind, message = FRAMEWORK_ERRORS.get(exc.status_code, ("http_error", str(exc.detail)))
        if exc.status_code == 405:
            allowed = {k.lower(): v for k, v in (exc.headers or {}).items()}.get("allow", "see /openapi.json")
            message = f"{request.method} is not allowed on {request.url.path}; allowed: {allowed}"
        return error_response(exc.status_code, kind, message, "body" if exc.status_code == 400 else None, exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0]
        field = _field_of(tuple(first.get("loc", ())))
        message = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
        if field == "body" and first.get("type") == "json_invalid":
            message = f"the body is not valid JSON ({first.get('ctx', {}).get('error', message)})"
        return error_response(422, "invalid_request", f"{field}: {message}", field)

    @app.exception_handler(FieldError)
    async def _field_error(request: Request, exc: FieldError) -> JSONResponse:
        return error_response(422, "invalid_request", str(exc), exc.field)

    @app.exception_handler(NotFoundError)
    async def _not_found(request: Request, exc: NotFoundError) -> JSONResponse:
        return error_response(404, exc.kind, str(exc))

    @app.exception_handler(IndexLoadError)
    async def _index_error(request: Request, exc: IndexLoadError) -> JSONResponse:
        return error_response(503, "index_unavailable", str(exc))

    @app.exception_handler(BudgetExceededError)
    async def _over_budget(request: Request, exc: BudgetExceededError) -> JSONResponse:
        return error_response(429, "budget_exceeded", str(exc), headers={"Retry-After": str(exc.retry_after_s)})

    @app.exception_handler(StageTimeoutError)
    async def _stage_timeout(request: Request, exc: StageTimeoutError) -> JSONResponse:
        return error_response(504, "stage_timeout", str(exc))

    @app.exception_handler(StageUnavailableError)
    async def _stage_error(request: Request, exc: StageUnavailableError) -> JSONResponse:
        return error_response(503, "stage_unavailable", str(exc), headers={"Retry-After": "1"})

    @app.exception_handler(ProviderError)
    async def _provider_error(request: Request, exc: ProviderError) -> JSONResponse:
        logger.error("no provider answered: %s", exc)  # vendor messages stay in the server log
        return error_response(502, "provider_error", PROVIDER_FAILED)

    @app.exception_handler(LLMFrameError)
    async def _other_error(request: Request, exc: LLMFrameError) -> JSONResponse:
        logger.error("request failed: %s", exc)
        return error_response(500, "server_error", str(exc))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        logger.exception("unexpected error on %s %s", request.method, request.url.path)
        return error_response(500, "server_error", "internal error; the server log has the details")

    async def require_key(request: Request) -> None:
        if not keys.allows(presented_key(request.headers)):
            raise ApiError(401, "unauthorized", UNAUTHORIZED, headers={"WWW-Authenticate": "Bearer"})

    async def require_admin(request: Request) -> None:
        presented = presented_key(request.headers)
        if not keys.allows(presented):
            await require_key(request)
        if not keys.is_admin(presented):
            raise ApiError(403, "forbidden", "this route needs an admin key (LLMFRAME_ADMIN_KEYS; by default API_SECRET_KEY)")

    auth = [Depends(require_key)]
    admin = [Depends(require_admin)]

    @app.get("/healthz")
    async def healthz() -> dict:
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz() -> JSONResponse:
        states = await service.stages.readiness()
        ready = all(state == "ready" for state in states.values())
        return JSONResponse({"status": "ready" if ready else "not ready", "stages": states}, status_code=200 if ready else 503)

    @app.get("/v1/index", dependencies=auth)
    async def index_info(request: Request) -> dict:
        return index_view(keys, presented_key(request.headers), await service.stages.index_info())

    @app.post("/v1/index/reload", dependencies=admin)
    async def reload() -> dict:
        return await service.stages.reload()

    @app.get("/v1/stats", dependencies=admin)
    async def stats() -> dict:
        return await service.stages.stats()

    def where(request: Request, body: Any) -> Filter:
        return scope(keys, presented_key(request.headers), body.namespace, body.filter)

    @app.post("/v1/search", dependencies=auth, response_model=SearchResponse)
    async def search(body: SearchRequest, request: Request, response: Response) -> SearchResponse:
        answer = await service.search(body, where(request, body), key_owner(presented_key(request.headers)))
        response.headers.update(_warning_header(answer.warnings))
        return answer

    @app.post("/v1/query", dependencies=auth, response_model=QueryResponse, responses={200: STREAM_DOC})
    async def query(body: QueryRequest, request: Request) -> Any:
        owner, scoped = key_owner(presented_key(request.headers)), where(request, body)
        if not body.stream:
            answer = await service.query(body, owner, scoped)
            return JSONResponse(answer.model_dump(mode="json"), headers=_warning_header(answer.warnings))
        ranked = await service.retrieve_for_answer(body, scoped, owner)
        return StreamingResponse(
            _sse(await _started(service.answer_events(body, ranked, owner))),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **_warning_header(ranked.warnings)},
        )

    @app.post("/v1/chat/completions", dependencies=auth, responses={200: STREAM_DOC})
    async def chat_completions(body: ChatRequest, request: Request) -> Any:
        """OpenAI-compatible chat: the last user message is the question, answered from the index."""
        owner, scoped = key_owner(presented_key(request.headers)), where(request, body)
        if not body.stream:
            return await service.chat(body, owner, scoped)
        turn = await service.chat_turn(body, owner, scoped)
        return StreamingResponse(
            _openai_sse(await _started(service.chat_chunks(body, turn, owner))),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    add_graph_routes(app, service.stages, keys, auth)
    if documents is not None:
        documents.add_routes(app, keys, auth)
    limits = service.params.limits
    default_openapi = app.openapi

    def openapi() -> dict[str, Any]:
        """FastAPI's schema with this server's limits, so the schema says what validation checks."""
        if app.openapi_schema is None:
            document_limits(default_openapi(), limits.max_top_k, limits.max_query_chars)
        return app.openapi_schema  # type: ignore[return-value]

    app.openapi = openapi  # type: ignore[method-assign]
    app.add_middleware(Deadline, seconds=limits.request_timeout_s)
    upload = documents.limits.upload_max_bytes if documents is not None else None
    app.add_middleware(BodyLimit, limit=limits.max_request_bytes, keys=keys, read_timeout_s=limits.body_read_timeout_s, upload_limit=upload)
    if limits.per_key.enabled:  # outermost: a request over its key's limits is refused before its body is read
        limiter = KeyLimiter(limits.per_key, replicas=limits.replicas)
        app.add_middleware(LimitRequests, limiter=limiter, keys=keys, reject=_too_many)
    add_metrics_and_page(app, scrape)  # outermost: every answer is counted, 429s and 413s too
    return app


def _warning_header(warnings: Any) -> dict[str, str]:
    return {"X-LLMFrame-Warning": "; ".join(warnings)} if warnings else {}


def _too_many(exc: LimitExceeded) -> JSONResponse:
    return error_response(429, "rate_limited", str(exc), headers={"Retry-After": str(exc.retry_after_s)})


async def _started(items: AsyncIterator[T]) -> AsyncIterator[T]:
    """`items`, run up to its first item now: a failure before it is an HTTP error status, not
    a 200 with an error event."""
    return prepend(await anext(items), items)


def _stream_error(exc: Exception) -> str:
    if isinstance(exc, ProviderError):
        return PROVIDER_FAILED
    return str(exc) if isinstance(exc, LLMFrameError) else "the answer stream failed"


async def _openai_sse(chunks: AsyncIterator[dict]) -> AsyncIterator[str]:
    try:
        async for chunk in chunks:
            yield f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n"
    except Exception as exc:  # OpenAI's stream error shape, then the end marker
        logger.error("chat stream failed: %s", exc)
        message = _stream_error(exc)
        yield f"data: {json.dumps({'error': {'message': message, 'type': 'stream_failed'}})}\n\n"
    yield "data: [DONE]\n\n"


async def _sse(events: AsyncIterator[tuple[str, dict]]) -> AsyncIterator[str]:
    try:
        async for name, data in events:
            yield f"event: {name}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"
    except Exception as exc:  # the status line is gone: report the failure in the stream
        logger.error("answer stream failed: %s", exc)
        message = _stream_error(exc)
        yield f"event: error\ndata: {json.dumps({'type': 'stream_failed', 'message': message})}\n\n"
