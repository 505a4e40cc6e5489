"""The knowledge graph of one index version: entities, chunk mentions, relations, communities.

    <version>/graph/
      graph.json       {"format", "extractor", "chunks", "entities", "mentions", "relations",
                        "communities", "levels", "build_seconds", "created_at"}; written last
      entities.json    {"keys": [...], "names": [...], "types": [...]}
      communities.json [{"id", "level", "parent", "size", "title", "summary", "entities"}, ...]
      chunks.json      the fingerprint of each chunk node (batch/plan.py), what an update compares
      arrays.npz       chunk_shard, chunk_row (a chunk node's place in the index), name_entities
                       and name_vectors (the embedded names of titles and quoted names), the mention
                       matrix (chunks x entities; the chunk's own title entity weighs
                       TITLE_WEIGHT, other mentions 1) and the relation matrix (entities x
                       entities: chunks naming both), both CSR

A chunk mentions an entity when the extractor finds it in the chunk, or when the chunk names,
by a word n-gram, an entity that some other chunk's extraction found (extract.NameMatcher): the
title of one chunk, written in another, is the link that multi-hop questions need.
"""

from __future__ import annotations

import hashlib
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

from llmframe_ray.batch.plan import chunk_fingerprint
from llmframe_ray.errors import IndexLoadError
from llmframe_ray.graph.communities import Community, describe, hierarchical_leiden
from llmframe_ray.graph.extract import NAME, QUOTED, TITLE, NameMatcher, OfflineExtractor, entity_key
from llmframe_ray.graph.extractions import ExtractionStore, extract_chunks, storable
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
    chunk_fps: list[str] = field(default_factory=list)  # per chunk node: its fingerprint (batch/plan.py)
    # The embeddings of the seedable entities' names (titles, quoted names): a query's own
    # embedding finds the entities it means without naming them word for word (graph/rank.py).
    name_entities: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    name_vectors: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), dtype=np.float16))

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
        arrays = {"chunk_shard": self.chunk_shard, "chunk_row": self.chunk_row,
                  "name_entities": self.name_entities, "name_vectors": self.name_vectors}
        for name, matrix in (("mentions", self.mentions), ("relations", self.relations)):
            arrays.update({f"{name}_indptr": matrix.indptr, f"{name}_indices": matrix.indices, f"{name}_data": matrix.data})
        np.savez(tmp / "arrays.npz", **arrays)
        (tmp / "entities.json").write_text(json.dumps(
            {"keys": self.keys, "names": self.names, "types": self.types, "descriptions": self.descriptions}
        ))
        (tmp / "relation_notes.json").write_text(json.dumps([[a, b, note] for (a, b), note in sorted(self.relation_notes.items())]))
        (tmp / "chunks.json").write_text(json.dumps(self.chunk_fps))
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
            fps_file = directory / "chunks.json"  # graphs built before updates started from one have none
            chunk_fps = json.loads(fps_file.read_text(encoding="utf-8")) if fps_file.is_file() else []
            with np.load(directory / "arrays.npz") as arrays:
                a = {name: arrays[name] for name in arrays.files}
        except (OSError, ValueError, KeyError) as exc:
            raise IndexLoadError(f"the knowledge graph in {directory} is unreadable: {exc}") from None
        n_chunks, n_entities = len(a["chunk_row"]), len(entities["keys"])

        def matrix(name: str, shape: tuple[int, int]) -> sp.csr_matrix:
            return sp.csr_matrix((a[f"{name}_data"], a[f"{name}_indices"], a[f"{name}_indptr"]), shape=shape)

        communities = [
            Community(c["id"], c["level"], c["parent"], tuple(c["entities"]), c["title"], c["summary"], c.get("evidence", ""))
            for c in raw
        ]
        return cls(
            entities["keys"], entities["names"], entities["types"], a["chunk_shard"], a["chunk_row"],
            matrix("mentions", (n_chunks, n_entities)), matrix("relations", (n_entities, n_entities)),
            communities, info, list(entities.get("descriptions") or []), {(a, b): note for a, b, note in notes},
            chunk_fps, a.get("name_entities", np.zeros(0, dtype=np.int64)),
            a.get("name_vectors", np.zeros((0, 0), dtype=np.float16)),
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
    store: ExtractionStore | None = None,
    previous: KnowledgeGraph | None = None,
    summarizer: Any = None,
    embed: Callable[[list[str]], np.ndarray] | None = None,
) -> KnowledgeGraph:
    """The graph of (shard id, row, chunk) triples: extraction, the n-gram linking pass,
    relations, communities. `llm`: an LlmExtractor (graph/llm_extract.py) that reads the chunks
    instead of `extractor`; its report goes into the graph's info. `store`: chunks already
    extracted are read from it, the others are extracted and added. `previous`: the graph of
    the version this one updates; its communities are the start (graph/communities.py).
    `summarizer`: an LlmSummarizer (graph/llm_summaries.py) writes the community summaries.
    `embed`: the index's embedder (texts -> unit vectors) embeds the seedable entities' names
    (those `previous` has are taken from it)."""
    started = time.perf_counter()
    extractor = extractor or OfflineExtractor()
    places: list[tuple[int, int]] = []
    texts: list[str] = []
    titles: list[str] = []
    fps: list[str] = []
    for shard, row, chunk in chunks:
        places.append((shard, row))
        texts.append(chunk.text)
        titles.append(chunk.title)
        fps.append(chunk_fingerprint(chunk))
    known = store.read(fps) if store is not None else {}
    todo = [i for i, fp in enumerate(fps) if fp not in known]
    entries, report = extract_chunks([(titles[i], texts[i]) for i in todo], extractor, llm)
    if store is not None:
        store.write(storable([(fps[i], entry) for i, entry in zip(todo, entries)], llm))
    known.update((fps[i], entry) for i, entry in zip(todo, entries))
    found = [known[fp][0] for fp in fps]
    extractions = [known[fp][1] for fp in fps]
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
    matcher = NameMatcher(multi, single)

    rows, cols, data = [], [], []
    for node, (text, mentions) in enumerate(zip(texts, found)):
        weights = {ids[m.key]: (TITLE_WEIGHT if m.type == TITLE else 1.0) for m in mentions}
        for entity in matcher.match(text):
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
            cache[node] = [(s, frozenset(matcher.match(s))) for s in sentences(texts[node])]
        return cache[node]

    clock = time.perf_counter()
    update = _Update(previous, keys, ids, mentions, fps) if previous is not None and previous.chunk_fps else None
    grouped = hierarchical_leiden(
        relations, max_size=max_community_size, initial=update.initial if update else (),
        keep=update.subtree if update else None, fixed=update.fixed if update else (),
    )
    communities = describe(grouped, relations, mentions, names, sentences_of, reuse=update.summary if update else None)
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
        "extracted": len(todo), "extractions_reused": len(fps) - len(todo),
        **({"updated": previous.info.get("version"), **update.counts} if update else {}),
        "extract_seconds": round(extract_seconds, 3), "link_seconds": round(link_seconds, 3),
        "community_seconds": round(community_seconds, 3), "build_seconds": round(time.perf_counter() - started, 3),
    }
    graph = KnowledgeGraph(keys, names, types, shard, row, mentions, relations, communities, info, descriptions, notes, fps)
    if embed is not None:
        clock = time.perf_counter()
        graph.name_entities, graph.name_vectors, embedded = _name_vectors(keys, names, types, embed, previous)
        info.update(names_embedded=embedded, name_seconds=round(time.perf_counter() - clock, 3))
    if summarizer is not None:
        clock = time.perf_counter()
        graph.communities, summaries = summarizer.summarize(graph)
        info.update(summarizer=summarizer.name, llm_summaries=summaries.as_dict(),
                    summary_seconds=round(time.perf_counter() - clock, 3), build_seconds=round(time.perf_counter() - started, 3))
    return graph


def _name_vectors(keys, names, types, embed, previous) -> tuple[np.ndarray, np.ndarray, int]:
    """(entity ids, float16 unit vectors of their names, how many were embedded now) for the
    titles and quoted names; a name the previous graph embedded is taken from it."""
    wanted = np.asarray([i for i, t in enumerate(types) if t in (TITLE, QUOTED)], dtype=np.int64)
    known: dict[str, np.ndarray] = {}
    if previous is not None and len(previous.name_entities):
        known = {previous.keys[e]: v for e, v in zip(previous.name_entities.tolist(), previous.name_vectors)}
    todo = [int(e) for e in wanted if keys[e] not in known]
    fresh = dict(zip(todo, embed([names[e] for e in todo]))) if todo else {}
    if not len(wanted):
        return wanted, np.zeros((0, 0), dtype=np.float16), 0
    vectors = np.stack([fresh[e] if e in fresh else known[keys[e]] for e in wanted.tolist()]).astype(np.float16)
    return wanted, vectors, len(todo)


class _Update:
    """What a build takes from the graph of the version it updates: each level's previous
    communities as the start of its partitions, and the subtree and summary of a community whose
    members are mentioned by the same chunks in the same way (a signature of (chunk
    fingerprint, entity key) pairs) as one of the previous graph's."""

    def __init__(self, previous: KnowledgeGraph, keys: Sequence[str], ids: dict[str, int],
                 mentions: sp.csr_matrix, fps: Sequence[str]) -> None:
        self.previous, self.ids = previous, ids
        self.signature, new_pairs = _signer(mentions, fps, keys)
        old_signature, old_pairs = _signer(previous.mentions, previous.chunk_fps, previous.keys)
        levels = 1 + max((c.level for c in previous.communities), default=-1)
        self.initial = [np.full(len(keys), -1, dtype=np.int64) for _ in range(levels)]
        self.new_ids = np.asarray([ids.get(k, -1) for k in previous.keys], dtype=np.int64)
        self.by_signature: dict[tuple[int, bytes], int] = {}
        for c in previous.communities:
            members = np.asarray(c.entities, dtype=np.int64)
            moved = self.new_ids[members]
            self.initial[c.level][moved[moved >= 0]] = c.id
            self.by_signature[(c.level, old_signature(np.sort(members)))] = c.id
        # an entity is touched when it gained or lost a mention: (chunk, key) pairs in one graph only
        new_hashes, old_hashes = _pair_hashes(*new_pairs), _pair_hashes(*old_pairs)
        touched = set(keys[i] for i in new_pairs[1][~np.isin(new_hashes, old_hashes)].tolist())
        touched.update(previous.keys[i] for i in old_pairs[1][~np.isin(old_hashes, new_hashes)].tolist())
        self.fixed = [
            np.sort(self.new_ids[np.asarray(c.entities, dtype=np.int64)]) for c in previous.communities
            if c.level == 0 and not any(previous.keys[e] in touched for e in c.entities)
        ]
        self.counts = {"communities_kept": 0, "summaries_kept": 0, "entities_touched": len(touched),
                       "level0_kept": len(self.fixed)}

    def _match(self, level: int, members: np.ndarray) -> int | None:
        return self.by_signature.get((level, self.signature(members)))

    def subtree(self, level: int, members: np.ndarray) -> list[tuple[int, int, np.ndarray]] | None:
        found = self._match(level, members)
        if found is None:
            return None
        inside, out = {found: -1}, []
        for c in self.previous.communities[found + 1 :]:
            if c.parent in inside:
                inside[c.id] = len(out)
                out.append((c.level, inside[c.parent], np.sort(self.new_ids[np.asarray(c.entities, dtype=np.int64)])))
        self.counts["communities_kept"] += len(out)
        return out

    def summary(self, level: int, members: np.ndarray) -> str | None:
        found = self._match(level, members)
        if found is None:
            return None
        self.counts["summaries_kept"] += 1
        kept = self.previous.communities[found]
        return kept.evidence or kept.summary  # a model's summary is asked for again (its cache answers)


def _pair_hashes(chunk_hashes: np.ndarray, entities: np.ndarray, key_hashes: np.ndarray) -> np.ndarray:
    return chunk_hashes * np.uint64(0x9E3779B97F4A7C15) ^ key_hashes[entities]


def _signer(mentions: sp.csr_matrix, fps: Sequence[str], keys: Sequence[str]) -> tuple[Callable[[np.ndarray], bytes], tuple]:
    """A signature of a set of entities (the (chunk, key) pairs of their mentions), and every
    mention as (chunk hash, entity id, the keys' hashes)."""
    by_entity = sp.csc_matrix(mentions)
    chunk_ids = np.asarray([int(fp[:16], 16) for fp in fps], dtype=np.uint64)
    key_ids = np.asarray([int.from_bytes(hashlib.blake2b(k.encode(), digest_size=8).digest(), "little") for k in keys], dtype=np.uint64)
    every = sp.csr_matrix(mentions).tocoo()

    def signature(members: np.ndarray) -> bytes:
        sub = by_entity[:, members].tocoo()
        pairs = np.stack([chunk_ids[sub.row], key_ids[members][sub.col]], axis=1)
        pairs = pairs[np.lexsort((pairs[:, 1], pairs[:, 0]))]
        return hashlib.blake2b(pairs.tobytes(), digest_size=16).digest()

    return signature, (chunk_ids[every.row], every.col.astype(np.int64), key_ids)


def index_chunks(shards: Sequence[tuple[int, object]]) -> Iterable[tuple[int, int, Chunk]]:
    """(shard id, row, chunk) of every chunk of loaded shards given as (shard id, IndexShard)."""
    for shard_id, shard in shards:
        for row, chunk in enumerate(shard.store):
            yield shard_id, row, chunk
