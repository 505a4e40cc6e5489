import asyncio

import pytest

from llmframe_ray.generate.base import (
    Completion, Message, ProviderRequestError, ProviderTimeoutError, ProviderUnavailableError,
    RateLimitedError, StreamEnd, StreamInterruptedError, Usage,
)
from llmframe_ray.generate.fallback import (
    AllProvidersFailedError, AttemptRecord, FallbackProvider, Outcome, answered_by,
)

Q = [Message("user", "q")]
OK, FAILED, SKIPPED = Outcome.OK, Outcome.FAILED, Outcome.SKIPPED


class Hang:
    """A script step: sleep for real (long enough to be cut by the attempt timeout)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds


class FakeProvider:
    """Plays one scripted step per call. A script is a list of steps, or a dict from the last
    message's content to a list. generate/structured steps: a str (the answer), an exception
    (raised) or a Hang. stream steps: a list of str deltas and exceptions; a StreamEnd follows
    the deltas when no exception was raised."""

    def __init__(self, name, script):
        self.name, self.model = name, f"{name}-model"
        self.script = script
        self.calls = 0
        self.cancelled = 0
        self.closed = 0

    def _step(self, messages):
        self.calls += 1
        script = self.script[messages[-1].content] if isinstance(self.script, dict) else self.script
        return script.pop(0)

    def _completion(self, text, data=None):
        return Completion(text, Usage(1, 2), self.model, self.name, "stop", data)

    async def generate(self, messages, *, system=None, max_tokens=1024, temperature=0.0):
        step = self._step(messages)
        await asyncio.sleep(0)  # let concurrent calls interleave
        if isinstance(step, BaseException):
            raise step
        if isinstance(step, Hang):
            try:
                await asyncio.sleep(step.seconds)
            except asyncio.CancelledError:
                self.cancelled += 1
                raise
            return self._completion("woke up")
        return self._completion(step)

    async def structured(self, messages, schema, *, name="answer", system=None, max_tokens=1024):
        step = self._step(messages)
        if isinstance(step, BaseException):
            raise step
        return self._completion("", {"answer": step})

    async def stream(self, messages, *, system=None, max_tokens=1024, temperature=0.0):
        step = self._step(messages)
        if step is None:  # a broken stream: no item at all, not even a StreamEnd
            return
        try:
            for item in step:
                if isinstance(item, BaseException):
                    raise item
                if isinstance(item, Hang):
                    await asyncio.sleep(item.seconds)
                    continue
                yield item
            yield StreamEnd(Usage(1, len(step)), self.model, self.name, "stop")
        finally:
            self.closed += 1


class Sleeper:
    def __init__(self):
        self.waits = []

    async def __call__(self, seconds):
        self.waits.append(seconds)
        await asyncio.sleep(0)


class Clock:
    def __init__(self, now=0.0):
        self.now = now

    def __call__(self):
        return self.now


def chain(*providers, **options):
    sleeper, clock = Sleeper(), Clock()
    options = {"sleep": sleeper, "clock": clock, "rng": lambda: 0.5, **options}
    return FallbackProvider(providers, **options), sleeper, clock


def unavailable(name, status=503):
    return ProviderUnavailableError(name, f"{status} busy", status=status)


def failed(name, attempt, error, wait=0.0):
    return AttemptRecord(name, f"{name}-model", attempt, FAILED, error, wait)


def ok(name, attempt):
    return AttemptRecord(name, f"{name}-model", attempt, OK)


def test_chain_is_a_provider_named_fallback_with_the_first_model():
    fallback, _, _ = chain(FakeProvider("a", []), FakeProvider("b", []))
    assert (fallback.name, fallback.model) == ("fallback", "a-model")


def test_retry_then_success_on_the_same_provider():
    a, b = FakeProvider("a", [unavailable("a"), "hello"]), FakeProvider("b", ["unused"])
    fallback, sleeper, _ = chain(a, b)
    completion, trace = asyncio.run(fallback.generate_traced(Q))
    assert completion == Completion("hello", Usage(1, 2), "a-model", "a", "stop")
    # wait after attempt 1: rng 0.5 * min(8, 0.5 * 2**0) = 0.25
    assert trace == (failed("a", 1, "ProviderUnavailableError: a: 503 busy", 0.25), ok("a", 2))
    assert sleeper.waits == [0.25]
    assert (a.calls, b.calls) == (2, 0)
    assert answered_by(trace) == ok("a", 2)


@pytest.mark.parametrize(
    "error, described",
    [
        (RateLimitedError("a", "slow down"), "RateLimitedError: a: slow down"),
        (unavailable("a", 500), "ProviderUnavailableError: a: 500 busy"),
        (ProviderUnavailableError("a", "connection refused"), "ProviderUnavailableError: a: connection refused"),
    ],
)
def test_retryable_errors_fall_through_to_the_next_provider(error, described):
    a, b = FakeProvider("a", [error, error]), FakeProvider("b", ["from b"])
    fallback, sleeper, _ = chain(a, b, max_attempts=2)
    completion, trace = asyncio.run(fallback.generate_traced(Q))
    assert (completion.text, completion.provider) == ("from b", "b")
    assert trace == (failed("a", 1, described, 0.25), failed("a", 2, described), ok("b", 1))
    assert sleeper.waits == [0.25]


def test_backoff_doubles_up_to_its_maximum():
    errors = [unavailable("a") for _ in range(4)]
    fallback, sleeper, _ = chain(FakeProvider("a", errors + ["late"]), max_attempts=5, backoff_max_s=1.5)
    assert asyncio.run(fallback.generate(Q)).text == "late"
    # 0.5 * min(1.5, 0.5), min(1.5, 1.0), min(1.5, 2.0), min(1.5, 4.0)
    assert sleeper.waits == [0.25, 0.5, 0.75, 0.75]


def test_a_bad_request_is_raised_and_no_other_provider_is_tried():
    error = ProviderRequestError("a", "400 invalid model", status=400)
    a, b = FakeProvider("a", [error, "fine"]), FakeProvider("b", ["from b"])
    fallback, sleeper, _ = chain(a, b, circuit_failures=1)
    with pytest.raises(ProviderRequestError) as raised:
        asyncio.run(fallback.generate(Q))
    assert raised.value is error
    assert (a.calls, b.calls, sleeper.waits) == (1, 0, [])
    # a bad request is not a provider failure: the breaker (1 failure opens it) stays closed
    assert asyncio.run(fallback.generate(Q)).provider == "a"


def test_retry_after_is_honoured():
    a = FakeProvider("a", [RateLimitedError("a", "slow", retry_after=2.0),
                           RateLimitedError("a", "slow", retry_after=0.1), "done"])
    fallback, sleeper, _ = chain(a, FakeProvider("b", []))
    completion, trace = asyncio.run(fallback.generate_traced(Q))
    # attempt 1: max(2.0, 0.5 * 0.5) = 2.0; attempt 2: max(0.1, 0.5 * 1.0) = 0.5
    assert sleeper.waits == [2.0, 0.5]
    assert [r.wait_s for r in trace] == [2.0, 0.5, 0.0]
    assert completion.text == "done"


def test_retry_after_above_the_backoff_maximum_falls_through_at_once():
    a = FakeProvider("a", [RateLimitedError("a", "come back later", retry_after=9.0), "unused"])
    b = FakeProvider("b", ["from b"])
    fallback, sleeper, _ = chain(a, b, backoff_max_s=8.0)
    completion, trace = asyncio.run(fallback.generate_traced(Q))
    assert completion.provider == "b"
    assert trace == (failed("a", 1, "RateLimitedError: a: come back later"), ok("b", 1))
    assert (sleeper.waits, a.calls) == ([], 1)


def test_a_timed_out_generation_is_not_tried_again_on_the_same_provider():
    # the vendor may still be producing (and billing) the answer: the next provider is asked
    a = FakeProvider("a", [ProviderTimeoutError("a", "read timed out"), "never asked"])
    b = FakeProvider("b", ["from b"])
    fallback, sleeper, _ = chain(a, b, max_attempts=3)
    completion, trace = asyncio.run(fallback.generate_traced(Q))
    assert (completion.text, a.calls, sleeper.waits) == ("from b", 1, [])
    assert trace == (failed("a", 1, "ProviderTimeoutError: a: read timed out"), ok("b", 1))


def test_the_deadline_bounds_the_whole_call():
    # a hangs: its attempt is cut at the deadline (0.2 s), not at the attempt timeout (10 s)
    a = FakeProvider("a", [Hang(30.0)])
    b = FakeProvider("b", ["never asked"])
    fallback = FallbackProvider([a, b], max_attempts=3, attempt_timeout_s=10, deadline_s=0.2)
    with pytest.raises(AllProvidersFailedError) as caught:
        asyncio.run(fallback.generate_traced(Q))
    assert (a.calls, a.cancelled, b.calls) == (1, 1, 0)
    assert "a: ProviderTimeoutError: a: no answer before the call's deadline of 0.2 s;" in str(caught.value)
    assert fallback._breakers[0].failures == 0  # running out of the call's time is not a's fault
    assert str(caught.value).endswith("b: not tried: the call's deadline of 0.2 s passed")


def test_an_offline_provider_still_answers_after_the_deadline():
    a = FakeProvider("a", [Hang(30.0)])
    local = FakeProvider("extractive", ["from the passages"])
    local.offline = True
    fallback = FallbackProvider([a, local], max_attempts=3, attempt_timeout_s=10, deadline_s=0.2)
    completion, trace = asyncio.run(fallback.generate_traced(Q))
    assert (completion.provider, a.cancelled) == ("extractive", 1)


def test_no_backoff_sleep_runs_past_the_deadline():
    a = FakeProvider("a", [unavailable("a"), "never asked"])
    b = FakeProvider("b", ["from b"])
    fallback, sleeper, clock = chain(a, b, max_attempts=3, deadline_s=2.0, backoff_s=8.0, backoff_max_s=8.0, rng=lambda: 1.0)
    completion, trace = asyncio.run(fallback.generate_traced(Q))
    assert (completion.provider, a.calls, sleeper.waits) == ("b", 1, [])  # an 8 s sleep would pass the 2 s deadline


def test_an_attempt_that_exceeds_the_timeout_counts_as_a_timeout():
    a, b = FakeProvider("a", [Hang(5.0)]), FakeProvider("b", ["from b"])
    fallback, _, _ = chain(a, b, max_attempts=1, attempt_timeout_s=0.05)
    completion, trace = asyncio.run(fallback.generate_traced(Q))
    assert trace == (failed("a", 1, "ProviderTimeoutError: a: no answer within 0.05 s"), ok("b", 1))
    assert (completion.text, a.cancelled) == ("from b", 1)


def test_circuit_opens_skips_half_opens_after_the_cooldown_and_closes_on_success():
    a = FakeProvider("a", [unavailable("a"), unavailable("a"), "a is back", "a again", unavailable("a"), "a answers"])
    b = FakeProvider("b", ["b1", "b2", "b3", "b4"])
    fallback, _, clock = chain(a, b, max_attempts=1, circuit_failures=2, circuit_cooldown_s=30.0)
    run = lambda: asyncio.run(fallback.generate_traced(Q))  # noqa: E731
    clock.now = 100.0
    assert run()[0].text == "b1"
    assert run()[0].text == "b2"  # second consecutive failure: opened at 100
    clock.now = 129.9
    completion, trace = run()
    assert completion.text == "b3"
    assert trace == (AttemptRecord("a", "a-model", 0, SKIPPED, "circuit open"), ok("b", 1))
    assert a.calls == 2
    clock.now = 130.0  # half-open: one trial call
    completion, trace = run()
    assert (completion.text, trace) == ("a is back", (ok("a", 1),))
    assert run()[0].text == "a again"  # closed again, its failure count back to 0
    assert run()[0].text == "b4"  # one failure does not re-open it
    assert run()[0].text == "a answers"
    assert (a.calls, b.calls) == (6, 4)


def test_a_failed_trial_call_reopens_the_circuit():
    a = FakeProvider("a", [unavailable("a"), unavailable("a"), "a is back"])
    b = FakeProvider("b", ["b1", "b2", "b3", "b4"])
    fallback, _, clock = chain(a, b, max_attempts=1, circuit_failures=1, circuit_cooldown_s=10.0)
    run = lambda: asyncio.run(fallback.generate(Q)).text  # noqa: E731
    assert run() == "b1"  # opened at 0
    clock.now = 10.0
    assert run() == "b2"  # the trial fails: re-opened at 10
    clock.now = 19.0
    assert run() == "b3"  # skipped
    assert a.calls == 2
    clock.now = 20.0
    assert run() == "a is back"


def test_half_open_lets_one_trial_call_through_at_a_time():
    a = FakeProvider("a", [unavailable("a"), Hang(0.01)])
    b = FakeProvider("b", ["b1", "b2"])
    fallback, _, clock = chain(a, b, max_attempts=1, circuit_failures=1, circuit_cooldown_s=5.0)
    assert asyncio.run(fallback.generate(Q)).text == "b1"
    clock.now = 5.0

    async def both():
        return await asyncio.gather(fallback.generate_traced(Q), fallback.generate_traced(Q))

    (first, trace1), (second, trace2) = asyncio.run(both())
    assert (first.text, trace1) == ("woke up", (ok("a", 1),))
    assert (second.text, trace2) == ("b2", (AttemptRecord("a", "a-model", 0, SKIPPED, "circuit open"), ok("b", 1)))


def test_all_providers_failed_lists_each_provider():
    a = FakeProvider("a", [unavailable("a")])
    b = FakeProvider("b", [RateLimitedError("b", "slow down")])
    c = FakeProvider("c", [unavailable("c")])
    fallback, _, _ = chain(a, b, c, max_attempts=1, circuit_failures=1)
    with pytest.raises(AllProvidersFailedError) as raised:
        asyncio.run(fallback.generate(Q))
    assert str(raised.value) == (
        "fallback: all 3 providers failed: a: ProviderUnavailableError: a: 503 busy; "
        "b: RateLimitedError: b: slow down; c: ProviderUnavailableError: c: 503 busy"
    )
    assert (raised.value.provider, raised.value.retryable) == ("fallback", True)
    assert [r.provider for r in raised.value.trace] == ["a", "b", "c"]
    # every breaker is open now (one failure opens it): the next call tries nobody
    with pytest.raises(AllProvidersFailedError) as raised:
        asyncio.run(fallback.generate(Q))
    assert str(raised.value) == (
        "fallback: all 3 providers failed: a: circuit open; b: circuit open; c: circuit open"
    )
    assert (a.calls, b.calls, c.calls) == (1, 1, 1)


def test_structured_falls_through_like_generate():
    a, b = FakeProvider("a", [unavailable("a")]), FakeProvider("b", ["42"])
    fallback, _, _ = chain(a, b, max_attempts=1)
    completion = asyncio.run(fallback.structured(Q, {"type": "object"}))
    assert (completion.provider, completion.data) == ("b", {"answer": "42"})


async def collect(iterator):
    items = []
    async for item in iterator:
        items.append(item)
    return items


def test_stream_falls_back_before_the_first_delta():
    a = FakeProvider("a", [[unavailable("a")], [Hang(5.0), "too late"]])
    b = FakeProvider("b", [["Hel", "lo"]])
    fallback, sleeper, _ = chain(a, b, max_attempts=2, attempt_timeout_s=0.05)

    async def read_all():
        items = await collect(fallback.stream_traced(Q))
        return items, b.closed  # b's stream is closed once its StreamEnd was read

    items, b_closed = asyncio.run(read_all())
    assert b_closed == 1
    assert items == [
        "Hel", "lo", StreamEnd(Usage(1, 2), "b-model", "b", "stop"),
        (failed("a", 1, "ProviderUnavailableError: a: 503 busy", 0.25),
         failed("a", 2, "ProviderTimeoutError: a: no answer within 0.05 s"),
         ok("b", 1)),
    ]
    assert (a.closed, b.closed, sleeper.waits) == (2, 1, [0.25])


def test_stream_after_a_delta_raises_stream_interrupted_without_fallback():
    a = FakeProvider("a", [["Hel", unavailable("a", 502)]])
    b = FakeProvider("b", [["never"], ["b answers"]])
    fallback, _, _ = chain(a, b, circuit_failures=1)
    received = []

    async def consume():
        async for item in fallback.stream(Q):
            received.append(item)

    with pytest.raises(StreamInterruptedError) as raised:
        asyncio.run(consume())
    assert str(raised.value) == (
        "a: the stream broke after its first delta: ProviderUnavailableError: a: 502 busy"
    )
    assert (raised.value.retryable, raised.value.status) == (False, 502)
    assert (received, b.calls) == (["Hel"], 0)
    # the interruption counted as a failed call of a: its breaker (1 failure) is open now
    b.script.pop(0)
    items = asyncio.run(collect(fallback.stream_traced(Q)))
    assert items[0] == "b answers"
    assert items[-1] == (AttemptRecord("a", "a-model", 0, SKIPPED, "circuit open"), ok("b", 1))


def test_a_stream_without_any_item_falls_through():
    fallback, _, _ = chain(FakeProvider("a", [None]), FakeProvider("b", [["fine"]]), max_attempts=1)
    items = asyncio.run(collect(fallback.stream_traced(Q)))
    assert items[:-1] == ["fine", StreamEnd(Usage(1, 1), "b-model", "b", "stop")]
    assert items[-1] == (
        failed("a", 1, "ProviderUnavailableError: a: the stream ended before any output"), ok("b", 1)
    )


def test_a_stream_abandoned_by_its_reader_is_closed_and_no_failure():
    a = FakeProvider("a", [[unavailable("a")], ["one", "two", "three"], ["again"]])
    fallback, _, clock = chain(a, max_attempts=1, circuit_failures=1, circuit_cooldown_s=1.0)
    with pytest.raises(AllProvidersFailedError):
        asyncio.run(collect(fallback.stream(Q)))  # opened at 0
    clock.now = 1.0

    async def first_delta_only():
        stream = fallback.stream(Q)
        first = await stream.__anext__()
        await stream.aclose()
        return first, a.closed

    assert asyncio.run(first_delta_only()) == ("one", 2)
    # abandoning the half-open trial is no verdict: the next call may try again
    assert asyncio.run(collect(fallback.stream(Q)))[0] == "again"


def test_a_bad_request_during_the_half_open_trial_leaves_the_trial_free():
    a = FakeProvider("a", [unavailable("a"), ProviderRequestError("a", "400 bad"), "fine"])
    fallback, _, clock = chain(a, FakeProvider("b", ["b1"]), max_attempts=1, circuit_failures=1)
    assert asyncio.run(fallback.generate(Q)).text == "b1"
    clock.now = 30.0
    with pytest.raises(ProviderRequestError):
        asyncio.run(fallback.generate(Q))
    assert asyncio.run(fallback.generate(Q)).text == "fine"


def test_stream_without_trace_yields_deltas_then_stream_end():
    fallback, _, _ = chain(FakeProvider("a", [["x", "y", "z"]]))
    items = asyncio.run(collect(fallback.stream(Q)))
    assert items == ["x", "y", "z", StreamEnd(Usage(1, 3), "a-model", "a", "stop")]


class FailingStream:
    """Not an async generator: a stream object holding a resource that aclose releases."""

    def __init__(self):
        self.closed = False

    def __aiter__(self):
        return self

    async def __anext__(self):
        raise unavailable("c")

    async def aclose(self):
        self.closed = True


def test_a_stream_object_that_fails_before_its_first_item_is_closed():
    c = FakeProvider("c", [])
    failing = FailingStream()
    c.stream = lambda messages, **options: failing
    fallback, _, _ = chain(c, FakeProvider("b", [["fine"]]), max_attempts=1)
    assert asyncio.run(collect(fallback.stream(Q)))[0] == "fine"
    assert failing.closed is True


def test_concurrent_calls_each_get_their_own_trace():
    questions = [f"q{i}" for i in range(6)]
    # a fails both attempts on odd questions and answers even ones; b answers everything
    a = FakeProvider("a", {q: ([unavailable("a")] * 2 if i % 2 else [f"a:{q}"]) for i, q in enumerate(questions)})
    b = FakeProvider("b", {q: [f"b:{q}"] for q in questions})
    fallback, sleeper, _ = chain(a, b, max_attempts=2, circuit_failures=100)

    async def all_of_them():
        return await asyncio.gather(*(fallback.generate_traced([Message("user", q)]) for q in questions))

    results = asyncio.run(all_of_them())
    busy = "ProviderUnavailableError: a: 503 busy"
    for i, (completion, trace) in enumerate(results):
        if i % 2:
            assert completion.text == f"b:q{i}"
            assert trace == (failed("a", 1, busy, 0.25), failed("a", 2, busy), ok("b", 1))
        else:
            assert completion.text == f"a:q{i}"
            assert trace == (ok("a", 1),)
    assert sleeper.waits == [0.25, 0.25, 0.25]


@pytest.mark.parametrize(
    "options, message",
    [
        ({"max_attempts": 0}, "max_attempts must be at least 1, got 0"),
        ({"backoff_s": -1.0}, "backoff_s must be at least 0, got -1.0"),
        ({"attempt_timeout_s": 0}, "attempt_timeout_s must be above 0, got 0"),
    ],
)
def test_bad_settings_fail_at_construction(options, message):
    with pytest.raises(ValueError, match=message):
        FallbackProvider([FakeProvider("a", [])], **options)
    with pytest.raises(ValueError, match="at least one provider"):
        FallbackProvider([])


def test_attempts_fallbacks_and_breakers_are_counted_for_metrics():
    from llmframe_ray.telemetry import REGISTRY

    def value(name, **labels):
        return REGISTRY.get_sample_value(name, labels) or 0.0

    counted = [
        ("llmframe_provider_attempts_total", {"provider": "metrics-a", "outcome": "failed"}),
        ("llmframe_provider_attempts_total", {"provider": "metrics-a", "outcome": "skipped"}),
        ("llmframe_provider_attempts_total", {"provider": "metrics-b", "outcome": "ok"}),
        ("llmframe_provider_fallbacks_total", {"provider": "metrics-b"}),
    ]
    before = [value(name, **labels) for name, labels in counted]
    a = FakeProvider("metrics-a", [unavailable("metrics-a")] * 4)
    b = FakeProvider("metrics-b", ["one", "two", "three"])
    fallback, _, _ = chain(a, b, max_attempts=2, circuit_failures=2, circuit_cooldown_s=60)
    assert asyncio.run(fallback.generate(Q)).text == "one"
    assert value("llmframe_provider_breaker_open", provider="metrics-a") == 0.0  # one failed call of two
    assert asyncio.run(fallback.generate(Q)).text == "two"
    assert value("llmframe_provider_breaker_open", provider="metrics-a") == 1.0
    assert asyncio.run(fallback.generate(Q)).text == "three"  # a is skipped while its breaker is open
    deltas = [value(name, **labels) - old for (name, labels), old in zip(counted, before)]
    assert deltas == [4.0, 1.0, 3.0, 3.0]  # 2 calls x 2 failed attempts, 1 skip; b answered all 3
