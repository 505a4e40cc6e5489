"""The provider chain the settings ask for.

LLM_PROVIDERS is a comma-separated order, e.g. `anthropic,openai,extractive`. `auto` (the
default) means: Claude if ANTHROPIC_API_KEY is set, then OpenAI if OPENAI_API_KEY is set, then
the offline extractive answerer, which needs no key and so always answers last.
"""

from __future__ import annotations

from llmframe_ray.config import Settings
from llmframe_ray.errors import ConfigError
from llmframe_ray.generate.base import Provider
from llmframe_ray.generate.fallback import FallbackProvider

KNOWN = ("anthropic", "openai", "extractive")


def provider_names(settings: Settings) -> list[str]:
    value = settings.llm_providers.strip().lower()
    if value == "auto":
        names = [n for n, key in (("anthropic", settings.anthropic_api_key), ("openai", settings.openai_api_key)) if key]
        return names + ["extractive"]
    names = [n.strip() for n in value.split(",") if n.strip()]
    unknown = [n for n in names if n not in KNOWN]
    if unknown or not names:
        raise ConfigError(f"LLM_PROVIDERS: unknown provider(s) {unknown or [value]}; use auto or a list of {', '.join(KNOWN)}")
    if len(set(names)) != len(names):
        raise ConfigError(f"LLM_PROVIDERS names a provider twice: {value!r}")
    if "anthropic" in names and not settings.anthropic_api_key:
        raise ConfigError("LLM_PROVIDERS lists anthropic but ANTHROPIC_API_KEY is not set")
    if "openai" in names and not settings.openai_api_key:
        raise ConfigError("LLM_PROVIDERS lists openai but OPENAI_API_KEY is not set")
    return names


def make_provider(name: str, settings: Settings) -> Provider:
    if name == "anthropic":
        from llmframe_ray.generate.anthropic_provider import AnthropicProvider

        return AnthropicProvider(
            settings.anthropic_api_key, settings.anthropic_model,
            base_url=settings.anthropic_base_url, timeout_s=settings.llm_timeout_s,
        )
    if name == "openai":
        from llmframe_ray.generate.openai_provider import OpenAIProvider

        return OpenAIProvider(
            settings.openai_api_key, settings.openai_chat_model,
            base_url=settings.openai_base_url, timeout_s=settings.llm_timeout_s,
        )
    from llmframe_ray.generate.extractive_provider import ExtractiveProvider

    return ExtractiveProvider()


def provider_chain(settings: Settings) -> FallbackProvider:
    return FallbackProvider(
        [make_provider(name, settings) for name in provider_names(settings)],
        max_attempts=settings.llm_max_attempts,
        backoff_s=settings.llm_backoff_s,
        backoff_max_s=settings.llm_backoff_max_s,
        attempt_timeout_s=settings.llm_timeout_s,
        circuit_failures=settings.llm_circuit_failures,
        circuit_cooldown_s=settings.llm_circuit_cooldown_s,
    )
