"""Translate what the vendor SDKs raise into the ProviderError family of `generate.base`.

The `anthropic` and `openai` SDKs share one error layout: `APIStatusError` (an HTTP answer of
4xx/5xx, with `.status_code`, `.response` and the decoded `.body`), `APIConnectionError`
(no answer), and `APITimeoutError`, which is a *subclass* of `APIConnectionError`, so it is
tested first. While a stream is being read, the SDKs do not wrap failures: the `httpx2`
exceptions of their HTTP layer (`ReadTimeout`, `RemoteProtocolError`, ...) arrive as they are.

    429                          -> RateLimitedError, retry_after from `retry-after-ms` or
                                    `retry-after` (seconds or an HTTP date)
    408, timeouts                -> ProviderTimeoutError
    5xx, connection failures     -> ProviderUnavailableError
    other 4xx                    -> ProviderRequestError (never retried)
    an error event inside a 200 stream -> ProviderUnavailableError
    any failure after a stream's first delta -> StreamInterruptedError

Messages name the HTTP status, the vendor's error type and the vendor's own message; the
provider name is added by ProviderError.
"""

from __future__ import annotations

import email.utils
import math
import time
from dataclasses import dataclass
from datetime import timezone
from typing import Any, Awaitable, Callable, Mapping

import httpx2

from llmframe_ray.generate.base import (
    ProviderError,
    ProviderConfigError,
    ProviderRequestError,
    ProviderTimeoutError,
    ProviderUnavailableError,
    RateLimitedError,
    StreamInterruptedError,
)


def parse_retry_after(headers: Mapping[str, str], *, now: float | None = None) -> float | None:
    """Seconds to wait, from `retry-after-ms` (milliseconds) or else `retry-after` (seconds, or
    an HTTP date, counted from `now`, default the current time, and never below 0). None when
    neither header holds a usable value."""
    millis = _non_negative(headers.get("retry-after-ms"))
    if millis is not None:
        return millis / 1000.0
    raw = headers.get("retry-after")
    if raw is None:
        return None
    seconds = _non_negative(raw)
    if seconds is not None:
        return seconds
    try:
        when = email.utils.parsedate_to_datetime(raw)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:  # an HTTP date is always GMT, even when it fails to say so
        when = when.replace(tzinfo=timezone.utc)
    reference = time.time() if now is None else now
    return max(0.0, when.timestamp() - reference)


def _non_negative(raw: str | None) -> float | None:
    if raw is None:
        return None
    try:
        value = float(raw.strip())
    except ValueError:
        return None
    return value if math.isfinite(value) and value >= 0 else None


@dataclass(frozen=True)
class ErrorMapper:
    """The error classes of one SDK, and the provider name to put on translated errors."""

    provider: str
    base: type[Exception]  # the SDK's root error, e.g. anthropic.AnthropicError
    status: type[Exception]  # APIStatusError
    connection: type[Exception]  # APIConnectionError
    timeout: type[Exception]  # APITimeoutError (a subclass of APIConnectionError)

    @property
    def catchable(self) -> tuple[type[Exception], ...]:
        """What `translate` understands: the SDK's errors and those of its HTTP layer."""
        return (self.base, httpx2.HTTPError)

    def translate(self, exc: Exception) -> ProviderError:
        """The ProviderError for a failure that happened before anything was delivered."""
        if isinstance(exc, self.status):
            return self._from_status(exc)
        if isinstance(exc, (self.timeout, httpx2.TimeoutException)):
            return ProviderTimeoutError(self.provider, f"request timed out ({_cause(exc)})")
        if isinstance(exc, (self.connection, httpx2.TransportError)):
            return ProviderUnavailableError(self.provider, f"connection failed ({_cause(exc)})")
        return ProviderError(self.provider, f"unexpected SDK error ({_cause(exc)})")

    def interrupted(self, exc: Exception) -> StreamInterruptedError:
        """The error for a stream that failed after at least one delta was delivered."""
        status = getattr(exc, "status_code", None)
        return StreamInterruptedError(
            self.provider, f"stream broke after the first delta ({_cause(exc)})",
            status=status if isinstance(status, int) and status >= 400 else None,
        )

    async def call(self, create: Callable[..., Awaitable[Any]], request: Mapping[str, Any]) -> Any:
        """`await create(**request)` (an SDK call), its failures translated."""
        try:
            return await create(**request)
        except self.catchable as exc:
            raise self.translate(exc) from exc

    def stream_failure(self, exc: Exception, delivered: bool) -> BaseException:
        """What a vendor stream that raised `exc` raises in turn: an interruption once a delta
        was delivered (the chain must not fall back then), the translated error before, and
        anything that is not the SDK's own unchanged."""
        if delivered:
            return self.interrupted(exc)
        if isinstance(exc, self.catchable):
            return self.translate(exc)
        return exc

    def unfinished(self, reason: str, delivered: bool) -> ProviderError:
        """The error for a stream that ended without its closing event."""
        if delivered:
            return StreamInterruptedError(self.provider, reason)
        return ProviderUnavailableError(self.provider, reason)

    def _from_status(self, exc: Any) -> ProviderError:
        status: int = exc.status_code
        detail = _vendor_detail(exc)
        if status == 429:
            return RateLimitedError(
                self.provider, f"HTTP 429 rate limited: {detail}", status=429,
                retry_after=parse_retry_after(exc.response.headers),
            )
        if status == 408:
            return ProviderTimeoutError(self.provider, f"HTTP 408 request timeout: {detail}", status=408)
        if status >= 500:
            return ProviderUnavailableError(self.provider, f"HTTP {status} server error: {detail}", status=status)
        if status in (401, 403, 404):
            return ProviderConfigError(self.provider, f"HTTP {status} (check the key and model): {detail}", status=status)
        if status >= 400:
            return ProviderRequestError(self.provider, f"HTTP {status} request rejected: {detail}", status=status)
        # An `error` event inside a stream that began with 200 (e.g. Anthropic's overloaded_error).
        return ProviderUnavailableError(self.provider, f"error event in a HTTP {status} stream: {detail}")


def _vendor_detail(exc: Any) -> str:
    """`(error type) message` from the vendor's error body, whichever SDK decoded it.

    Anthropic keeps the whole body (`{"type": "error", "error": {"type", "message"}}`) and also
    exposes `api_message`; OpenAI keeps only the inner `error` object (`{"message", "type", ...}`).
    """
    body = getattr(exc, "body", None)
    inner = body.get("error", body) if isinstance(body, Mapping) else None
    kind = inner.get("type") if isinstance(inner, Mapping) else None
    message = getattr(exc, "api_message", None)
    if not isinstance(message, str) or not message:
        message = inner.get("message") if isinstance(inner, Mapping) else None
    if not isinstance(message, str) or not message:
        message = body.strip()[:500] if isinstance(body, str) and body.strip() else str(exc)
    return f"({kind}) {message}" if isinstance(kind, str) and kind else message


def _cause(exc: BaseException) -> str:
    """The exception and, when the SDK wrapped one, the lower-level error beneath it."""
    text = f"{type(exc).__name__}: {exc}"
    below = exc.__cause__
    if below is not None and str(below):
        text += f" <- {type(below).__name__}: {below}"
    return text
