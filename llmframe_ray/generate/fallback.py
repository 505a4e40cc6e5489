"""A chain of providers behind one Provider: retries with backoff, fall-through, circuit breakers.

A call tries the providers in order. A provider gets up to `max_attempts` attempts, each limited
to `attempt_timeout_s` (a timeout is a ProviderTimeoutError). After a retryable ProviderError
failed attempt k, the chain sleeps `jittered = rng() * min(backoff_max_s, backoff_s * 2**(k-1))`
(full jitter) and tries again; for a RateLimitedError with `retry_after`, it sleeps
`max(retry_after, jittered)`, unless `retry_after > backoff_max_s`: then, as after a provider's
last attempt, it moves to the next provider at once. A non-retryable error (ProviderRequestError:
the request itself is bad) is raised at once, and exceptions that are not ProviderErrors
propagate unchanged; no other provider is tried for either. A `generate` or `structured` attempt
that times out is not tried again on the same provider (the vendor may still be producing, and
billing, that answer): the chain moves to the next provider (a stream that times out before its
first item is retried: nothing was produced yet). An attempt cut short by the call's deadline
does not count against the provider's breaker. `deadline_s` bounds a whole call,
retries, sleeps and fall-through included: no attempt outlives it and no sleep runs past it;
an offline provider (`offline = True`, the extractive answerer) is still tried after it, so a
chain that ends with one always answers.

Each provider (by position) has a circuit breaker: `circuit_failures` consecutive failed calls
(all attempts failed) open it; while `clock() < opened_at + circuit_cooldown_s` the provider is
skipped; then one trial call at a time may pass (half-open): success closes the breaker, failure
re-opens it. A call without a verdict (bad request, cancellation) leaves it as it was. Breaker
state is read and written without an await in between, so concurrent calls may share it.

`stream` uses the same chain only until a provider's first stream item arrives (the attempt
timeout bounds the wait for every item); once a delta has gone out, a failure is raised as
StreamInterruptedError. What happened during a call is returned, never stored on the object:
`generate_traced` and `stream_traced` also give the call's AttemptRecords.
"""

from __future__ import annotations

import asyncio
import enum
import random
import time
from dataclasses import dataclass
from typing import Any, AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping, Sequence, TypeVar

from llmframe_ray import telemetry
from llmframe_ray.generate.base import (
    Completion, Message, Provider, ProviderConfigError, ProviderError, ProviderTimeoutError, ProviderUnavailableError,
    RateLimitedError, StreamEnd, StreamInterruptedError,
)

T = TypeVar("T")


class Outcome(str, enum.Enum):
    OK = "ok"  # the provider answered (for a stream: its first item arrived)
    FAILED = "failed"  # a retryable error or a timeout
    SKIPPED = "skipped"  # circuit open: the provider was not called


@dataclass(frozen=True)
class AttemptRecord:
    """One attempt of one call. `attempt` counts from 1 per provider (0: skipped); `error`
    describes the failure ("" when ok); `wait_s` is the sleep before the next attempt."""

    provider: str
    model: str
    attempt: int
    outcome: Outcome
    error: str = ""
    wait_s: float = 0.0


Trace = tuple[AttemptRecord, ...]


def answered_by(trace: Trace) -> AttemptRecord | None:
    """The record of the attempt that answered; None when none did."""
    return next((r for r in reversed(trace) if r.outcome is Outcome.OK), None)


class AllProvidersFailedError(ProviderError):
    """Every provider failed or was skipped. `failures`: (provider, its last error or "circuit
    open"), in chain order; `trace`: every attempt of the call."""

    def __init__(self, failures: Sequence[tuple[str, str]], trace: Trace) -> None:
        self.failures, self.trace = tuple(failures), trace
        listed = "; ".join(f"{provider}: {why}" for provider, why in self.failures)
        super().__init__("fallback", f"all {len(self.failures)} providers failed: {listed}")


def _describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


async def _close(iterator: AsyncIterator[Any]) -> None:
    aclose = getattr(iterator, "aclose", None)
    if aclose is not None:
        await aclose()


class _Ticket(enum.Enum):
    CLOSED = "closed"  # a call through a closed breaker
    TRIAL = "trial"  # the one trial call of a half-open breaker


class _Breaker:
    """Consecutive-failure circuit breaker. `admit` says whether a call may pass."""

    def __init__(self, threshold: int, cooldown_s: float) -> None:
        self.threshold, self.cooldown_s = threshold, cooldown_s
        self.failures = 0
        self.opened_at: float | None = None
        self.trial = False  # a half-open trial call is in flight

    def admit(self, now: float) -> _Ticket | None:
        if self.opened_at is None:
            return _Ticket.CLOSED
        if now < self.opened_at + self.cooldown_s or self.trial:
            return None
        self.trial = True
        return _Ticket.TRIAL

    def release(self, ticket: _Ticket) -> None:
        if ticket is _Ticket.TRIAL:
            self.trial = False

    def succeeded(self, ticket: _Ticket) -> None:
        self.release(ticket)
        self.failures, self.opened_at = 0, None

    def failed(self, ticket: _Ticket, now: float) -> None:
        self.release(ticket)
        self.failures += 1  # never reset while open, so a failed trial re-opens the breaker
        if self.failures >= self.threshold:
            self.opened_at = now


async def _first_item(provider: Provider, stream: AsyncIterator[Any]) -> tuple[AsyncIterator[Any], Any]:
    """The stream and its first item; the stream is closed when it fails before its first item."""
    try:
        return stream, await stream.__anext__()
    except StopAsyncIteration:
        raise ProviderUnavailableError(provider.name, "the stream ended before any output") from None
    except BaseException:
        await _close(stream)
        raise


class FallbackProvider:
    """A Provider that tries `providers` in order, with retries and circuit breakers."""

    name = "fallback"

    def __init__(
        self, providers: Sequence[Provider], *, max_attempts: int = 3, backoff_s: float = 0.5,
        backoff_max_s: float = 8.0, attempt_timeout_s: float = 30.0, circuit_failures: int = 3,
        circuit_cooldown_s: float = 30.0, deadline_s: float | None = None,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
        clock: Callable[[], float] = time.monotonic, rng: Callable[[], float] = random.random,
    ) -> None:
        if not providers:
            raise ValueError("a fallback chain needs at least one provider")
        for what, value, low in (
            ("max_attempts", max_attempts, 1), ("circuit_failures", circuit_failures, 1),
            ("backoff_s", backoff_s, 0), ("backoff_max_s", backoff_max_s, 0),
            ("circuit_cooldown_s", circuit_cooldown_s, 0),
        ):
            if value < low:
                raise ValueError(f"{what} must be at least {low}, got {value!r}")
        if attempt_timeout_s <= 0:
            raise ValueError(f"attempt_timeout_s must be above 0, got {attempt_timeout_s!r}")
        if deadline_s is not None and deadline_s <= 0:
            raise ValueError(f"deadline_s must be above 0, got {deadline_s!r}")
        self.deadline_s = deadline_s
        self.providers = tuple(providers)
        self.model = self.providers[0].model
        self.max_attempts, self.attempt_timeout_s = max_attempts, attempt_timeout_s
        self.backoff_s, self.backoff_max_s = backoff_s, backoff_max_s
        self._sleep, self._clock, self._rng = sleep, clock, rng
        self._breakers = tuple(_Breaker(circuit_failures, circuit_cooldown_s) for _ in self.providers)

    async def generate(
        self, messages: Sequence[Message], *, system: str | None = None, max_tokens: int = 1024,
        temperature: float = 0.0,
    ) -> Completion:
        completion, _ = await self.generate_traced(
            messages, system=system, max_tokens=max_tokens, temperature=temperature
        )
        return completion

    async def generate_traced(
        self, messages: Sequence[Message], *, system: str | None = None, max_tokens: int = 1024,
        temperature: float = 0.0,
    ) -> tuple[Completion, Trace]:
        """The completion of the first provider that answered, and this call's attempts."""
        return await self._call(
            lambda p: p.generate(messages, system=system, max_tokens=max_tokens, temperature=temperature)
        )

    async def structured(
        self, messages: Sequence[Message], schema: Mapping[str, Any], *, name: str = "answer",
        system: str | None = None, max_tokens: int = 1024,
    ) -> Completion:
        completion, _ = await self._call(
            lambda p: p.structured(messages, schema, name=name, system=system, max_tokens=max_tokens)
        )
        return completion

    async def stream(
        self, messages: Sequence[Message], *, system: str | None = None, max_tokens: int = 1024,
        temperature: float = 0.0,
    ) -> AsyncGenerator[str | StreamEnd, None]:
        traced = self.stream_traced(messages, system=system, max_tokens=max_tokens, temperature=temperature)
        try:
            async for item in traced:
                if not isinstance(item, tuple):
                    yield item
        finally:
            await traced.aclose()

    async def stream_traced(
        self, messages: Sequence[Message], *, system: str | None = None, max_tokens: int = 1024,
        temperature: float = 0.0,
    ) -> AsyncGenerator[str | StreamEnd | Trace, None]:
        """The deltas and the StreamEnd of the provider that answered, then this call's trace."""
        trace: list[AttemptRecord] = []
        (stream, item), index, ticket = await self._first_answer(lambda p: _first_item(
            p, p.stream(messages, system=system, max_tokens=max_tokens, temperature=temperature)
        ), trace, retry_timeouts=True)
        provider, breaker, settled = self.providers[index], self._breakers[index], False
        try:
            while True:
                yield item
                if isinstance(item, StreamEnd):
                    break
                try:
                    item = await asyncio.wait_for(stream.__anext__(), self.attempt_timeout_s)
                    continue
                except StopAsyncIteration:
                    error: ProviderError = ProviderUnavailableError(provider.name, "the stream ended early")
                except asyncio.TimeoutError:
                    error = ProviderTimeoutError(provider.name, f"no item for {self.attempt_timeout_s:g} s")
                except ProviderError as raised:
                    error = raised
                settled = True
                breaker.failed(ticket, self._clock())
                raise StreamInterruptedError(
                    provider.name, f"the stream broke after its first delta: {_describe(error)}",
                    status=error.status,
                ) from error
            settled = True
            breaker.succeeded(ticket)
        finally:
            if not settled:
                breaker.release(ticket)
            await _close(stream)
        yield tuple(trace)

    async def _call(self, call: Callable[[Provider], Awaitable[T]]) -> tuple[T, Trace]:
        trace: list[AttemptRecord] = []
        result, index, ticket = await self._first_answer(call, trace)
        self._breakers[index].succeeded(ticket)
        return result, tuple(trace)

    async def _first_answer(
        self, call: Callable[[Provider], Awaitable[T]], trace: list[AttemptRecord], *, retry_timeouts: bool = False
    ) -> tuple[T, int, _Ticket]:
        """The first answer, the index of its provider and the breaker ticket, still unsettled
        (the call's attempts, fall-through and breakers are counted for /metrics: telemetry.py)."""
        answered: int | None = None
        try:
            found = await self._answer_in_order(call, trace, retry_timeouts)
            answered = found[1]
            return found
        finally:
            telemetry.observe_chain_call(
                [(r.provider, r.outcome.value) for r in trace], answered,
                None if answered is None else self.providers[answered].name,
                [(p.name, b.opened_at is not None) for p, b in zip(self.providers, self._breakers)],
            )

    async def _answer_in_order(
        self, call: Callable[[Provider], Awaitable[T]], trace: list[AttemptRecord], retry_timeouts: bool
    ) -> tuple[T, int, _Ticket]:
        failures: list[tuple[str, str]] = []
        deadline = None if self.deadline_s is None else self._clock() + self.deadline_s
        for index, provider in enumerate(self.providers):
            offline = getattr(provider, "offline", False)
            if deadline is not None and self._clock() >= deadline and not offline:
                failures.append((provider.name, f"not tried: the call's deadline of {self.deadline_s:g} s passed"))
                continue
            breaker = self._breakers[index]
            ticket = breaker.admit(self._clock())
            if ticket is None:
                trace.append(AttemptRecord(provider.name, provider.model, 0, Outcome.SKIPPED, "circuit open"))
                failures.append((provider.name, "circuit open"))
                continue
            try:
                result = await self._attempts(provider, call, trace, None if offline else deadline, retry_timeouts)
            except BaseException:
                breaker.release(ticket)
                raise
            if isinstance(result, ProviderError):  # every attempt failed
                if getattr(result, "cut_by_deadline", False):
                    breaker.release(ticket)  # the call ran out of time, which says nothing of the provider
                else:
                    breaker.failed(ticket, self._clock())
                failures.append((provider.name, _describe(result)))
                continue
            return result, index, ticket
        raise AllProvidersFailedError(failures, tuple(trace))

    async def _attempts(
        self, provider: Provider, call: Callable[[Provider], Awaitable[T]], trace: list[AttemptRecord],
        deadline: float | None = None, retry_timeouts: bool = False,
    ) -> T | ProviderError:
        """The provider's answer, or the error of its last failed attempt."""
        attempt = 0
        while True:
            attempt += 1
            timeout, why = self.attempt_timeout_s, f"no answer within {self.attempt_timeout_s:g} s"
            if deadline is not None and deadline - self._clock() < timeout:
                timeout, why = max(0.0, deadline - self._clock()), f"no answer before the call's deadline of {self.deadline_s:g} s"
            try:
                result = await asyncio.wait_for(call(provider), timeout)
                trace.append(AttemptRecord(provider.name, provider.model, attempt, Outcome.OK))
                return result
            except asyncio.TimeoutError:
                error: ProviderError = ProviderTimeoutError(provider.name, why)
                error.cut_by_deadline = timeout < self.attempt_timeout_s  # type: ignore[attr-defined]
            except ProviderError as raised:
                if not raised.retryable and not isinstance(raised, ProviderConfigError):
                    raise
                error = raised
            wait = self._wait(attempt, error)
            if wait is not None and isinstance(error, ProviderTimeoutError) and not retry_timeouts:
                wait = None
            if wait is not None and deadline is not None and self._clock() + wait >= deadline:
                wait = None
            trace.append(AttemptRecord(
                provider.name, provider.model, attempt, Outcome.FAILED, _describe(error), wait or 0.0
            ))
            if wait is None:
                return error
            await self._sleep(wait)

    def _wait(self, attempt: int, error: ProviderError) -> float | None:
        """Seconds to sleep before retrying after failed attempt `attempt`; None: move on."""
        if attempt >= self.max_attempts or isinstance(error, ProviderConfigError):
            return None
        retry_after = error.retry_after if isinstance(error, RateLimitedError) else None
        if retry_after is not None and retry_after > self.backoff_max_s:
            return None
        jittered = self._rng() * min(self.backoff_max_s, self.backoff_s * 2 ** (attempt - 1))
        return jittered if retry_after is None else max(retry_after, jittered)
