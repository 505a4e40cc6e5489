"""The offline extractive answerer behind the Provider interface.

The provider reads the last user message in the layout of `generate.prompts` (numbered context
blocks, then the question), rebuilds one Hit per block (doc_id and chunk_id `context-<n>`, the
block's title and text, rank = position) and lets `ExtractiveAnswerer` quote from them.

The answerer numbers its citations by first appearance; the Provider contract is that `[n]`
names context block n. So every marker the answerer writes is rewritten to the number of the
block it quotes, and `prompts.cite(text, hits)` on the caller's side finds the right hits.

Usage is an approximation, since no tokenizer is involved: input tokens are the
whitespace-separated words of the system prompt and of every message, output tokens those of
the answer text. `max_tokens` and `temperature` do not apply and are ignored; `structured`
output is not supported (ProviderRequestError).

The answer is computed on the event loop, not in a thread: it stems a few sentences per hit
(well under a millisecond per hit), and the answerer's PyStemmer object is not meant to be
shared between threads.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, AsyncIterator, Mapping, Sequence

from llmframe_ray.generate.base import Completion, Message, ProviderRequestError, StreamEnd, Usage
from llmframe_ray.generate.extractive import ExtractiveAnswerer
from llmframe_ray.generate.prompts import parse_context, question_of
from llmframe_ray.types import Answer, Hit

# The answerer ends every quoted sentence's delta with " [k]"; only that marker is renumbered,
# never a bracketed number inside the quoted text.
_TRAILING_MARKER = re.compile(r" \[(\d+)\]\Z")


@dataclass(frozen=True)
class _Reply:
    deltas: tuple[str, ...]
    usage: Usage
    finish_reason: str


def _words(text: str) -> int:
    return len(text.split())


def _block_id(n: int) -> str:
    return f"context-{n}"


class ExtractiveProvider:
    """A Provider that answers by quoting the context blocks of the last user message."""

    name = "extractive"
    model = "extractive-v1"
    offline = True  # answers locally: a chain tries it even after its deadline has passed

    def __init__(self, answerer: ExtractiveAnswerer | None = None) -> None:
        self.answerer = ExtractiveAnswerer() if answerer is None else answerer

    async def generate(
        self, messages: Sequence[Message], *, system: str | None = None, max_tokens: int = 1024,
        temperature: float = 0.0,
    ) -> Completion:
        reply = self._reply(messages, system)
        return Completion(
            text="".join(reply.deltas),
            usage=reply.usage,
            model=self.model,
            provider=self.name,
            finish_reason=reply.finish_reason,
        )

    async def stream(
        self, messages: Sequence[Message], *, system: str | None = None, max_tokens: int = 1024,
        temperature: float = 0.0,
    ) -> AsyncIterator[str | StreamEnd]:
        """The answer's deltas (renumbered like `generate`'s text), then one StreamEnd. A bad
        request raises at the first step, before any delta."""
        reply = self._reply(messages, system)
        for delta in reply.deltas:
            yield delta
        yield StreamEnd(reply.usage, self.model, self.name, reply.finish_reason)

    async def structured(
        self, messages: Sequence[Message], schema: Mapping[str, Any], *, name: str = "answer",
        system: str | None = None, max_tokens: int = 1024,
    ) -> Completion:
        raise ProviderRequestError(self.name, "the extractive answerer cannot produce structured output")

    def _reply(self, messages: Sequence[Message], system: str | None) -> _Reply:
        last_user = next((m for m in reversed(messages) if m.role == "user"), None)
        if last_user is None:
            raise ProviderRequestError(self.name, "the messages contain no user message to answer")
        try:
            blocks = parse_context(last_user.content)
            question = question_of(last_user.content)
            hits = [
                Hit(_block_id(n), _block_id(n), text, score=0.0, rank=rank, title=title)
                for rank, (n, title, text) in enumerate(blocks, start=1)
            ]
            events = list(self.answerer.events(question, hits))
        except ValueError as error:  # a malformed layout, or a blank question
            raise ProviderRequestError(self.name, str(error)) from error
        answer = events[-1]
        if not isinstance(answer, Answer):
            raise TypeError("ExtractiveAnswerer.events must end with an Answer")
        block_of = {_block_id(n): n for n, _, _ in blocks}
        numbers = {c.n: block_of[c.chunk_id] for c in answer.citations}
        deltas = tuple(
            _TRAILING_MARKER.sub(lambda m: f" [{numbers[int(m.group(1))]}]", delta)
            for delta in events[:-1]
            if isinstance(delta, str)
        )
        words_in = sum(_words(m.content) for m in messages) + (_words(system) if system else 0)
        usage = Usage(input_tokens=words_in, output_tokens=_words("".join(deltas)))
        return _Reply(deltas, usage, answer.finish_reason)
