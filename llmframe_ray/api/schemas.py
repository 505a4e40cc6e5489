"""Request and response bodies of the HTTP API (pydantic; the OpenAPI schema at /docs)."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from llmframe_ray.generate.sessions import SESSION_ID, check_session_id
from llmframe_ray.types import Answer, Hit

Mode = Literal["bm25", "dense", "hybrid"]
RankedBy = Literal["bm25", "dense", "hybrid", "graph", "hybrid-graph"]  # a response's mode (graph: retrieval_strategy)
Level = Literal["document", "chunk"]


# What the models cannot take and no real text holds: UTF-16 surrogates that JSON's \\uXXXX
# escapes can smuggle in unpaired, and control characters other than tab and line breaks.
_BAD_CHARACTER = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ud800-\udfff]")


# The same rule for the OpenAPI schema (ECMA-262 regex): no such character, and at least one
# that is not whitespace. Surrogates are left out: JSON Schema strings cannot hold them unpaired.
_TEXT_CHAR = "[^\\u0000-\\u0008\\u000b\\u000c\\u000e-\\u001f\\u007f-\\u009f]"
TEXT_PATTERN = f"^{_TEXT_CHAR}*[^\\s\\u0000-\\u001f\\u007f-\\u009f]{_TEXT_CHAR}*$"


def check_text(value: str) -> str:
    """`value` unchanged, or a ValueError naming its first character that is not text."""
    bad = _BAD_CHARACTER.search(value)
    if bad is not None:
        char = bad.group()
        what = "an unpaired UTF-16 surrogate" if "\ud800" <= char <= "\udfff" else "a control character"
        raise ValueError(f"contains {what} (U+{ord(char):04X}) at character {bad.start()}; send valid Unicode text")
    return value


def _not_blank(value: str) -> str:
    stripped = check_text(value).strip()
    if not stripped:
        raise ValueError("must not be empty or whitespace only")
    return stripped


FILTER = Field(
    None,
    description=(
        'Metadata filter, all fields at once: {"field": value} (a list field: contains it), '
        '{"field": {"in": [...]}}, {"nin": [...]}, {"ne": v}, {"gte": x, "lt": y} (also gt, lte; numbers or '
        'strings), {"exists": true}. Each ranker ranks only the matching chunks (exact top k).'
    ),
)
NAMESPACE = Field(None, description="The namespace (tenant) to search; default: the API key's first.")


Strategy = Literal["hybrid", "dense", "sparse", "graph", "hybrid-graph", "compressed"]
Rewrite = Literal["none", "multi-query", "prf", "conversational"]


class PipelineFields(BaseModel):
    """The advanced pipeline's request fields (retrieve/strategy.py, rewrite.py, compress.py)."""

    retrieval_strategy: Strategy | None = Field(
        None, description=(
            "hybrid (BM25 + dense, RRF), dense, sparse (BM25), compressed (hybrid, then only the sentences "
            "that matter for the question) or graph (needs a knowledge graph in the index). Default: `mode`."
        ),
    )
    alpha: float | None = Field(
        None, ge=0, le=1,
        description="Dense weight in hybrid RRF: dense 2*alpha, BM25 2*(1-alpha); 0.5 weighs them equally (default: configured weights).",
    )
    query_rewrite: Rewrite | None = Field(
        None, description=(
            "none, multi-query (several phrasings, fused), prf (pseudo-relevance feedback terms) or "
            "conversational (a follow-up made standalone from the session or chat). Default: LLMFRAME_QUERY_REWRITE."
        ),
    )
    compression_budget_tokens: int | None = Field(
        None, ge=1, le=1_000_000,
        description="retrieval_strategy compressed: passage tokens kept, instead of the default rule (an evidence threshold, "
                    "or LLMFRAME_COMPRESSION_BUDGET_TOKENS).",
    )
    compression_threshold: float | None = Field(
        None, description="retrieval_strategy compressed: also keep every sentence scoring at least this.",
    )
    include_communities: bool = Field(
        False, description=(
            "Append the knowledge graph's community summaries for the entities the question names after the "
            "top_k hits (doc_id community:<id>), as context an answer can cite. Needs a knowledge graph."
        ),
    )


class SearchRequest(PipelineFields):
    model_config = ConfigDict(extra="forbid")

    query: str = Field(..., description="The search text.", json_schema_extra={"pattern": TEXT_PATTERN})
    top_k: int = Field(10, ge=1, le=1000, description="Hits to return (at most LLMFRAME_MAX_TOP_K).")
    mode: Mode | None = Field(None, description="bm25, dense or hybrid (default: hybrid if HYBRID_SEARCH_ENABLED).")
    rerank: bool | None = Field(None, description="Rescore the head with the cross-encoder (default: RERANKER_ENABLED).")
    level: Level = Field("document", description="document: best chunk per document; chunk: every chunk.")
    filter: dict[str, Any] | None = FILTER
    namespace: str | None = NAMESPACE

    _query = field_validator("query")(_not_blank)


class QueryRequest(PipelineFields):
    model_config = ConfigDict(extra="forbid")

    question: str = Field(..., description="The question to answer from the index.", json_schema_extra={"pattern": TEXT_PATTERN})
    top_k: int = Field(5, ge=1, le=1000, description="Passages given to the generator.")
    stream: bool = Field(False, description="Answer as Server-Sent Events.")
    mode: Mode | None = None
    rerank: bool | None = None
    filter: dict[str, Any] | None = FILTER
    namespace: str | None = NAMESPACE
    session_id: str | None = Field(
        None, description="Conversation id: follow-up questions see this session's earlier turns.",
        json_schema_extra={"pattern": SESSION_ID.pattern},
    )

    _question = field_validator("question")(_not_blank)

    @field_validator("session_id")
    @classmethod
    def _session(cls, value: str | None) -> str | None:
        return None if value is None else check_session_id(value)


class HitOut(BaseModel):
    rank: int
    doc_id: str
    chunk_id: str
    title: str
    text: str
    score: float
    ranks: dict[str, int] = Field(description="Rank each ranker gave this item (bm25, dense, rerank).")
    metadata: dict[str, Any] = Field(default_factory=dict, description="The document's metadata.")

    @classmethod
    def of(cls, hit: Hit) -> HitOut:
        return cls(
            rank=hit.rank, doc_id=hit.doc_id, chunk_id=hit.chunk_id, title=hit.title,
            text=hit.text, score=hit.score, ranks=dict(hit.ranks), metadata=dict(hit.metadata),
        )


REWRITES = Field(default_factory=list, description="The queries retrieval ran besides the question (query_rewrite).")
WARNINGS = Field(default_factory=list, description="Degraded answers say why (also in the X-LLMFrame-Warning header).")


class SearchResponse(BaseModel):
    version: str
    mode: RankedBy
    retrieval_strategy: Strategy
    level: Level
    reranked: bool
    rewrites: list[str] = REWRITES
    hits: list[HitOut]
    timings_ms: dict[str, float]
    warnings: list[str] = WARNINGS


class CitationOut(BaseModel):
    n: int = Field(description="The [n] marker in the answer.")
    doc_id: str
    chunk_id: str
    title: str
    snippet: str


class UsageOut(BaseModel):
    input_tokens: int
    output_tokens: int
    cost_usd: float | None = Field(description="From the price table (LLMFRAME_LLM_PRICES); null for an unpriced model.")


class AnswerOut(BaseModel):
    answer: str
    cited: bool = Field(description="False when the answer cites no passage.")
    citations: list[CitationOut]
    provider: str = Field(description="The provider that answered (anthropic, openai, extractive).")
    model: str
    finish_reason: str
    usage: UsageOut

    @classmethod
    def of(cls, answer: Answer, usage: UsageOut) -> AnswerOut:
        return cls(
            answer=answer.text,
            cited=answer.cited,
            citations=[CitationOut(**vars(c)) for c in answer.citations],
            provider=answer.provider,
            model=answer.model,
            finish_reason=answer.finish_reason,
            usage=usage,
        )


class QueryResponse(AnswerOut):
    session_id: str | None
    version: str
    mode: RankedBy
    retrieval_strategy: Strategy
    reranked: bool
    rewrites: list[str] = REWRITES
    timings_ms: dict[str, float]
    warnings: list[str] = WARNINGS


class ErrorBody(BaseModel):
    type: str
    message: str
    field: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorBody


def document_limits(schema: dict[str, Any], max_top_k: int, max_query_chars: int) -> None:
    bodies = schema.get("components", {}).get("schemas", {})
    for name in ("SearchRequest", "QueryRequest", "ChatRequest"):
        properties = bodies.get(name, {}).get("properties", {})
        if "top_k" in properties:
            properties["top_k"]["maximum"] = max_top_k
        for text in ("query", "question"):
            if text in properties:
                properties[text]["maxLength"] = max_query_chars
