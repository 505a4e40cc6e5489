"""GPT models through the official `openai` SDK (Chat Completions,
`POST {base_url}/chat/completions`; the default base_url already ends in `/v1`).

    generate   -> one call; the system prompt is a first {"role": "system"} message; the token
                  limit goes as `max_completion_tokens` (the SDK marks `max_tokens` deprecated);
                  text = choices[0].message.content or ""
    stream     -> stream=True with stream_options {"include_usage": true}: each
                  `delta.content` is yielded as it arrives; the last chunk (empty `choices`)
                  carries usage; a stream that ends without a finish_reason is a failure
    structured -> one function tool whose `parameters` are the schema, forced with
                  tool_choice {"type": "function", "function": {"name": name}};
                  data = json.loads(the call's `arguments`)

The SDK does not retry (`max_retries=0`): retrying is the job of the fallback chain.
A server that ignores `include_usage` streams fine, with usage reported as zero.
"""

from __future__ import annotations

import json
from typing import Any, AsyncIterator, Mapping, Sequence

import openai

from llmframe_ray.generate.base import (
    Completion, Message, ProviderError, StreamEnd, Usage, check_provider_args,
)
from llmframe_ray.generate.sdk_errors import ErrorMapper

TOOL_DESCRIPTION = "Record the answer as a JSON object that matches the parameters schema exactly."


class OpenAIProvider:
    name = "openai"

    def __init__(self, api_key: str, model: str, *, base_url: str | None = None, timeout_s: float = 30.0) -> None:
        check_provider_args(model, timeout_s)
        self.model = model
        self._client = openai.AsyncOpenAI(api_key=api_key, base_url=base_url, timeout=timeout_s, max_retries=0)
        self._errors = ErrorMapper(
            self.name, openai.OpenAIError, openai.APIStatusError, openai.APIConnectionError, openai.APITimeoutError
        )

    async def aclose(self) -> None:
        """Close the HTTP connection pool."""
        await self._client.close()

    async def generate(
        self, messages: Sequence[Message], *, system: str | None = None, max_tokens: int = 1024, temperature: float = 0.0
    ) -> Completion:
        response = await self._create({**self._request(messages, system, max_tokens), "temperature": temperature})
        return self._completion(response, data=None)

    async def structured(
        self, messages: Sequence[Message], schema: Mapping[str, Any], *, name: str = "answer",
        system: str | None = None, max_tokens: int = 1024,
    ) -> Completion:
        request = self._request(messages, system, max_tokens)
        request["tools"] = [
            {"type": "function", "function": {"name": name, "description": TOOL_DESCRIPTION, "parameters": dict(schema)}}
        ]
        request["tool_choice"] = {"type": "function", "function": {"name": name}}
        response = await self._create(request)
        message = self._first_choice(response).message
        calls = [
            call for call in message.tool_calls or []
            if call.type == "function" and call.function.name == name
        ]
        if not calls:
            raise ProviderError(self.name, f"the answer has no call of function {name!r}")
        try:
            data = json.loads(calls[0].function.arguments)
        except json.JSONDecodeError as exc:
            raise ProviderError(self.name, f"function {name!r} arguments are not valid JSON: {exc}") from exc
        if not isinstance(data, dict):
            raise ProviderError(self.name, f"function {name!r} arguments are a {type(data).__name__}, not a JSON object")
        return self._completion(response, data=data)

    async def stream(
        self, messages: Sequence[Message], *, system: str | None = None, max_tokens: int = 1024, temperature: float = 0.0
    ) -> AsyncIterator[str | StreamEnd]:
        chunks = await self._create({
            **self._request(messages, system, max_tokens), "temperature": temperature,
            "stream": True, "stream_options": {"include_usage": True},
        })
        usage, model, finish_reason, delivered = Usage(), self.model, None, False
        try:
            async for chunk in chunks:
                model = chunk.model or model
                if chunk.usage is not None:
                    usage = Usage(chunk.usage.prompt_tokens, chunk.usage.completion_tokens)
                for choice in chunk.choices:
                    if choice.index != 0:
                        continue
                    if choice.delta.content:
                        delivered = True
                        yield choice.delta.content
                    finish_reason = choice.finish_reason or finish_reason
        except Exception as exc:
            failure = self._errors.stream_failure(exc, delivered)
            if failure is exc:
                raise
            raise failure from exc
        finally:
            await chunks.close()
        if finish_reason is None:
            raise self._errors.unfinished("the stream ended before a finish_reason", delivered)
        yield StreamEnd(usage, model, self.name, finish_reason)

    def _request(self, messages: Sequence[Message], system: str | None, max_tokens: int) -> dict[str, Any]:
        turns = [{"role": "system", "content": system}] if system is not None else []
        turns += [{"role": m.role, "content": m.content} for m in messages]
        return {"model": self.model, "messages": turns, "max_completion_tokens": max_tokens}

    async def _create(self, request: dict[str, Any]) -> Any:
        return await self._errors.call(self._client.chat.completions.create, request)

    def _first_choice(self, response: Any) -> Any:
        if not response.choices:
            raise ProviderError(self.name, "the answer has no choices")
        return response.choices[0]

    def _completion(self, response: Any, *, data: Mapping[str, Any] | None) -> Completion:
        choice = self._first_choice(response)
        usage = Usage(response.usage.prompt_tokens, response.usage.completion_tokens) if response.usage else Usage()
        return Completion(
            text=choice.message.content or "", usage=usage, model=response.model or self.model,
            provider=self.name, finish_reason=choice.finish_reason or "unknown", data=data,
        )
