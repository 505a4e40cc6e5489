"""Claude through the official `anthropic` SDK (Messages API, `POST {base_url}/v1/messages`).

    generate   -> one Messages call; text = the text blocks joined, finish_reason = stop_reason
    stream     -> the raw server-sent events: each `text_delta` is yielded as it arrives; input
                  tokens come from `message_start`, output tokens and stop_reason from
                  `message_delta`; a stream that ends without `message_stop` is a failure
    structured -> one tool whose `input_schema` is the schema, forced with
                  tool_choice {"type": "tool", "name": name}; `data` = that tool_use block's input

The SDK does not retry (`max_retries=0`): retrying is the job of the fallback chain.

`temperature` is accepted for the Provider interface and not sent. The installed SDK (2.x)
speaks API version 2026-10-21, which answers 400 to any sampling parameter (`temperature`,
`top_p`, `top_k`), and the SDK no longer has those arguments.
"""

from __future__ import annotations

from typing import Any, AsyncIterator, Mapping, Sequence

import anthropic

from llmframe_ray.generate.base import (
    Completion, Message, ProviderError, StreamEnd, Usage, check_provider_args,
)
from llmframe_ray.generate.sdk_errors import ErrorMapper

TOOL_DESCRIPTION = "Record the answer as a JSON object that matches the input schema exactly."


class AnthropicProvider:
    name = "anthropic"

    def __init__(self, api_key: str, model: str, *, base_url: str | None = None, timeout_s: float = 30.0) -> None:
        check_provider_args(model, timeout_s)
        self.model = model
        self._client = anthropic.AsyncAnthropic(
            api_key=api_key, base_url=base_url, timeout=timeout_s, max_retries=0
        )
        self._errors = ErrorMapper(
            self.name, anthropic.AnthropicError, anthropic.APIStatusError,
            anthropic.APIConnectionError, anthropic.APITimeoutError,
        )

    async def aclose(self) -> None:
        """Close the HTTP connection pool."""
        await self._client.close()

    async def generate(
        self, messages: Sequence[Message], *, system: str | None = None, max_tokens: int = 1024, temperature: float = 0.0
    ) -> Completion:
        response = await self._create(self._request(messages, system, max_tokens))
        return self._completion(response, data=None)

    async def structured(
        self, messages: Sequence[Message], schema: Mapping[str, Any], *, name: str = "answer",
        system: str | None = None, max_tokens: int = 1024,
    ) -> Completion:
        request = self._request(messages, system, max_tokens)
        request["tools"] = [{"name": name, "description": TOOL_DESCRIPTION, "input_schema": dict(schema)}]
        request["tool_choice"] = {"type": "tool", "name": name}
        response = await self._create(request)
        calls = [block for block in response.content if block.type == "tool_use" and block.name == name]
        if not calls:
            raise ProviderError(
                self.name, f"the answer has no tool_use block for tool {name!r} (stop_reason {response.stop_reason!r})"
            )
        data = calls[0].input
        if not isinstance(data, dict):
            raise ProviderError(self.name, f"tool {name!r} input is a {type(data).__name__}, not a JSON object")
        return self._completion(response, data=data)

    async def stream(
        self, messages: Sequence[Message], *, system: str | None = None, max_tokens: int = 1024, temperature: float = 0.0
    ) -> AsyncIterator[str | StreamEnd]:
        events = await self._create({**self._request(messages, system, max_tokens), "stream": True})
        input_tokens = output_tokens = 0
        model, stop_reason, finished, delivered = self.model, None, False, False
        try:
            async for event in events:
                if event.type == "message_start":
                    model = event.message.model or model
                    input_tokens = event.message.usage.input_tokens
                    output_tokens = event.message.usage.output_tokens
                elif event.type == "content_block_delta" and event.delta.type == "text_delta":
                    if event.delta.text:
                        delivered = True
                        yield event.delta.text
                elif event.type == "message_delta":
                    stop_reason = event.delta.stop_reason or stop_reason
                    output_tokens = event.usage.output_tokens
                    if event.usage.input_tokens is not None:
                        input_tokens = event.usage.input_tokens
                elif event.type == "message_stop":
                    finished = True
        except Exception as exc:
            failure = self._errors.stream_failure(exc, delivered)
            if failure is exc:
                raise
            raise failure from exc
        finally:
            await events.close()
        if not finished:
            raise self._errors.unfinished("the stream ended before message_stop", delivered)
        yield StreamEnd(Usage(input_tokens, output_tokens), model, self.name, stop_reason or "unknown")

    def _request(self, messages: Sequence[Message], system: str | None, max_tokens: int) -> dict[str, Any]:
        request: dict[str, Any] = {
            "model": self.model,
            "max_tokens": max_tokens,
            "messages": [{"role": m.role, "content": m.content} for m in messages],
        }
        if system is not None:
            request["system"] = system
        return request

    async def _create(self, request: dict[str, Any]) -> Any:
        return await self._errors.call(self._client.messages.create, request)

    def _completion(self, response: Any, *, data: Mapping[str, Any] | None) -> Completion:
        text = "".join(block.text for block in response.content if block.type == "text")
        usage = Usage(response.usage.input_tokens, response.usage.output_tokens)
        return Completion(
            text=text, usage=usage, model=response.model or self.model, provider=self.name,
            finish_reason=response.stop_reason or "unknown", data=data,
        )
