"""AnthropicProvider and OpenAIProvider through their real SDKs against local fake servers that
speak each vendor's wire protocol (tests/fakes/vendors.py): request shapes, answers, streams,
structured output and the mapping of every failure onto the ProviderError family."""

from __future__ import annotations

import asyncio
import re
import socket
import time
from typing import Any, AsyncIterator, Awaitable, Callable

import pytest

from llmframe_ray.generate import anthropic_provider, openai_provider
from llmframe_ray.generate.anthropic_provider import AnthropicProvider
from llmframe_ray.generate.base import (
    Completion, Message, ProviderError, ProviderRequestError, ProviderTimeoutError, ProviderUnavailableError,
    RateLimitedError, StreamEnd, StreamInterruptedError, Usage,
)
from llmframe_ray.generate.openai_provider import OpenAIProvider
from llmframe_ray.generate.sdk_errors import parse_retry_after
from tests.fakes.vendors import Answer, Cut, Delay, Fail, FakeAnthropic, FakeOpenAI, ToolCall

KEY = "test-key"
MODEL = "model-under-test"
VENDORS = ("anthropic", "openai")
FAKES = {"anthropic": FakeAnthropic, "openai": FakeOpenAI}
PROVIDERS = {"anthropic": AnthropicProvider, "openai": OpenAIProvider}
DONE = {"anthropic": "end_turn", "openai": "stop"}
TOOL_DONE = {"anthropic": "tool_use", "openai": "tool_calls"}
ERROR_TYPE_429 = {"anthropic": "rate_limit_error", "openai": "requests"}
QUESTION = [Message("user", "What is BM25?"), Message("assistant", "A ranking function."),
            Message("user", "Who made it?")]
PATHS = {"anthropic": "/v1/messages", "openai": "/v1/chat/completions"}
TURNS = [{"role": "user", "content": "What is BM25?"}, {"role": "assistant", "content": "A ranking function."},
         {"role": "user", "content": "Who made it?"}]
GENERATE_BODIES = {  # generate(QUESTION, system="Answer briefly.", max_tokens=64, temperature=0.7)
    # no temperature: Anthropic API version 2026-10-21 answers 400 to any sampling parameter
    "anthropic": {"model": MODEL, "max_tokens": 64, "system": "Answer briefly.", "messages": TURNS},
    "openai": {"model": MODEL, "max_completion_tokens": 64, "temperature": 0.7,
               "messages": [{"role": "system", "content": "Answer briefly."}, *TURNS]},
}
NOW = 1792567680.0  # Wed, 21 Oct 2026 07:28:00 GMT
SCHEMA = {"type": "object", "required": ["answer", "citations"],
          "properties": {"answer": {"type": "string"}, "citations": {"type": "array", "items": {"type": "integer"}}}}


def run(vendor: str, url: str, action: Callable[[Any], Awaitable[Any]], *, timeout_s: float = 5.0) -> Any:
    """`action(provider)` in a fresh event loop, with a provider for `vendor` aimed at `url`."""

    async def main() -> Any:
        provider = PROVIDERS[vendor](KEY, MODEL, base_url=url, timeout_s=timeout_s)
        try:
            return await action(provider)
        finally:
            await provider.aclose()

    return asyncio.run(main())


async def drain(stream: AsyncIterator[Any]) -> tuple[list[Any], ProviderError | None]:
    """Everything the stream yielded, and the ProviderError that ended it (None if it finished)."""
    items: list[Any] = []
    try:
        async for item in stream:
            items.append(item)
    except ProviderError as exc:
        return items, exc
    return items, None


def error_of(vendor: str, url: str, *, stream: bool = False, timeout_s: float = 5.0) -> ProviderError:
    """The ProviderError one generate call raises (or one stream call, which yields nothing first)."""
    if stream:
        items, error = run(vendor, url, lambda p: drain(p.stream(QUESTION)), timeout_s=timeout_s)
        assert items == [] and error is not None
        return error
    with pytest.raises(ProviderError) as caught:
        run(vendor, url, lambda p: p.generate(QUESTION), timeout_s=timeout_s)
    return caught.value


def fail_with(vendor: str, behaviour: Any, *, stream: bool = False, timeout_s: float = 5.0) -> ProviderError:
    """The error a call raises when the fake answers with `behaviour`, checking it was not retried."""
    with FAKES[vendor]() as fake:
        fake.script.append(behaviour)
        error = error_of(vendor, fake.base_url, stream=stream, timeout_s=timeout_s)
        assert len(fake.requests) == 1  # the SDK itself never retries
    return error


@pytest.mark.parametrize("vendor", VENDORS)
def test_generate_sends_the_vendors_request_and_reads_the_answer(vendor):
    with FAKES[vendor]() as fake:
        fake.script.append(Answer(("Robertson", " and Spärck Jones."), 31, 7, model="dated-model-20261001"))
        completion = run(vendor, fake.base_url,
                         lambda p: p.generate(QUESTION, system="Answer briefly.", max_tokens=64, temperature=0.7))
        request = fake.requests[0]
    assert completion == Completion("Robertson and Spärck Jones.", Usage(31, 7), "dated-model-20261001",
                                    vendor, DONE[vendor])
    assert request.path == PATHS[vendor]
    assert request.body == GENERATE_BODIES[vendor]
    assert request.headers.get("authorization") == f"Bearer {KEY}" or request.headers.get("x-api-key") == KEY


@pytest.mark.parametrize("vendor", VENDORS)
def test_no_system_prompt_sends_none(vendor):
    with FAKES[vendor]() as fake:
        completion = run(vendor, fake.base_url, lambda p: p.generate([Message("user", "hi")]))
        body = fake.requests[0].body
    assert completion == Completion("Hello world", Usage(12, 3), MODEL, vendor, DONE[vendor])
    assert "system" not in body
    assert body["messages"] == [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize("vendor", VENDORS)
def test_stream_yields_each_delta_then_one_stream_end(vendor):
    with FAKES[vendor]() as fake:
        fake.script.append(Answer(("Okapi", " BM25", " ranks", " documents."), 40, 6, finish_reason="max_tokens"))
        items, error = run(vendor, fake.base_url, lambda p: drain(p.stream(QUESTION, system="Be brief.", max_tokens=9)))
        body = fake.requests[0].body
    assert error is None
    assert items == ["Okapi", " BM25", " ranks", " documents.",
                     StreamEnd(Usage(40, 6), MODEL, vendor, "max_tokens")]
    assert body["stream"] is True
    if vendor == "openai":
        assert body["stream_options"] == {"include_usage": True}
        assert body["max_completion_tokens"] == 9
    else:
        assert body["max_tokens"] == 9


@pytest.mark.parametrize("vendor", VENDORS)
@pytest.mark.parametrize(
    ("stream", "headers", "expected"),
    [(False, {"retry-after": "7"}, 7.0), (True, {"retry-after": "2.5"}, 2.5),
     (False, {"retry-after-ms": "1500", "retry-after": "9"}, 1.5), (True, {}, None)],
    ids=["seconds", "fraction-stream", "milliseconds", "absent-stream"],
)
def test_429_is_rate_limited_with_retry_after(vendor, stream, headers, expected):
    error = fail_with(vendor, Fail(429, "Too many requests.", headers=headers), stream=stream)
    assert type(error) is RateLimitedError
    assert (error.status, error.retry_after, error.retryable) == (429, expected, True)
    assert str(error) == f"{vendor}: HTTP 429 rate limited: ({ERROR_TYPE_429[vendor]}) Too many requests."


@pytest.mark.parametrize("vendor", VENDORS)
@pytest.mark.parametrize("status", [500, 529])
def test_5xx_is_unavailable(vendor, status):
    error = fail_with(vendor, Fail(status, "The server had an error.", error_type="api_error"))
    assert type(error) is ProviderUnavailableError
    assert (error.status, error.retryable) == (status, True)
    assert str(error) == f"{vendor}: HTTP {status} server error: (api_error) The server had an error."


@pytest.mark.parametrize("vendor", VENDORS)
@pytest.mark.parametrize("stream", [False, True], ids=["generate", "stream"])
def test_a_slow_answer_times_out(vendor, stream):
    error = fail_with(vendor, Delay(2.0), stream=stream, timeout_s=0.3)
    assert type(error) is ProviderTimeoutError
    assert (error.status, error.retryable) == (None, True)
    assert str(error).startswith(f"{vendor}: request timed out (APITimeoutError")


@pytest.mark.parametrize("vendor", VENDORS)
def test_a_stream_cut_midway_yields_its_deltas_then_interrupted(vendor):
    with FAKES[vendor]() as fake:
        fake.script.append(Cut(("Okapi", " BM25")))
        items, error = run(vendor, fake.base_url, lambda p: drain(p.stream(QUESTION)))
    assert items == ["Okapi", " BM25"]
    assert type(error) is StreamInterruptedError
    assert error.retryable is False
    assert str(error).startswith(f"{vendor}: stream broke after the first delta (")


@pytest.mark.parametrize("vendor", VENDORS)
def test_a_stream_cut_before_any_delta_is_unavailable(vendor):
    error = fail_with(vendor, Cut(()), stream=True)
    assert type(error) is ProviderUnavailableError
    assert error.retryable is True


@pytest.mark.parametrize("vendor", VENDORS)
@pytest.mark.parametrize(("status", "kind"), [(400, "invalid_request_error"), (422, "invalid_request_error")])
def test_4xx_is_a_request_error_never_retried(vendor, status, kind):
    error = fail_with(vendor, Fail(status, "messages: field required", error_type=kind))
    assert type(error) is ProviderRequestError
    assert (error.status, error.retryable) == (status, False)
    assert str(error) == f"{vendor}: HTTP {status} request rejected: ({kind}) messages: field required"


@pytest.mark.parametrize("vendor", VENDORS)
@pytest.mark.parametrize("stream", [False, True], ids=["generate", "stream"])
def test_connection_refused_is_unavailable(vendor, stream):
    with socket.socket() as probe:  # a port that was free a moment ago, with nothing listening
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    error = error_of(vendor, f"http://127.0.0.1:{port}/v1", stream=stream)
    assert type(error) is ProviderUnavailableError
    assert (error.status, error.retryable) == (None, True)
    # the SDK's own words vary by version ("Connection error." or "Connection to HOST:PORT
    # failed: ..."); ours are the vendor, the kind of failure, and the cause chain down to httpx
    assert re.fullmatch(
        rf"{vendor}: connection failed \(APIConnectionError: .+ <- ConnectError: All connection attempts failed\)",
        str(error), flags=re.DOTALL,
    ), str(error)


@pytest.mark.parametrize("vendor", VENDORS)
@pytest.mark.parametrize("text", ["", "Here it is."], ids=["call-only", "text-and-call"])
def test_structured_round_trip_through_a_forced_tool_call(vendor, text):
    data = {"answer": "Robertson and Spärck Jones", "citations": [1, 3]}
    with FAKES[vendor]() as fake:
        fake.script.append(ToolCall("cited_answer", data, text=text, input_tokens=50, output_tokens=11))
        completion = run(vendor, fake.base_url,
                         lambda p: p.structured(QUESTION, SCHEMA, name="cited_answer", system="Cite.", max_tokens=99))
        body = fake.requests[0].body
    assert completion == Completion(text, Usage(50, 11), MODEL, vendor, TOOL_DONE[vendor], data=data)
    if vendor == "anthropic":
        assert body["tools"] == [{"name": "cited_answer", "description": anthropic_provider.TOOL_DESCRIPTION,
                                  "input_schema": SCHEMA}]
        assert body["tool_choice"] == {"type": "tool", "name": "cited_answer"}
        assert (body["system"], body["max_tokens"]) == ("Cite.", 99)
    else:
        assert body["tools"] == [{"type": "function", "function": {
            "name": "cited_answer", "description": openai_provider.TOOL_DESCRIPTION, "parameters": SCHEMA}}]
        assert body["tool_choice"] == {"type": "function", "function": {"name": "cited_answer"}}
        assert (body["messages"][0], body["max_completion_tokens"]) == ({"role": "system", "content": "Cite."}, 99)


@pytest.mark.parametrize(
    ("vendor", "behaviour", "message"),
    [
        ("anthropic", ToolCall("answer", ["not", "an", "object"]),
         "anthropic: tool 'answer' input is a list, not a JSON object"),
        ("anthropic", Answer(("plain text",)),
         "anthropic: the answer has no tool_use block for tool 'answer' (stop_reason 'end_turn')"),
        ("openai", ToolCall("answer", None, raw_arguments='{"answer": '),
         "openai: function 'answer' arguments are not valid JSON: Expecting value: line 1 column 12 (char 11)"),
        ("openai", ToolCall("answer", [1, 2]), "openai: function 'answer' arguments are a list, not a JSON object"),
        ("openai", ToolCall("other_tool", {}), "openai: the answer has no call of function 'answer'"),
    ],
    ids=["anthropic-list", "anthropic-no-call", "openai-bad-json", "openai-list", "openai-other-function"],
)
def test_structured_rejects_a_missing_or_malformed_tool_input(vendor, behaviour, message):
    with FAKES[vendor]() as fake:
        fake.script.append(behaviour)
        with pytest.raises(ProviderError) as caught:
            run(vendor, fake.base_url, lambda p: p.structured(QUESTION, SCHEMA))
    assert type(caught.value) is ProviderError
    assert str(caught.value) == message


@pytest.mark.parametrize(
    ("headers", "expected"),
    [({"retry-after": "12"}, 12.0), ({"retry-after": " 0.25 "}, 0.25), ({"retry-after-ms": "250"}, 0.25),
     ({"retry-after-ms": "soon", "retry-after": "3"}, 3.0),
     ({"retry-after": "Wed, 21 Oct 2026 07:28:30 GMT"}, 30.0), ({"retry-after": "Wed, 21 Oct 2026 07:27:00 GMT"}, 0.0),
     ({"retry-after": "-4"}, None), ({"retry-after": "nan"}, None), ({"retry-after": "later"}, None), ({}, None)],
)
def test_parse_retry_after(headers, expected):
    assert parse_retry_after(headers, now=NOW) == expected


def test_a_date_without_zone_is_gmt_whatever_the_local_zone(monkeypatch):
    monkeypatch.setenv("TZ", "EST+5")  # a POSIX zone five hours behind GMT; needs no tz database
    time.tzset()
    try:  # "-0000" makes email.utils return a naive datetime
        assert parse_retry_after({"retry-after": "Wed, 21 Oct 2026 07:28:45 -0000"}, now=NOW) == 45.0
    finally:
        monkeypatch.undo()
        time.tzset()


@pytest.mark.parametrize("vendor", VENDORS)
def test_bad_constructor_arguments_fail_at_construction(vendor):
    with pytest.raises(ValueError, match="timeout_s must be > 0, got 0"):
        PROVIDERS[vendor](KEY, MODEL, timeout_s=0)
    with pytest.raises(ValueError, match="model must be a non-empty model name"):
        PROVIDERS[vendor](KEY, "")


@pytest.mark.parametrize("vendor", VENDORS)
@pytest.mark.parametrize(("status", "kind"), [(401, "authentication_error"), (403, "permission_error"), (404, "not_found_error")])
def test_refused_key_or_unknown_model_is_a_config_error(vendor, status, kind):
    from llmframe_ray.generate.base import ProviderConfigError

    error = fail_with(vendor, Fail(status, "invalid x-api-key", error_type=kind))
    assert type(error) is ProviderConfigError
    assert (error.status, error.retryable) == (status, False)
    assert str(error) == f"{vendor}: HTTP {status} (check the key and model): ({kind}) invalid x-api-key"
