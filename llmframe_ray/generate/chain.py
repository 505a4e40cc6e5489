"""The provider chain the configuration asks for.

LLM_PROVIDERS is a comma-separated order, e.g. `anthropic,openai,extractive`. `auto` (the
default) means: Claude if ANTHROPIC_API_KEY is set, then OpenAI if OPENAI_API_KEY is set, then
the offline extractive answerer, which needs no key and so always answers last.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from llmframe_ray.errors import ConfigError
from llmframe_ray.generate.base import Provider
from llmframe_ray.generate.fallback import FallbackProvider

KNOWN = ("anthropic", "openai", "extractive")


@dataclass(frozen=True)
class ProviderParams:
    """The providers to try, in order, their keys and models, and the chain's retry policy.
    Keys are never shown in a repr; only the Generator is given these."""

    providers: str = "auto"
    anthropic_api_key: str | None = field(default=None, repr=False)
    anthropic_base_url: str | None = None
    anthropic_model: str = "claude-sonnet-4-5"
    openai_api_key: str | None = field(default=None, repr=False)
    openai_base_url: str | None = None
    openai_model: str = "gpt-4o-mini"
    timeout_s: float = 30.0
    max_attempts: int = 3
    backoff_s: float = 0.5
    backoff_max_s: float = 8.0
    circuit_failures: int = 3
    circuit_cooldown_s: float = 30.0
    deadline_s: float | None = 45.0  # a whole call: attempts, backoff sleeps and fall-through


def provider_names(params: ProviderParams) -> list[str]:
    value = params.providers.strip().lower()
    if value == "auto":
        names = [n for n, key in (("anthropic", params.anthropic_api_key), ("openai", params.openai_api_key)) if key]
        return names + ["extractive"]
    names = [n.strip() for n in value.split(",") if n.strip()]
    unknown = [n for n in names if n not in KNOWN]
    if unknown or not names:
        raise ConfigError(f"LLM_PROVIDERS: unknown provider(s) {unknown or [value]}; use auto or a list of {', '.join(KNOWN)}")
    if len(set(names)) != len(names):
        raise ConfigError(f"LLM_PROVIDERS names a provider twice: {value!r}")
    if "anthropic" in names and not params.anthropic_api_key:
        raise ConfigError("LLM_PROVIDERS lists anthropic but ANTHROPIC_API_KEY is not set")
    if "openai" in names and not params.openai_api_key:
        raise ConfigError("LLM_PROVIDERS lists openai but OPENAI_API_KEY is not set")
    return names


def make_provider(name: str, params: ProviderParams) -> Provider:
    if name == "anthropic":
        from llmframe_ray.generate.anthropic_provider import AnthropicProvider

        return AnthropicProvider(
            params.anthropic_api_key, params.anthropic_model,
            base_url=params.anthropic_base_url, timeout_s=params.timeout_s,
        )
    if name == "openai":
        from llmframe_ray.generate.openai_provider import OpenAIProvider

        return OpenAIProvider(
            params.openai_api_key, params.openai_model,
            base_url=params.openai_base_url, timeout_s=params.timeout_s,
        )
    from llmframe_ray.generate.extractive_provider import ExtractiveProvider

    return ExtractiveProvider()


def provider_chain(params: ProviderParams) -> FallbackProvider:
    return FallbackProvider(
        [make_provider(name, params) for name in provider_names(params)],
        max_attempts=params.max_attempts,
        backoff_s=params.backoff_s,
        backoff_max_s=params.backoff_max_s,
        attempt_timeout_s=params.timeout_s,
        circuit_failures=params.circuit_failures,
        circuit_cooldown_s=params.circuit_cooldown_s,
        deadline_s=params.deadline_s,
    )
