"""The agent tools as data: one definition per tool (name, description, JSON Schema of its input,
the HTTP route it calls), from which the MCP server, the OpenAI `tools` list and the Anthropic
`tools` list are all made, so the three never drift apart.

The tools are thin clients of the HTTP API: an argument becomes a field of the request body under
the same name, and the API does the validating (a refused value comes back as its 422 message).
The enums below are the API's vocabulary (`/v1/search`, `/v1/query`); the tests compare them with
the served OpenAPI schema.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Mapping

from typing_extensions import NotRequired, TypedDict

RETRIEVAL_STRATEGIES = ("hybrid", "dense", "sparse", "graph", "hybrid-graph", "compressed")
QUERY_REWRITES = ("none", "multi-query", "prf", "conversational")

SEARCH_ROUTE = "/v1/search"
QUERY_ROUTE = "/v1/query"


@dataclass(frozen=True)
class ToolSpec:
    """One tool: what an agent is shown (name, description, input schema), the route its
    arguments are posted to, and the arguments left out of the body while they hold their
    default (so a request says only what the caller chose)."""

    name: str
    description: str
    input_schema: dict[str, Any]
    route: str
    omit_at_default: tuple[str, ...] = ()

    def defaults(self) -> dict[str, Any]:
        """Each optional argument's default, as the schema states it."""
        return {name: prop["default"] for name, prop in self.input_schema["properties"].items() if "default" in prop}

    def parameters(self) -> dict[str, Any]:
        """A copy of the input schema, safe for a caller to change."""
        return copy.deepcopy(self.input_schema)


def _text(description: str) -> dict[str, Any]:
    return {"type": "string", "minLength": 1, "description": description}


def _choice(values: tuple[str, ...], default: str, description: str) -> dict[str, Any]:
    return {"type": "string", "enum": list(values), "default": default, "description": description}


def _optional(kind: str, description: str, **bounds: Any) -> dict[str, Any]:
    return {"type": [kind, "null"], "default": None, "description": description, **bounds}


def _top_k(default: int, description: str) -> dict[str, Any]:
    return {"type": "integer", "minimum": 1, "default": default, "description": description}


def _object(required: str, properties: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": [required], "additionalProperties": False}


STRATEGY_HELP = (
    "How passages are found: hybrid (BM25 and dense retrieval fused by RRF), dense (embeddings only), "
    "sparse (BM25 keywords only), compressed (hybrid, then each passage cut to what bears on the query), "
    "graph (the knowledge graph: passages linked to the entities the query names, up to two hops away), "
    "hybrid-graph (BM25, dense and graph fused; for questions that chain facts across documents). "
    "The graph strategies are refused while the server's index has no knowledge graph."
)
REWRITE_HELP = (
    "Rewrite the query before retrieval: none, multi-query (several paraphrases, results fused), "
    "prf (pseudo-relevance feedback: expand with terms of the first hits), conversational "
    "(resolve a follow-up against the conversation)."
)
FILTER_HELP = (
    'Metadata filter, every field must match: {"field": value} (a list field: contains it), '
    '{"field": {"in": [...]}}, {"nin": [...]}, {"ne": v}, {"gte": x, "lt": y} (also gt, lte), {"exists": true}.'
)
NAMESPACE_HELP = "The namespace (tenant) to search; default: the API key's first."

RETRIEVE_CONTEXT = ToolSpec(
    name="retrieve_context",
    description=(
        "Search the document index and return the best-matching passages (rank, doc_id, chunk_id, title, "
        "text, score, per-ranker ranks, metadata) to ground an answer. Use it before answering a question "
        "about the indexed documents; cite passages by doc_id."
    ),
    input_schema=_object("query", {
        "query": _text("The search text: a question or keywords."),
        "retrieval_strategy": _choice(RETRIEVAL_STRATEGIES, "hybrid", STRATEGY_HELP),
        "top_k": _top_k(10, "How many passages to return (the server caps it at LLMFRAME_MAX_TOP_K)."),
        "filter": _optional("object", FILTER_HELP),
        "alpha": _optional(
            "number", "Hybrid only: the dense/sparse weight, 0 (BM25 only) to 1 (dense only); default: equal.",
            minimum=0, maximum=1,
        ),
        "query_rewrite": _choice(QUERY_REWRITES, "none", REWRITE_HELP),
        "namespace": _optional("string", NAMESPACE_HELP),
    }),
    route=SEARCH_ROUTE,
    omit_at_default=("filter", "alpha", "query_rewrite", "namespace"),
)

ANSWER = ToolSpec(
    name="answer",
    description=(
        "Answer a question from the document index: retrieves passages and has the server's language "
        "model write an answer that cites them as [n] (citations list doc_id, chunk_id, title, snippet)."
    ),
    input_schema=_object("question", {
        "question": _text("The question to answer from the indexed documents."),
        "top_k": _top_k(5, "How many passages the answer is written from."),
        "retrieval_strategy": _choice(RETRIEVAL_STRATEGIES, "hybrid", STRATEGY_HELP),
        "query_rewrite": _choice(QUERY_REWRITES, "none", REWRITE_HELP),
        "filter": _optional("object", FILTER_HELP),
        "session_id": _optional("string", "Conversation id: a follow-up question sees this session's earlier turns."),
        "namespace": _optional("string", NAMESPACE_HELP),
    }),
    route=QUERY_ROUTE,
    omit_at_default=("query_rewrite", "filter", "session_id", "namespace"),
)

TOOLS: dict[str, ToolSpec] = {spec.name: spec for spec in (RETRIEVE_CONTEXT, ANSWER)}


def request_body(spec: ToolSpec, arguments: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON body for `spec.route`: every argument under its own name, defaults filled in,
    and the arguments of `spec.omit_at_default` left out while they hold their default (None,
    or "none" for query_rewrite), so the server applies its own defaults to them."""
    unknown = sorted(set(arguments) - set(spec.input_schema["properties"]))
    if unknown:
        raise ValueError(f"{spec.name}: unknown argument(s) {', '.join(unknown)}")
    defaults = spec.defaults()
    values = {**defaults, **arguments}
    return {
        name: value for name, value in values.items()
        if not (name in spec.omit_at_default and value == defaults.get(name))
    }


def openai_tools() -> list[dict[str, Any]]:
    """The tools in the OpenAI Chat Completions `tools` format (type "function")."""
    return [
        {"type": "function", "function": {"name": s.name, "description": s.description, "parameters": s.parameters()}}
        for s in TOOLS.values()
    ]


def anthropic_tools() -> list[dict[str, Any]]:
    """The tools in the Anthropic Messages `tools` format (client tools with an input_schema)."""
    return [{"name": s.name, "description": s.description, "input_schema": s.parameters()} for s in TOOLS.values()]


class HitResult(TypedDict):
    """One retrieved passage, as `/v1/search` returns it."""

    rank: int
    doc_id: str
    chunk_id: str
    title: str
    text: str
    score: float
    ranks: dict[str, int]
    metadata: dict[str, Any]


class RetrieveContextResult(TypedDict):
    """What `retrieve_context` returns: the index version, the strategy used, the hits, and the
    rewritten queries when a query rewrite ran."""

    version: str
    retrieval_strategy: str
    hits: list[HitResult]
    rewrites: NotRequired[list[str]]


class CitationResult(TypedDict):
    """A passage the answer cites as [n]."""

    n: int
    doc_id: str
    chunk_id: str
    title: str
    snippet: str


class AnswerResult(TypedDict):
    """What `answer` returns: the answer text, its citations, who wrote it, and the index version."""

    answer: str
    citations: list[CitationResult]
    provider: str
    model: str
    version: str


HIT_FIELDS = tuple(HitResult.__annotations__)
CITATION_FIELDS = tuple(CitationResult.__annotations__)


def retrieve_context_result(response: Mapping[str, Any], requested_strategy: str) -> RetrieveContextResult:
    """The tool's result from a `/v1/search` response: hits reduced to the documented fields; the
    strategy is the one the server reports (the requested one from a server that reports none)."""
    result = RetrieveContextResult(
        version=response["version"],
        retrieval_strategy=response.get("retrieval_strategy") or requested_strategy,
        hits=[HitResult(**{key: hit[key] for key in HIT_FIELDS}) for hit in response["hits"]],
    )
    if response.get("rewrites"):
        result["rewrites"] = list(response["rewrites"])
    return result


def answer_result(response: Mapping[str, Any]) -> AnswerResult:
    """The tool's result from a `/v1/query` response."""
    return AnswerResult(
        answer=response["answer"],
        citations=[CitationResult(**{key: c[key] for key in CITATION_FIELDS}) for c in response["citations"]],
        provider=response["provider"],
        model=response["model"],
        version=response["version"],
    )
