"""The provider interface: every answer source (Claude, OpenAI, the extractive answerer, a
fallback chain of them) takes the same messages and returns the same shapes.

    generate(messages, system=, max_tokens=, temperature=)  -> Completion
    stream(messages, system=, max_tokens=, temperature=)    -> async iterator of str deltas,
                                                               ending with one StreamEnd
    structured(messages, schema, name=, system=, max_tokens=) -> Completion with `data`
                                                               (JSON matching `schema`, obtained
                                                               through the vendor's tool calls)

Failures raise ProviderError subclasses that say whether trying again (or another provider)
can help: RateLimitedError (429, with retry-after), ProviderUnavailableError (5xx, connection),
ProviderTimeoutError, ProviderConfigError (401/403/404: not retried, the next provider is tried),
ProviderRequestError (another 4xx, caused by the request: never retried nor passed on),
StreamInterruptedError (a stream that broke after its first delta).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Mapping, Protocol, Sequence

from llmframe_ray.errors import LLMFrameError

ROLES = ("user", "assistant")


@dataclass(frozen=True)
class Message:
    role: str  # "user" or "assistant"; the system prompt is passed separately
    content: str

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"message role must be one of {', '.join(ROLES)}, got {self.role!r}")


@dataclass(frozen=True)
class Usage:
    input_tokens: int = 0
    output_tokens: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(self.input_tokens + other.input_tokens, self.output_tokens + other.output_tokens)


@dataclass(frozen=True)
class Completion:
    text: str
    usage: Usage
    model: str
    provider: str
    finish_reason: str
    data: Mapping[str, Any] | None = field(default=None, hash=False)  # structured output


@dataclass(frozen=True)
class StreamEnd:
    """The last item of a stream: what the deltas added up to, and what they cost."""

    usage: Usage
    model: str
    provider: str
    finish_reason: str


class Provider(Protocol):
    name: str  # "anthropic", "openai", "extractive", ...
    model: str

    async def generate(
        self, messages: Sequence[Message], *, system: str | None = None, max_tokens: int = 1024, temperature: float = 0.0
    ) -> Completion: ...

    def stream(
        self, messages: Sequence[Message], *, system: str | None = None, max_tokens: int = 1024, temperature: float = 0.0
    ) -> AsyncIterator[str | StreamEnd]: ...

    async def structured(
        self, messages: Sequence[Message], schema: Mapping[str, Any], *, name: str = "answer",
        system: str | None = None, max_tokens: int = 1024,
    ) -> Completion: ...


def check_provider_args(model: str, timeout_s: float) -> None:
    """What every vendor provider checks when it is built."""
    if not model:
        raise ValueError("model must be a non-empty model name")
    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")


class ProviderError(LLMFrameError):
    """A provider call failed. `retryable`: the same call may succeed later or elsewhere."""

    retryable = True

    def __init__(self, provider: str, message: str, *, status: int | None = None) -> None:
        self.provider = provider
        self.status = status
        super().__init__(f"{provider}: {message}")


class RateLimitedError(ProviderError):
    def __init__(self, provider: str, message: str, *, status: int | None = 429, retry_after: float | None = None) -> None:
        self.retry_after = retry_after
        super().__init__(provider, message, status=status)


class ProviderUnavailableError(ProviderError):
    """5xx answers and connection failures."""


class ProviderTimeoutError(ProviderError):
    pass


class StreamInterruptedError(ProviderError):
    """The stream broke after deltas were delivered: not retried (the client has them)."""

    retryable = False


class ProviderConfigError(ProviderError):
    """The provider refused this server's credentials or does not know its model (401, 403,
    404): retrying cannot help, but the next provider can answer."""

    retryable = False


class ProviderRequestError(ProviderError):
    """The provider rejected the request itself (400, 401, 403, 404, 422, ...): not retried."""

    retryable = False
