"""Contextual compression by an LLM (LLMFRAME_COMPRESSION_SCORER=llm): the provider chain is
shown the question and the passages' numbered sentences, and names the ones to keep as
structured output. retrieve/compress.py applies the choice; without an LLM in the chain, or when
the call fails, the caller scores the sentences offline instead."""

from __future__ import annotations

import asyncio
import re
from typing import Any, Sequence

from llmframe_ray.generate.base import Message, Usage

EXTRACT_SYSTEM = (
    "You compress retrieved passages for a question-answering system. Each sentence is numbered "
    "[passage.sentence]. Name every sentence needed to answer the question or to judge a claim "
    "about it (evidence, results, conclusions and the definitions they depend on), and no other. "
    "Keep at most {budget} estimated tokens in all."
)

EXTRACT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "keep": {
            "type": "array", "items": {"type": "string", "pattern": "^[0-9]+\\.[0-9]+$"},
            "description": "The numbers of the sentences to keep, as \"passage.sentence\", e.g. \"1.3\".",
        },
    },
    "required": ["keep"],
    "additionalProperties": False,
}

_NUMBER = re.compile(r"^\s*\[?(\d+)\.(\d+)\]?\s*$")


def extract_prompt(question: str, passages: Sequence[Sequence[str]]) -> str:
    blocks = []
    for p, sentences in enumerate(passages, 1):
        blocks.append("\n".join(f"[{p}.{s}] {text}" for s, text in enumerate(sentences, 1)))
    return f"Question: {question}\n\nPassages:\n" + "\n\n".join(blocks)


def parse_keep(data: Any, passages: Sequence[Sequence[str]]) -> list[bool]:
    """One flag per sentence, flattened in passage order, from the answer's "p.s" numbers. A
    ValueError for an answer without a list or with a number that names no sentence."""
    keep = data.get("keep") if isinstance(data, dict) else None
    if not isinstance(keep, list):
        raise ValueError("the answer has no 'keep' list")
    chosen: set[tuple[int, int]] = set()
    for item in keep:
        match = _NUMBER.match(str(item))
        if match is None:
            raise ValueError(f"{item!r} is not a sentence number like '1.3'")
        p, s = int(match.group(1)), int(match.group(2))
        if not (1 <= p <= len(passages) and 1 <= s <= len(passages[p - 1])):
            raise ValueError(f"sentence {p}.{s} does not exist")
        chosen.add((p, s))
    return [(p, s) in chosen for p, sentences in enumerate(passages, 1) for s in range(1, len(sentences) + 1)]


async def extract_sentences(
    provider: Any, question: str, passages: Sequence[Sequence[str]], budget_tokens: int, timeout_s: float, max_tokens: int = 512
) -> tuple[list[bool], Usage, str, str]:
    """(flags, usage, provider, model) of the chain's choice; any failure raises."""
    completion = await asyncio.wait_for(
        provider.structured(
            [Message("user", extract_prompt(question, passages))], EXTRACT_SCHEMA, name="keep_sentences",
            system=EXTRACT_SYSTEM.format(budget=budget_tokens), max_tokens=max_tokens,
        ),
        timeout_s,
    )
    return parse_keep(completion.data, passages), completion.usage, completion.provider, completion.model
