"""The knowledge graph of one index version: entities, chunk mentions, relations, communities.

    <version>/graph/
      graph.json       {"format", "extractor", "chunks", "entities", "mentions", "relations",
                        "communities", "levels", "build_seconds", "created_at"}; written last
      entities.json    {"keys": [...], "names": [...], "types": [...]}
      communities.json [{"id", "level", "parent", "size", "title", "summary", "entities"}, ...]
      arrays.npz       chunk_shard, chunk_row (a chunk node's place in the index), the mention
                       matrix (chunks x entities; the chunk's own title entity weighs
                       TITLE_WEIGHT, other mentions 1) and the relation matrix (entities x
                       entities: chunks naming both), both CSR

A chunk mentions an entity when the extractor finds it in the chunk, or when the chunk names,
by a word n-gram, an entity that some other chunk's extraction found (extract.match_known): the
title of one chunk, written in another, is the link that multi-hop questions need.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import numpy as np
import scipy.sparse as sp

from llmframe_ray.errors import IndexLoadError
from llmframe_ray.graph.communities import Community, describe, hierarchical_leiden
from llmframe_ray.graph.extract import NAME, QUOTED, TITLE, OfflineExtractor, entity_key, match_known
from llmframe_ray.index import atomic
from llmframe_ray.index.manifest import utc_now
from llmframe_ray.types import Chunk

FORMAT = 1
GRAPH_DIR = "graph"
TITLE_WEIGHT = 3.0
_SENTENCE = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9\"“(])")


@dataclass
class KnowledgeGraph:
    keys: list[str]
    names: list[str]
    types: list[str]
    chunk_shard: np.ndarray  # int32, per chunk node: the shard id it is in
    chunk_row: np.ndarray  # int64, its row there
    mentions: sp.csr_matrix  # chunks x entities
    relations: sp.csr_matrix  # entities x entities
    communities: list[Community] = field(default_factory=list)
    info: dict = field(default_factory=dict)
    descriptions: list[str] = field(default_factory=list)  # per entity, from an LLM extractor ("" none)
    relation_notes: dict[tuple[int, int], str] = field(default_factory=dict)  # (a, b), a < b: what links them

    @property
    def n_chunks(self) -> int:
        return len(self.chunk_row)

    @property
    def n_entities(self) -> int:
        return len(self.keys)

    def entity_ids(self) -> dict[str, int]:
        return {key: i for i, key in enumerate(self.keys)}

    def document_frequency(self) -> np.ndarray:
        """Chunks that mention each entity."""
        return np.diff(sp.csc_matrix(self.mentions).indptr)

    def sizes(self) -> dict[str, int]:
        return {
            "chunks": self.n_chunks, "entities": self.n_entities, "mentions": int(self.mentions.nnz),
            "relations": int(self.relations.nnz // 2), "communities": len(self.communities),
            "levels": 1 + max((c.level for c in self.communities), default=-1),
        }

    def save(self, directory: str | Path) -> Path:
        """Write the graph as `directory` (replacing one there) via a temporary sibling."""
        directory = Path(directory)
        tmp = atomic.temp_sibling(directory)
        tmp.mkdir(parents=True)
        arrays = {"chunk_shard": self.chunk_shard, "chunk_row": self.chunk_row}
        for name, matrix in (("mentions", self.mentions), ("relations", self.relations)):
            arrays.update({f"{name}_indptr": matrix.indptr, f"{name}_indices": matrix.indices, f"{name}_data": matrix.data})
        np.savez(tmp / "arrays.npz", **arrays)
        (tmp / "entities.json").write_text(json.dumps(
            {"keys": self.keys, "names": self.names, "types": self.types, "descriptions": self.descriptions}
        ))
        (tmp / "relation_notes.json").write_text(json.dumps([[a, b, note] for (a, b), note in sorted(self.relation_notes.items())]))
        (tmp / "communities.json").write_text(json.dumps([c.as_dict() for c in self.communities]))
        (tmp / "graph.json").write_text(json.dumps({"format": FORMAT, **self.info, **self.sizes()}, indent=1))
        atomic.fsync_tree(tmp)
        if directory.exists():
            shutil.rmtree(directory)
        tmp.rename(directory)
        atomic.fsync_dir(directory.parent)
        return directory

    @classmethod
    def load(cls, directory: str | Path) -> KnowledgeGraph:
        directory = Path(directory)
        try:
            info = json.loads((directory / "graph.json").read_text(encoding="utf-8"))
            if info.get("format") != FORMAT:
                raise ValueError(f"graph format {info.get('format')!r}, this version reads {FORMAT}")
            entities = json.loads((directory / "entities.json").read_text(encoding="utf-8"))
            raw = json.loads((directory / "communities.json").read_text(encoding="utf-8"))
            notes_file = directory / "relation_notes.json"
            notes = json.loads(notes_file.read_text(encoding="utf-8")) if notes_file.is_file() else []
            with np.load(directory / "arrays.npz") as arrays:
                a = {name: arrays[name] for name in arrays.files}
        except (OSError, ValueError, KeyError) as exc:
            raise IndexLoadError(f"the knowledge graph in {directory} is unreadable: {exc}") from None
        n_chunks, n_entities = len(a["chunk_row"]), len(entities["keys"])

        def matrix(name: str, shape: tuple[int, int]) -> sp.csr_matrix:
            return sp.csr_matrix((a[f"{name}_data"], a[f"{name}_indices"], a[f"{name}_indptr"]), shape=shape)

        communities = [
            Community(c["id"], c["level"], c["parent"], tuple(c["entities"]), c["title"], c["summary"]) for c in raw
        ]
        return cls(
            entities["keys"], entities["names"], entities["types"], a["chunk_shard"], a["chunk_row"],
            matrix("mentions", (n_chunks, n_entities)), matrix("relations", (n_entities, n_entities)),
            communities, info, list(entities.get("descriptions") or []), {(a, b): note for a, b, note in notes},
        )


def sentences(text: str) -> list[str]:
    return [s.strip() for s in _SENTENCE.split(text) if s.strip()]


def build_graph(
    chunks: Iterable[tuple[int, int, Chunk]],
    extractor: OfflineExtractor | None = None,
    *,
    max_community_size: int = 64,
    progress: Callable[[str, int, int], None] | None = None,
    llm: Any = None,
) -> KnowledgeGraph:
    """The graph of (shard id, row, chunk) triples: extraction, the n-gram linking pass,
    relations, communities. `llm`: an LlmExtractor (graph/llm_extract.py) that reads the chunks
    instead of `extractor`; its report goes into the graph's info."""
    started = time.perf_counter()
    extractor = extractor or OfflineExtractor()
    places: list[tuple[int, int]] = []
    texts: list[str] = []
    titles: list[str] = []
    for shard, row, chunk in chunks:
        places.append((shard, row))
        texts.append(chunk.text)
        titles.append(chunk.title)
    extractions: list = [None] * len(texts)
    report = None
    if llm is not None:
        found, extractions, report = asyncio.run(llm.extract_all(list(zip(titles, texts))))
    else:
        found = [extractor.extract(text, title) for text, title in zip(texts, titles)]
    extract_seconds = time.perf_counter() - started

    ids: dict[str, int] = {}
    surfaces: list[Counter] = []
    kinds: list[Counter] = []
    for mentions in found:
        for m in mentions:
            if m.key not in ids:
                ids[m.key] = len(ids)
                surfaces.append(Counter())
                kinds.append(Counter())
            surfaces[ids[m.key]][m.surface] += 1
            kinds[ids[m.key]][m.type] += 1
    keys = list(ids)
    names = [max(c.items(), key=lambda kv: (kv[1], -list(c).index(kv[0])))[0] for c in surfaces]
    types = [TITLE if TITLE in k else k.most_common(1)[0][0] for k in kinds]  # a title wins
    multi = {key: i for key, i in ids.items() if " " in key}
    single = {key: i for key, i in ids.items() if " " not in key and types[i] in (TITLE, NAME, QUOTED)}

    rows, cols, data = [], [], []
    for node, (text, mentions) in enumerate(zip(texts, found)):
        weights = {ids[m.key]: (TITLE_WEIGHT if m.type == TITLE else 1.0) for m in mentions}
        for entity in match_known(text, multi, single=single):
            weights.setdefault(entity, 1.0)
        rows.extend([node] * len(weights))
        cols.extend(weights)
        data.extend(weights.values())
        if progress is not None and (node + 1) % 1000 == 0:
            progress("link", node + 1, len(texts))
    link_seconds = time.perf_counter() - started - extract_seconds
    n, e = len(places), len(keys)
    mentions = sp.csr_matrix((np.asarray(data, np.float32), (np.asarray(rows, np.int64), np.asarray(cols, np.int64))), shape=(n, e))
    mentions.sort_indices()
    binary = mentions.copy()
    binary.data[:] = 1.0
    relations = sp.csr_matrix(binary.T @ binary)
    relations.setdiag(0)
    relations.eliminate_zeros()
    relations.sort_indices()

    cache: dict[int, list[tuple[str, frozenset[int]]]] = {}

    def sentences_of(node: int) -> list[tuple[str, frozenset[int]]]:
        if node not in cache:
            cache[node] = [(s, frozenset(match_known(s, multi, single=single))) for s in sentences(texts[node])]
        return cache[node]

    clock = time.perf_counter()
    grouped = hierarchical_leiden(relations, max_size=max_community_size)
    communities = describe(grouped, relations, mentions, names, sentences_of)
    community_seconds = time.perf_counter() - clock
    shard = np.asarray([s for s, _ in places], dtype=np.int32)
    row = np.asarray([r for _, r in places], dtype=np.int64)
    descriptions = [""] * len(keys)
    notes: dict[tuple[int, int], str] = {}
    for extraction in extractions:
        for name, _, about in (extraction.entities if extraction else ()):
            entity = ids.get(entity_key(name))
            if entity is not None and about and not descriptions[entity]:
                descriptions[entity] = about
        for source, target, about in (extraction.relations if extraction else ()):
            a, b = ids.get(entity_key(source)), ids.get(entity_key(target))
            if a is not None and b is not None and a != b and about:
                notes.setdefault((min(a, b), max(a, b)), about)
    info = {
        "extractor": llm.name if llm is not None else extractor.name, "created_at": utc_now(),
        **({"llm": report.as_dict()} if report is not None else {}),
        "extract_seconds": round(extract_seconds, 3), "link_seconds": round(link_seconds, 3),
        "community_seconds": round(community_seconds, 3), "build_seconds": round(time.perf_counter() - started, 3),
    }
    return KnowledgeGraph(keys, names, types, shard, row, mentions, relations, communities, info, descriptions, notes)


def index_chunks(shards: Sequence[tuple[int, object]]) -> Iterable[tuple[int, int, Chunk]]:
    """(shard id, row, chunk) of every chunk of loaded shards given as (shard id, IndexShard)."""
    for shard_id, shard in shards:
        for row, chunk in enumerate(shard.store):
            yield shard_id, row, chunk
