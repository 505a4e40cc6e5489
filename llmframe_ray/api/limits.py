"""Per-key request limits of the HTTP API: a rate (token bucket with a burst) and a number of
requests in flight, each answered over the limit with 429, `Retry-After` and the limit's name.

Every Ingress replica keeps its own counters and enforces its share of each limit (the limit
divided by the number of Ingress replicas, rounded up): the proxy spreads a key's requests over
the replicas, so together they hold the configured limit without a shared counter on the
request path. A replica that restarts starts with a full bucket.
"""

from __future__ import annotations

import math
import time
from typing import Any, Callable

from llmframe_ray.api.auth import ApiKeys, first_headers, key_owner, presented_key
from llmframe_ray.api.params import KeyLimits


class LimitExceeded(Exception):
    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class KeyLimiter:
    """The counters of one replica: per key, a token bucket and the requests in flight."""

    def __init__(self, limits: KeyLimits, *, replicas: int = 1, clock: Callable[[], float] = time.monotonic) -> None:
        self.limits = limits  # as configured, for messages
        self.local = limits.share(replicas)
        self.replicas = replicas
        self.clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}  # key -> (tokens, when)
        self._in_flight: dict[str, int] = {}

    def acquire(self, key: str) -> None:
        """Admit one request of `key`, or raise LimitExceeded; release() it when it ends."""
        local = self.local
        if local.max_concurrent and self._in_flight.get(key, 0) >= local.max_concurrent:
            raise LimitExceeded(
                f"too many requests in flight for this API key: the limit is {self.limits.max_concurrent} "
                f"at once (LLMFRAME_MAX_CONCURRENT_PER_KEY{self._split()})",
                1,
            )
        if local.rate_per_s > 0:
            now = self.clock()
            capacity = max(1.0, float(local.burst))
            tokens, then = self._buckets.get(key, (capacity, now))
            tokens = min(capacity, tokens + (now - then) * local.rate_per_s)
            if tokens < 1.0:
                self._buckets[key] = (tokens, now)
                wait = math.ceil((1.0 - tokens) / local.rate_per_s)
                raise LimitExceeded(
                    f"rate limit exceeded for this API key: {self.limits.rate_per_s:g} requests/s with bursts of "
                    f"{self.limits.burst} (LLMFRAME_RATE_LIMIT_PER_S, LLMFRAME_RATE_LIMIT_BURST{self._split()})",
                    max(1, wait),
                )
            self._buckets[key] = (tokens - 1.0, now)
        self._in_flight[key] = self._in_flight.get(key, 0) + 1

    def release(self, key: str) -> None:
        left = self._in_flight.get(key, 0) - 1
        if left > 0:
            self._in_flight[key] = left
        else:
            self._in_flight.pop(key, None)

    def _split(self) -> str:
        return f"; shared by {self.replicas} replicas" if self.replicas > 1 else ""


class LimitRequests:
    """ASGI middleware: per-key limits on the authenticated routes (/v1/...). A request without
    a valid key passes through to be refused by the route (401), so unknown keys never hold
    counters."""

    def __init__(self, app: Any, limiter: KeyLimiter, keys: ApiKeys, reject: Callable[[LimitExceeded], Any]) -> None:
        self.app, self.limiter, self.keys, self.reject = app, limiter, keys, reject

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not scope.get("path", "").startswith("/v1/"):
            await self.app(scope, receive, send)
            return
        presented = presented_key(first_headers(scope))
        if not self.keys.allows(presented):
            await self.app(scope, receive, send)
            return
        owner = key_owner(None if self.keys.disabled else presented)  # no auth: one shared budget
        try:
            self.limiter.acquire(owner)
        except LimitExceeded as exc:
            await self.reject(exc)(scope, receive, send)
            return
        try:
            await self.app(scope, receive, send)  # returns once the response (or stream) has ended
        finally:
            self.limiter.release(owner)
