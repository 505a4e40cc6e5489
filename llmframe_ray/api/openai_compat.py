"""`POST /v1/chat/completions` in OpenAI's shape, so the official `openai` client works unchanged
except for `base_url` and `api_key` (sent as a Bearer token, checked like any API key).

The last message must come from the user: it is the question retrieval runs on. Earlier user
and assistant messages are the conversation (the newest that fit LLMFRAME_SESSION_TOKEN_BUDGET),
system / developer messages are added to the system prompt. The answer comes back as
`choices[0].message.content`, usage as `usage`; `citations` (each [n] of the answer mapped to a
document and chunk) and `llmframe` (provider, cost, index version, timings) are extra fields.
Streaming sends `chat.completion.chunk` events, the citations on the last content chunk, a usage
chunk when `stream_options.include_usage` is set, then `data: [DONE]`.
"""

from __future__ import annotations

import secrets
import time
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema, field_validator

from llmframe_ray.generate.base import Message
from llmframe_ray.generate.sessions import trim_messages
from llmframe_ray.api.schemas import FILTER, NAMESPACE, TEXT_PATTERN, AnswerOut, Mode, PipelineFields, check_text

FINISH = {"end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length", "no_context": "stop", "tool_use": "tool_calls"}


# What a message's content may be: text, or a list of text parts (images and audio are refused).
CONTENT_SCHEMA = {
    "anyOf": [
        {"type": "string", "pattern": TEXT_PATTERN},
        {"type": "array", "items": {
            "type": "object", "required": ["type", "text"],
            "properties": {"type": {"const": "text"}, "text": {"type": "string", "pattern": TEXT_PATTERN}},
        }},
        {"type": "null"},
    ]
}


class ChatMessageIn(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Annotated[str | list[dict[str, Any]] | None, WithJsonSchema(CONTENT_SCHEMA)] = None

    @field_validator("content")
    @classmethod
    def _text(cls, value: str | list[dict[str, Any]] | None) -> str | list[dict[str, Any]] | None:
        if isinstance(value, str):
            check_text(value)
        elif value is not None:
            for part in value:
                if isinstance(part.get("text"), str):
                    check_text(part["text"])
        return value


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")

    include_usage: bool = False


class ChatRequest(PipelineFields):
    model_config = ConfigDict(extra="ignore")  # clients send fields that do not apply here (n, user, seed...)

    model: str | None = Field(None, description="Ignored: the server's provider chain answers; the response names the model used.")
    messages: list[ChatMessageIn] = Field(..., min_length=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(None, ge=1, le=65536)
    max_completion_tokens: int | None = Field(None, ge=1, le=65536)
    temperature: float | None = Field(None, ge=0, le=2)
    top_k: int = Field(5, ge=1, le=1000, description="Passages retrieved as context (extension).")
    mode: Mode | None = None
    rerank: bool | None = None
    filter: dict[str, Any] | None = FILTER
    namespace: str | None = NAMESPACE


class ChatTurnError(ValueError):
    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(message)


def text_of(message: ChatMessageIn, index: int) -> str:
    if message.content is None:
        return ""
    if isinstance(message.content, str):
        return message.content
    parts = []
    for part in message.content:
        if part.get("type") != "text" or not isinstance(part.get("text"), str):
            raise ChatTurnError(f"messages.{index}.content", "only text content parts are supported")
        parts.append(part["text"])
    return "".join(parts)


def chat_turn(request: ChatRequest, budget: int) -> tuple[str, list[Message], str]:
    """(question, conversation before it trimmed to `budget` tokens, extra system instructions)."""
    last = len(request.messages) - 1
    if request.messages[last].role != "user":
        raise ChatTurnError("messages", "the last message must have role 'user' (it is the question)")
    question = text_of(request.messages[last], last).strip()
    if not question:
        raise ChatTurnError(f"messages.{last}.content", "the question must not be empty")
    system, history = [], []
    for i, message in enumerate(request.messages[:last]):
        text = text_of(message, i)
        if message.role in ("system", "developer"):
            system.append(text)
        elif message.role in ("user", "assistant") and text.strip():
            history.append(Message(message.role, text))
    return question, trim_messages(history, budget), "\n\n".join(s for s in system if s.strip())


def new_id() -> str:
    return f"chatcmpl-{secrets.token_hex(12)}"


def extras(answer: AnswerOut, meta: dict[str, Any]) -> dict[str, Any]:
    return {
        "citations": [c.model_dump() for c in answer.citations],
        "llmframe": {"provider": answer.provider, "cited": answer.cited, "cost_usd": answer.usage.cost_usd, **meta},
    }


def usage_of(answer: AnswerOut) -> dict[str, int]:
    u = answer.usage
    return {"prompt_tokens": u.input_tokens, "completion_tokens": u.output_tokens, "total_tokens": u.input_tokens + u.output_tokens}


def completion_body(chat_id: str, answer: AnswerOut, meta: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": chat_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": answer.model,
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": answer.answer},
            "finish_reason": FINISH.get(answer.finish_reason, answer.finish_reason),
            "logprobs": None,
        }],
        "usage": usage_of(answer),
        **extras(answer, meta),
    }


def chunk_body(chat_id: str, model: str, delta: dict[str, Any], finish: str | None = None, **extra: Any) -> dict[str, Any]:
    return {
        "id": chat_id,
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}],
        **extra,
    }
