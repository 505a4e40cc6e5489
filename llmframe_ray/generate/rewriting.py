"""Query rewrites asked of the provider chain as structured output (retrieve/rewrite.py says
what each kind is). Without an LLM in the chain (no key: the extractive answerer alone) the
offline rewriters answer; a failed or empty LLM answer falls back to the original question.
"""

from __future__ import annotations

import asyncio
from typing import Any, Sequence

from llmframe_ray.generate.base import Message
from llmframe_ray.retrieve.rewrite import QueryRewrite, Rewrite, RewriteParams, decompose, standalone_offline

STANDALONE_SYSTEM = (
    "You rewrite the last question of a conversation into one standalone search query for a "
    "document index. Resolve every reference to earlier turns (pronouns, 'and in mice?', 'what "
    "about the second one?') with the words they stand for. Keep the user's terms; add nothing "
    "the conversation does not say. If the question is already standalone, return it unchanged."
)

MULTI_SYSTEM = (
    "You write alternative search queries for a document index. Given a question (and the "
    "conversation before it, if any), write {n} different queries that together find every "
    "document needed to answer it: rephrasings with other terms a document might use, and, for a "
    "question with several parts or a comparison, one query per part. Each query must stand alone."
)

STANDALONE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"query": {"type": "string", "description": "The standalone search query."}},
    "required": ["query"],
    "additionalProperties": False,
}


def queries_schema(n: int) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "queries": {
                "type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": n,
                "description": "The alternative search queries.",
            },
        },
        "required": ["queries"],
        "additionalProperties": False,
    }


def has_llm(provider: Any) -> bool:
    """Whether the chain's first provider is a model (not the offline extractive answerer)."""
    first = getattr(provider, "providers", (provider,))[0]
    return getattr(first, "name", "extractive") != "extractive"


def prompt(question: str, history: Sequence[Message]) -> str:
    """The user message of a rewrite request: the conversation, then the question."""
    turns = "\n".join(f"{m.role}: {m.content}" for m in history)
    head = f"Conversation so far:\n{turns}\n\n" if turns else ""
    return f"{head}Question: {question}"


def offline_rewrite(kind: QueryRewrite, question: str, history: Sequence[Message], params: RewriteParams) -> Rewrite:
    if kind is QueryRewrite.CONVERSATIONAL:
        return Rewrite((standalone_offline(question, history),), "offline")
    if kind is QueryRewrite.MULTI_QUERY:
        base = standalone_offline(question, history)
        return Rewrite(tuple(dict.fromkeys([base, *decompose(base, params.queries)])), "offline")
    return Rewrite((question,), "offline")


async def rewrite_query(
    provider: Any, kind: QueryRewrite, question: str, history: Sequence[Message], params: RewriteParams
) -> Rewrite:
    """The queries to retrieve for `question` (see Rewrite). PRF and none need no model: the
    question itself comes back (the caller runs the feedback pass)."""
    kind = QueryRewrite.from_str(kind)
    if kind in (QueryRewrite.NONE, QueryRewrite.PRF) or (kind is QueryRewrite.CONVERSATIONAL and not history):
        return Rewrite((question,), "offline" if kind is QueryRewrite.PRF else "none")  # nothing to ask a model
    if not has_llm(provider):
        return offline_rewrite(kind, question, history, params)
    multi = kind is QueryRewrite.MULTI_QUERY
    system = MULTI_SYSTEM.format(n=params.queries) if multi else STANDALONE_SYSTEM
    schema = queries_schema(params.queries) if multi else STANDALONE_SCHEMA
    try:
        completion = await asyncio.wait_for(
            provider.structured(
                [Message("user", prompt(question, history))], schema,
                name="search_queries" if multi else "standalone_query", system=system, max_tokens=params.max_tokens,
            ),
            params.timeout_s,
        )
        queries = parse(completion.data, multi, question, params)
    except Exception as exc:  # noqa: BLE001 - a failed rewrite is answered with the original query
        reason = f"timed out after {params.timeout_s:g} s" if isinstance(exc, asyncio.TimeoutError) else str(exc)
        return Rewrite((question,), "original", f"query rewriting ({kind.value}) failed, the original query was used: {reason}")
    return Rewrite(queries, f"llm:{completion.provider}", usage=completion.usage, model=completion.model)


def parse(data: Any, multi: bool, question: str, params: RewriteParams) -> tuple[str, ...]:
    """The queries of a structured answer: stripped, cut to `max_chars` at a word, blanks and
    repeats dropped; multi-query keeps the question first. A ValueError when nothing usable is left."""
    if not isinstance(data, dict):
        raise ValueError("the model gave no structured answer")
    raw = data.get("queries") if multi else [data.get("query")]
    if not isinstance(raw, list) or not all(isinstance(q, str) for q in raw):
        field = "queries" if multi else "query"
        raise ValueError(f"the answer's {field!r} is not {'a list of strings' if multi else 'a string'}")
    cleaned = [_cut(" ".join(q.split()), params.max_chars) for q in raw]
    queries = [q for q in dict.fromkeys(cleaned) if q]
    if not queries:
        raise ValueError("the model's answer holds no query")
    if multi:
        rest = [q for q in queries if q.casefold() != question.casefold()][: params.queries]
        return (question, *rest)
    return (queries[0],)


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit].rsplit(" ", 1)[0]
