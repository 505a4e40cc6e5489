"""Community summaries written by a language model through the provider chain (GraphRAG's
community reports), for graphs built with the LLM extractor (graph/llm_extract.py).

Each community is described to the model by its most connected entities (with the extractor's
descriptions), the relations among them that the extractor described, and the extractive summary
sentence (graph/communities.py) as evidence from the passages; the answer is a forced tool call
holding a two-to-three-sentence summary per community, `batch` communities per request.

Answers are cached in the index directory by a fingerprint of the community's description, so
a community that an update leaves as it was is never sent again. A community whose answer is
missing or malformed keeps its extractive summary (not cached: a later build asks again).
"""

from __future__ import annotations

import asyncio
import hashlib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from llmframe_ray.generate.base import Message
from llmframe_ray.generate.costs import PriceTable
from llmframe_ray.graph.llm_common import JsonLinesCache, LlmReport

VERSION = "llm-summary-v1"
CACHE_FILE = "graph-llm-summaries.jsonl"
ENTITIES = 12  # the most connected entities a community is described by
RELATIONS = 10

SYSTEM = (
    "You write short reports on communities of a knowledge graph built from a document collection. "
    "For each numbered community you get its main entities (with descriptions where known), the "
    "relations stated between them, and a sentence from the passages that name them. Write two or "
    "three sentences saying what the community is about and how its main entities are connected, "
    "using only what is given. Answer for every community, by its number."
)
SCHEMA = {
    "type": "object", "additionalProperties": False, "required": ["communities"],
    "properties": {"communities": {"type": "array", "items": {
        "type": "object", "additionalProperties": False, "required": ["n", "summary"],
        "properties": {"n": {"type": "integer", "description": "The community's number."}, "summary": {"type": "string"}},
    }}},
}


@dataclass
class SummaryReport(LlmReport):
    communities: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {"communities": self.communities, **self.counts()}


class SummaryCache(JsonLinesCache[str]):
    """Fingerprint of a community's description -> its summary (`{"fp", "summary"}` lines)."""

    def __init__(self, path: str | Path) -> None:
        super().__init__(path, lambda row: str(row["summary"]), lambda summary: {"summary": summary})


def community_text(graph: Any, community: Any) -> str:
    """How a community is described to the model (graph: store.KnowledgeGraph)."""
    top = list(community.entities[:ENTITIES])
    lines = [f"Community: {community.title}", "Entities:"]
    for e in top:
        about = graph.descriptions[e] if e < len(graph.descriptions) and graph.descriptions[e] else ""
        lines.append(f"- {graph.names[e]} ({graph.types[e]})" + (f": {about}" if about else ""))
    inside = set(top)
    notes = [(a, b, note) for (a, b), note in sorted(graph.relation_notes.items()) if a in inside and b in inside]
    if notes:
        lines.append("Relations:")
        lines.extend(f"- {graph.names[a]} - {graph.names[b]}: {note}" for a, b, note in notes[:RELATIONS])
    evidence = community.evidence or community.summary
    if evidence:
        lines.append(f"Evidence: {evidence}")
    return "\n".join(lines)


def fingerprint(text: str) -> str:
    return hashlib.blake2b(f"{VERSION}\x00{text}".encode(), digest_size=16).hexdigest()


def parse(data: Any, n: int) -> list[str | None]:
    """Summaries of communities 1..n (None where the answer has none); ValueError if malformed."""
    if not isinstance(data, dict) or not isinstance(data.get("communities"), list):
        raise ValueError("the answer has no 'communities' list")
    out: list[str | None] = [None] * n
    for item in data["communities"]:
        if not isinstance(item, dict) or not isinstance(item.get("n"), int) or not 1 <= item["n"] <= n:
            raise ValueError(f"a community answer has no number from 1 to {n}: {str(item)[:80]}")
        summary = item.get("summary")
        if isinstance(summary, str) and summary.strip():
            out[item["n"] - 1] = " ".join(summary.split())
    return out


class LlmSummarizer:
    name = VERSION

    def __init__(
        self, provider: Any, cache: SummaryCache, *, batch: int = 8, max_tokens: int = 2048,
        timeout_s: float = 120.0, concurrency: int = 4, prices: PriceTable | None = None,
    ) -> None:
        self.provider, self.cache = provider, cache
        self.batch, self.max_tokens, self.timeout_s, self.concurrency = batch, max_tokens, timeout_s, concurrency
        self.prices = prices or PriceTable()

    def summarize(self, graph: Any) -> tuple[list, SummaryReport]:
        """The graph's communities with the model's summaries, and the report."""
        return asyncio.run(self._summarize(graph))

    async def _summarize(self, graph: Any) -> tuple[list, SummaryReport]:
        communities = list(graph.communities)
        report = SummaryReport(communities=len(communities))
        texts = [community_text(graph, c) for c in communities]
        fps = [fingerprint(t) for t in texts]
        found: list[str | None] = [self.cache.known.get(fp) for fp in fps]
        report.cached = sum(s is not None for s in found)
        todo = [i for i, s in enumerate(found) if s is None]
        gate = asyncio.Semaphore(self.concurrency)

        async def ask(batch: list[int]) -> None:
            async with gate:
                report.requests += 1
                report.asked += len(batch)
                prompt = "\n\n".join(f"[{n}] {texts[i]}" for n, i in enumerate(batch, 1))
                try:
                    completion = await asyncio.wait_for(self.provider.structured(
                        [Message("user", prompt)], SCHEMA, name="community_summaries", system=SYSTEM,
                        max_tokens=self.max_tokens,
                    ), self.timeout_s)
                    report.charge(completion, self.prices)
                    answers = parse(completion.data, len(batch))
                except Exception as exc:  # noqa: BLE001 - keep the extractive summaries, ask again next build
                    report.fallback += len(batch)
                    report.problems.append(f"communities {batch[0]}..{batch[-1]}: {exc}")
                    return
                missing = [i for i, s in zip(batch, answers) if s is None]
                if missing:
                    report.fallback += len(missing)
                    report.problems.append(f"communities {', '.join(map(str, missing))}: no summary in the answer")
                self.cache.put_many([(fps[i], s) for i, s in zip(batch, answers) if s is not None])
                for i, s in zip(batch, answers):
                    found[i] = s

        await asyncio.gather(*(ask(todo[k : k + self.batch]) for k in range(0, len(todo), self.batch)))
        out = [c if s is None else replace(c, summary=s, evidence=c.evidence or c.summary) for c, s in zip(communities, found)]
        return out, report
