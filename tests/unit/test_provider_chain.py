"""The fallback chain across both vendors' real SDKs and fake servers, and the chain the
settings build."""

import asyncio

import pytest

from llmframe_ray.config import load_settings
from llmframe_ray.errors import ConfigError
from llmframe_ray.generate.anthropic_provider import AnthropicProvider
from llmframe_ray.generate.base import Message, ProviderRequestError, StreamEnd, StreamInterruptedError
from llmframe_ray.generate.chain import provider_chain, provider_names
from llmframe_ray.generate.fallback import FallbackProvider
from llmframe_ray.generate.openai_provider import OpenAIProvider
from tests.fakes.vendors import Answer, Cut, Delay, Fail, FakeAnthropic, FakeOpenAI

QUESTION = [Message("user", "What is BM25?")]


def chain(claude, gpt, **options):
    settings = {"max_attempts": 2, "backoff_s": 0.01, "backoff_max_s": 0.5, "attempt_timeout_s": 5.0, **options}
    return FallbackProvider(
        [AnthropicProvider("k", "claude-test", base_url=claude.base_url, timeout_s=settings["attempt_timeout_s"]),
         OpenAIProvider("k", "gpt-test", base_url=gpt.base_url, timeout_s=settings["attempt_timeout_s"])],
        **settings,
    )


def test_claude_down_then_openai_answers():
    with FakeAnthropic() as claude, FakeOpenAI() as gpt:
        claude.script += [Fail(529, "overloaded"), Fail(500, "boom")]
        gpt.script.append(Answer(deltas=("From", " GPT"), input_tokens=7, output_tokens=2))
        completion = asyncio.run(chain(claude, gpt).generate(QUESTION, system="Be brief."))
        assert (completion.provider, completion.text, completion.usage.output_tokens) == ("openai", "From GPT", 2)
        assert (len(claude.requests), len(gpt.requests)) == (2, 1)
        assert gpt.requests[0].body["messages"][0] == {"role": "system", "content": "Be brief."}


def test_rate_limit_with_retry_after_is_retried_on_the_same_vendor():
    with FakeAnthropic() as claude, FakeOpenAI() as gpt:
        claude.script.append(Fail(429, "slow down", headers={"retry-after": "0.2"}))
        completion, trace = asyncio.run(chain(claude, gpt).generate_traced(QUESTION))
        assert completion.provider == "anthropic" and len(gpt.requests) == 0
        assert [r.attempt for r in trace] == [1, 2] and trace[0].wait_s >= 0.2


def test_retry_after_longer_than_the_backoff_cap_falls_through_at_once():
    with FakeAnthropic() as claude, FakeOpenAI() as gpt:
        claude.script.append(Fail(429, "come back in an hour", headers={"retry-after": "3600"}))
        completion = asyncio.run(chain(claude, gpt).generate(QUESTION))
        assert completion.provider == "openai" and len(claude.requests) == 1


def test_a_timeout_falls_through():
    with FakeAnthropic() as claude, FakeOpenAI() as gpt:
        claude.script += [Delay(3.0), Delay(3.0)]
        completion = asyncio.run(chain(claude, gpt, attempt_timeout_s=0.3).generate(QUESTION))
        assert completion.provider == "openai"


def test_a_bad_request_is_not_sent_to_the_next_vendor():
    with FakeAnthropic() as claude, FakeOpenAI() as gpt:
        claude.script.append(Fail(400, "messages: field required"))
        with pytest.raises(ProviderRequestError, match="400"):
            asyncio.run(chain(claude, gpt).generate(QUESTION))
        assert (len(claude.requests), len(gpt.requests)) == (1, 0)


async def collect(stream):
    return [item async for item in stream]


def test_stream_falls_back_before_the_first_token_only():
    with FakeAnthropic() as claude, FakeOpenAI() as gpt:
        claude.script += [Cut(()), Fail(503, "unavailable")]
        gpt.script.append(Answer(deltas=("Fall", "back")))
        items = asyncio.run(collect(chain(claude, gpt).stream(QUESTION)))
        assert items[:-1] == ["Fall", "back"] and isinstance(items[-1], StreamEnd) and items[-1].provider == "openai"

    with FakeAnthropic() as claude, FakeOpenAI() as gpt:
        claude.script.append(Cut(("Half", " an")))
        received = []

        async def read():
            async for item in chain(claude, gpt).stream(QUESTION):
                received.append(item)

        with pytest.raises(StreamInterruptedError):
            asyncio.run(read())
        assert received == ["Half", " an"] and len(gpt.requests) == 0


def test_chain_from_settings():
    assert provider_names(load_settings(anthropic_api_key=None, openai_api_key=None).params().providers) == ["extractive"]
    assert provider_names(load_settings(anthropic_api_key="a", openai_api_key="o").params().providers) == ["anthropic", "openai", "extractive"]
    assert provider_names(load_settings(llm_providers="openai,anthropic", anthropic_api_key="a", openai_api_key="o").params().providers) == ["openai", "anthropic"]
    with pytest.raises(ConfigError, match="LLM_PROVIDERS lists anthropic but ANTHROPIC_API_KEY is not set"):
        provider_names(load_settings(llm_providers="anthropic,extractive", anthropic_api_key=None).params().providers)
    with pytest.raises(ConfigError, match="unknown provider"):
        provider_names(load_settings(llm_providers="claude").params().providers)
    with pytest.raises(ConfigError, match="names a provider twice"):
        provider_names(load_settings(llm_providers="extractive,extractive").params().providers)
    built = provider_chain(load_settings(anthropic_api_key="a", openai_api_key=None, anthropic_model="claude-x").params().providers)
    assert [p.name for p in built.providers] == ["anthropic", "extractive"] and built.model == "claude-x"


def test_a_refused_key_or_unknown_model_moves_to_the_next_vendor_without_retrying():
    from llmframe_ray.generate.base import ProviderConfigError

    for status in (401, 403, 404):
        with FakeAnthropic() as claude, FakeOpenAI() as gpt:
            claude.script.append(Fail(status, "invalid x-api-key"))
            completion, trace = asyncio.run(chain(claude, gpt).generate_traced(QUESTION))
            assert completion.provider == "openai" and len(claude.requests) == 1
            assert trace[0].error.startswith(ProviderConfigError.__name__)
