"""Entities and relations read by a language model through the provider chain (Claude or OpenAI,
structured output), for graphs built where a key is set: `llmframe-ray graph build --extractor llm`.

Chunks go `batch` at a time in one request, numbered; the answer is a forced tool call (Claude)
or function call (OpenAI) holding, per passage, its entities (name, type, description) and the
relations between them (source, target, description). Each chunk's answer is kept in a cache
file under the index directory, keyed by a fingerprint of its title and text and of this
extractor's version, so an unchanged chunk is never sent twice, whichever version it is in.

A batch whose answer is malformed (not the schema's shape, a passage number out of range) or
that fails after the chain's retries is read by the offline extractor instead, is not cached
(a later build asks again), and is counted in the report; the build never fails for it. The
chunk's title stays a title entity either way.
"""

from __future__ import annotations

import asyncio
import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from llmframe_ray.generate.base import Message
from llmframe_ray.generate.costs import PriceTable
from llmframe_ray.graph.llm_common import JsonLinesCache, LlmReport
from llmframe_ray.graph.extract import NAME, PHRASE, QUOTED, TITLE, Mention, OfflineExtractor, entity_key, title_surface

VERSION = "llm-v1"
ENTITY_TYPES = ("person", "organization", "location", "work", "event", "concept", "other")
CACHE_FILE = "graph-llm-cache.jsonl"

SYSTEM = (
    "You build a knowledge graph from passages of a document collection. For each numbered "
    "passage, list the named entities and key concepts it states something about (people, "
    "organizations, places, works, events, and the specific concepts it is about), each with a "
    "type and a one-sentence description from what the passage says; and the relations the "
    "passage states between two of those entities, each with a one-sentence description. Use the "
    "names as the passage writes them. Leave out generic words. Answer for every passage, by its number."
)


def _array(items: dict[str, Any]) -> dict[str, Any]:
    return {"type": "array", "items": items}


def _object(properties: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": list(properties), "additionalProperties": False}


SCHEMA = _object({
    "passages": _array(_object({
        "n": {"type": "integer", "description": "The passage's number."},
        "entities": _array(_object({
            "name": {"type": "string"},
            "type": {"type": "string", "enum": list(ENTITY_TYPES)},
            "description": {"type": "string"},
        })),
        "relations": _array(_object({
            "source": {"type": "string"}, "target": {"type": "string"}, "description": {"type": "string"},
        })),
    })),
})


@dataclass(frozen=True)
class Extraction:
    """One chunk's entities (name, type, description) and relations (source, target, description)."""

    entities: tuple[tuple[str, str, str], ...] = ()
    relations: tuple[tuple[str, str, str], ...] = ()


@dataclass
class ExtractReport(LlmReport):
    chunks: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {"chunks": self.chunks, **self.counts()}


def fingerprint(title: str, text: str) -> str:
    return hashlib.blake2b(f"{VERSION}\x00{title}\x00{text}".encode(), digest_size=16).hexdigest()


class ExtractionCache(JsonLinesCache[Extraction]):
    """Fingerprint -> Extraction (`{"fp", "entities", "relations"}` lines)."""

    def __init__(self, path: str | Path) -> None:
        super().__init__(
            path, lambda row: Extraction(tuple(tuple(e) for e in row["entities"]), tuple(tuple(r) for r in row["relations"])),
            lambda e: {"entities": e.entities, "relations": e.relations},
        )


def parse(data: Any, n_passages: int) -> list[Extraction]:
    """The answer for passages 1..n (a ValueError naming what is wrong with a malformed one)."""
    if not isinstance(data, dict) or not isinstance(data.get("passages"), list):
        raise ValueError("the answer has no 'passages' list")
    out = [Extraction() for _ in range(n_passages)]
    for item in data["passages"]:
        if not isinstance(item, dict) or not isinstance(item.get("n"), int) or not 1 <= item["n"] <= n_passages:
            raise ValueError(f"a passage answer has no passage number from 1 to {n_passages}: {str(item)[:80]}")
        entities, relations = [], []
        for e in item.get("entities") or []:
            if not isinstance(e, dict) or not isinstance(e.get("name"), str) or not e["name"].strip():
                raise ValueError(f"passage {item['n']}: an entity has no name: {str(e)[:80]}")
            kind = e.get("type") if e.get("type") in ENTITY_TYPES else "other"
            entities.append((" ".join(e["name"].split()), kind, str(e.get("description") or "").strip()))
        for r in item.get("relations") or []:
            if not isinstance(r, dict) or not all(isinstance(r.get(k), str) and r[k].strip() for k in ("source", "target")):
                raise ValueError(f"passage {item['n']}: a relation needs a source and a target: {str(r)[:80]}")
            relations.append((" ".join(r["source"].split()), " ".join(r["target"].split()), str(r.get("description") or "").strip()))
        out[item["n"] - 1] = Extraction(tuple(entities), tuple(relations))
    return out


def passages_prompt(chunks: Sequence[tuple[str, str]]) -> str:
    return "\n\n".join(f"[{i}] {title}\n{text}" if title else f"[{i}] {text}" for i, (title, text) in enumerate(chunks, 1))


class LlmExtractor:
    name = VERSION

    def __init__(
        self, provider: Any, cache: ExtractionCache, *, batch: int = 8, max_tokens: int = 4096,
        timeout_s: float = 120.0, concurrency: int = 4, prices: PriceTable | None = None,
    ) -> None:
        self.provider, self.cache = provider, cache
        self.batch, self.max_tokens, self.timeout_s, self.concurrency = batch, max_tokens, timeout_s, concurrency
        self.prices = prices or PriceTable()
        self.offline = OfflineExtractor()

    async def extract_all(self, chunks: Sequence[tuple[str, str]]) -> tuple[list[list[Mention]], list[Extraction | None], ExtractReport]:
        """Per chunk (title, text): its mentions for the graph, the model's extraction (None:
        read offline), and the report."""
        report = ExtractReport(chunks=len(chunks))
        fps = [fingerprint(title, text) for title, text in chunks]
        found: list[Extraction | None] = [self.cache.known.get(fp) for fp in fps]
        report.cached = sum(e is not None for e in found)
        todo = [i for i, e in enumerate(found) if e is None]
        batches = [todo[i : i + self.batch] for i in range(0, len(todo), self.batch)]
        gate = asyncio.Semaphore(self.concurrency)

        async def ask(batch: list[int]) -> None:
            async with gate:
                report.requests += 1
                report.asked += len(batch)
                try:
                    completion = await asyncio.wait_for(self.provider.structured(
                        [Message("user", passages_prompt([chunks[i] for i in batch]))], SCHEMA,
                        name="knowledge_graph", system=SYSTEM, max_tokens=self.max_tokens,
                    ), self.timeout_s)
                    report.charge(completion, self.prices)
                    extractions = parse(completion.data, len(batch))
                except Exception as exc:  # noqa: BLE001 - read offline, ask again next build
                    report.fallback += len(batch)
                    report.problems.append(f"chunks {batch[0]}..{batch[-1]}: {exc}")
                    return
                self.cache.put_many([(fps[i], e) for i, e in zip(batch, extractions)])
                for i, e in zip(batch, extractions):
                    found[i] = e

        await asyncio.gather(*(ask(b) for b in batches))
        mentions = [
            self.offline.extract(text, title) if e is None else self.mentions(e, title)
            for (title, text), e in zip(chunks, found)
        ]
        return mentions, found, report

    @staticmethod
    def mentions(extraction: Extraction, title: str) -> list[Mention]:
        """The graph's mentions of a chunk: its title, then the model's entities by key."""
        out: dict[str, Mention] = {}
        if title.strip():
            surface = title_surface(title)
            out[entity_key(surface)] = Mention(entity_key(surface), surface, TITLE)
        for name, kind, _ in extraction.entities:
            key = entity_key(name)
            if key and key not in out:
                out[key] = Mention(key, name, GRAPH_TYPE.get(kind, PHRASE))
        return list(out.values())


# The model's types as the graph's: named things are names, works are quoted titles, the rest
# concepts (the graph ranker seeds as it does for the offline extractor's types).
GRAPH_TYPE = {"person": NAME, "organization": NAME, "location": NAME, "event": NAME, "work": QUOTED}
