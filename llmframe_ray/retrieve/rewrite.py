"""Query rewriting, the stage before retrieval (off unless a request or LLMFRAME_QUERY_REWRITE asks).

    conversational  a follow-up ("and in mice?") becomes a standalone query, from the turns before
    multi-query     several phrasings of one question, each retrieved, fused by RRF
    prf             pseudo-relevance feedback: terms of the first pass's top documents (RM3-style)
                    added to the query, the expanded query retrieved, both passes fused by RRF

With an LLM in the provider chain (a key is set), conversational and multi-query rewrites are
asked of it as structured output (`llm_rewrite`); without one, the offline rewriters here answer.
PRF needs no model. A rewrite that fails (the provider errs, answers nonsense) falls back to the
original query with a warning, never to an error. Ray-free: the API service and the evaluation
harness call these functions and drive the retrieval passes themselves.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Sequence

from llmframe_ray.generate.base import Message
from llmframe_ray.retrieve.fusion import reciprocal_rank_fusion
from llmframe_ray.retrieve.words import content_words, is_content, stem, stems, words
from llmframe_ray.types import Choice, Hit, RankedList


class QueryRewrite(Choice):
    NONE = "none"
    MULTI_QUERY = "multi-query"
    PRF = "prf"
    CONVERSATIONAL = "conversational"

    @classmethod
    def label(cls) -> str:
        return "query rewrite"


@dataclass(frozen=True)
class RewriteParams:
    """`queries`: rewrites asked of the LLM for multi-query, each list fused with weight
    `multi_weight` against the question's 1 (`parts_weight` for the offline rewriter's parts,
    which lost to plain hybrid on the tuning queries at every weight tried; 0.1 lost least);
    PRF reads the first pass's top
    `prf_docs` documents, adds `prf_terms` terms, and fuses the expanded query's list with
    weight `prf_weight` against the original's 1 (chosen on SciFact train and the first 100
    HotpotQA questions: benchmarks/rewrite_sweep.py)."""

    default: QueryRewrite = QueryRewrite.NONE
    queries: int = 3
    prf_docs: int = 3
    prf_terms: int = 5
    prf_weight: float = 0.5
    multi_weight: float = 1.0  # each LLM rewrite's list against the question's 1 (multi-query)
    parts_weight: float = 0.1  # each offline part's list against the question's 1 (multi-query without a key)
    rrf_k: int = 60
    max_tokens: int = 400  # of the LLM's rewrite answer
    max_chars: int = 2000  # a rewrite longer than this is cut at a word
    timeout_s: float = 10.0  # the whole LLM rewrite (the provider chain's retries included)

    def __post_init__(self) -> None:
        object.__setattr__(self, "default", QueryRewrite.from_str(self.default))
        for name in ("queries", "prf_docs", "prf_terms", "max_tokens", "max_chars"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)!r}")


@dataclass(frozen=True)
class Rewrite:
    """The queries retrieval runs (the first is the main one: the original question, or its
    standalone form), who wrote them (`llm:<provider>`, `offline`, or `original` after a
    failure), and a warning when rewriting failed."""

    queries: tuple[str, ...]
    source: str
    warning: str | None = None
    usage: Any = field(default=None, compare=False)  # the LLM's tokens (generate/base.py: Usage)
    model: str = ""  # the LLM that wrote them

    def reported(self, question: str) -> list[str]:
        """What a response's `rewrites` lists: every query retrieval ran but the question itself."""
        return [q for q in self.queries if q != question]


# ---------------------------------------------------------------------------------------------
# conversational, offline

_OPENER = re.compile(r"^\s*(?:and|but|also|so|or|then|ok(?:ay)?|what about|how about|what of|as for)\b[\s,]*", re.I)
_REFERRING = frozenset("it its they them their theirs this that these those he she him her his there such same one ones".split())


def needs_context(question: str) -> bool:
    """Whether a question leans on the turns before it: it opens like a follow-up ("and...",
    "what about..."), refers back (it, they, this, those...), or names at most two things."""
    lower = [w.lower() for w in words(question)]
    return bool(_OPENER.match(question)) or any(w in _REFERRING for w in lower) or len(content_words(question)) <= 2


def standalone_offline(question: str, history: Sequence[Message]) -> str:
    """The question made standalone without a model, when it needs context: the content words
    of the conversation's topic (its latest question that stood alone, so in a chain of
    follow-ups "what about rats?" after "and in mice?" replaces the mice instead of adding rats)
    that the question does not already have, then the question without its follow-up opener."""
    topic = ""
    for turn in (m.content for m in history if m.role == "user"):
        if not needs_context(turn) or not topic:
            topic = turn
    if not topic or not needs_context(question):
        return question.strip()
    return _carry(topic, question)


def _carry(context: str, question: str) -> str:
    own = {stem(w) for w in content_words(question)}
    carried, seen = [], set()
    for w in content_words(context):
        key = stem(w)
        if key not in own and key not in seen:
            carried.append(w)
            seen.add(key)
    rest = _OPENER.sub("", question).strip()
    return " ".join([*carried, rest]).strip()


# ---------------------------------------------------------------------------------------------
# multi-query, offline: the question split into its parts

_SPLIT = re.compile(r"\s*(?:[,;:?!]|\b(?:and|or|but|versus|vs\.?|compared (?:to|with)|than|whereas|while)\b)\s*", re.I)


def decompose(question: str, n: int) -> list[str]:
    """Up to `n` parts of a question that each name at least two content words (the two sides
    of a comparison, the clauses of a multi-part question), longest first; [] when it has no
    such parts. Each is retrieved beside the whole question."""
    parts = [p.strip(" .") for p in _SPLIT.split(question)]
    useful = [p for p in parts if len(content_words(p)) >= 2]
    if len(useful) < 2:
        return []
    unique = list(dict.fromkeys(useful))
    return sorted(unique, key=lambda p: -len(content_words(p)))[:n]


# ---------------------------------------------------------------------------------------------
# PRF (RM3-style)


def feedback_terms(query: str, hits: Sequence[Hit], n_docs: int, n_terms: int) -> list[str]:
    """The `n_terms` words that best describe the top `n_docs` documents of a first pass and
    are not in the query: each document's term distribution (content words of title and text)
    weighted by the document's share of the fused score (RM1), a term counted once per stem
    (shown in its most frequent form), and kept only when it is in at least two documents (one
    document's peculiar words are noise) unless fewer than three documents were given."""
    docs, seen = [], set()
    for hit in hits:
        if hit.doc_id not in seen:
            seen.add(hit.doc_id)
            docs.append(hit)
        if len(docs) == n_docs:
            break
    if not docs:
        return []
    own = set(stems(query))
    total = sum(max(h.score, 0.0) for h in docs) or float(len(docs))
    weight: Counter[str] = Counter()
    spread: Counter[str] = Counter()
    forms: dict[str, Counter[str]] = {}
    for hit in docs:
        found = [w for w in words(f"{hit.title} {hit.text}") if is_content(w) and not w.isdigit()]
        if not found:
            continue
        counts = Counter(stem(w) for w in found)
        share = (max(hit.score, 0.0) or 1.0) / total
        for key, count in counts.items():
            weight[key] += share * count / len(found)
            spread[key] += 1
        for w in found:
            forms.setdefault(stem(w), Counter())[w.lower()] += 1
    needed = 2 if len(docs) >= 3 else 1
    ranked = sorted(
        (k for k in weight if k not in own and spread[k] >= needed and len(k) > 2),
        key=lambda k: (-weight[k], k),
    )
    return [forms[k].most_common(1)[0][0] for k in ranked[:n_terms]]


def expand(query: str, terms: Sequence[str]) -> str:
    return " ".join([query.strip(), *terms]).strip()


# ---------------------------------------------------------------------------------------------
# fusing the lists of several queries


def fuse_hit_lists(
    lists: Sequence[Sequence[Hit]], weights: Sequence[float], k: int, top_k: int, by_chunk: bool = False
) -> list[Hit]:
    """One ranking from the hit lists of several queries of one question (RRF by document, or by
    chunk). A hit keeps the first list's ranker ranks when that list has it, and gains `q<i>`:
    its rank in the list of query i (q0: the first query)."""
    def key(h: Hit) -> str:
        return h.chunk_id if by_chunk else h.doc_id

    ranked = [RankedList(f"q{i}", [key(h) for h in hits], [h.score for h in hits]) for i, hits in enumerate(lists)]
    fused = reciprocal_rank_fusion(ranked, k=k, weights=list(weights), limit=top_k)
    first: dict[str, Hit] = {}
    for hits in lists:
        for h in hits:
            first.setdefault(key(h), h)
    out = []
    for rank, item in enumerate(fused, 1):
        hit = first[item.key]
        ranks = dict(hit.ranks) if "q0" in item.ranks else {}
        out.append(Hit(
            doc_id=hit.doc_id, chunk_id=hit.chunk_id, text=hit.text, title=hit.title, score=item.score,
            rank=rank, ranks={**ranks, **item.ranks}, metadata=hit.metadata,
        ))
    return out


def query_weights(n: int, params: RewriteParams, offline: bool) -> list[float]:
    """RRF weights of a multi-query fusion: the question's list 1, each rewrite's `multi_weight`
    (an LLM's) or `parts_weight` (the offline rewriter's parts of the question)."""
    return [1.0] + [params.parts_weight if offline else params.multi_weight] * (n - 1)


def prf_depth(top_k: int, params: RewriteParams) -> int:
    """How deep the first PRF pass goes: the answer's depth, and at least the feedback documents."""
    return max(top_k, params.prf_docs)
