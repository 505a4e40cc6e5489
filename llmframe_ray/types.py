"""Frozen value types shared by every stage: documents, chunks, hits, answers and search modes."""

from __future__ import annotations

import enum
import json
import re
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Mapping, TypeVar

E = TypeVar("E", bound=enum.Enum)


def _frozen_mapping(value: Mapping[str, object] | None) -> Mapping[str, object]:
    return MappingProxyType(dict(value or {}))


class _Reducible:
    """Pickle a frozen dataclass through its constructor: its read-only mappings
    (MappingProxyType) cannot be pickled as they are, plain dicts can."""

    def __reduce__(self):
        values = []
        for f in fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            values.append(dict(value) if isinstance(value, MappingProxyType) else value)
        return (type(self), tuple(values))


def parse_enum(cls: type[E], value: object, what: str) -> E:
    """`value` as a member of the string Enum `cls`; a bad value names the valid ones."""
    if isinstance(value, cls):
        return value
    try:
        return cls(str(value).strip().lower())
    except ValueError:
        valid = ", ".join(str(m.value) for m in cls)
        raise ValueError(f"unknown {what} {value!r}; valid {what}s: {valid}") from None


class Choice(str, enum.Enum):
    """A string Enum of named choices (modes, kinds): `from_str` takes a member or its value in
    any case, and a bad value raises a ValueError that lists the valid ones. The error names the
    choice after the class (`SearchMode` -> "search mode") unless `label` says otherwise."""

    @classmethod
    def label(cls) -> str:
        return re.sub(r"(?<!^)(?=[A-Z])", " ", cls.__name__).lower()

    @classmethod
    def from_str(cls: type[E], value: object) -> E:
        if isinstance(value, cls):  # the usual case, on every request: no label, no parsing
            return value
        return parse_enum(cls, value, cls.label())


def passage_text(title: str, text: str) -> str:
    """What every ranker reads for a chunk (BM25, the embedder, the cross-encoder at training
    and at serving time): the document title, when there is one, a newline, the chunk text."""
    return f"{title}\n{text}" if title else text


class SearchMode(Choice):
    """Which rankers answer a query: BM25, dense retrieval, the knowledge graph (graph/rank.py),
    or several of them fused by RRF."""

    BM25 = "bm25"
    DENSE = "dense"
    HYBRID = "hybrid"
    GRAPH = "graph"
    HYBRID_GRAPH = "hybrid-graph"

    @property
    def rankers(self) -> tuple[str, ...]:
        """The names of the ranked lists this mode fuses (one: no fusion), in fusion order."""
        return _MODE_RANKERS[self.value]

    @property
    def uses_bm25(self) -> bool:
        return "bm25" in self.rankers

    @property
    def uses_dense(self) -> bool:
        return "dense" in self.rankers

    @property
    def uses_graph(self) -> bool:
        return "graph" in self.rankers

    @property
    def fused(self) -> bool:
        return len(self.rankers) > 1


# The modes that every index answers (the graph modes need a knowledge graph in the version).
INDEX_MODES = (SearchMode.BM25, SearchMode.DENSE, SearchMode.HYBRID)

_MODE_RANKERS = {
    "bm25": ("bm25",), "dense": ("dense",), "hybrid": ("bm25", "dense"),
    "graph": ("graph",), "hybrid-graph": ("bm25", "dense", "graph"),
}


@dataclass(frozen=True)
class Document(_Reducible):
    """A parsed source document. `doc_id` is stable across re-ingestion."""

    doc_id: str
    text: str
    title: str = ""
    source: str = ""
    metadata: Mapping[str, object] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "metadata", _frozen_mapping(self.metadata))


@dataclass(frozen=True)
class Chunk(_Reducible):
    """A piece of one document, small enough for the embedder.

    `chunk_id` is derived from the document id, the position and the text, never from metadata.
    `start`/`end` are character offsets of `text` in the document's text. `metadata` is its
    document's (index/metadata.py says which values filters can match).
    """

    chunk_id: str
    doc_id: str
    position: int
    text: str
    title: str = ""
    start: int = 0
    end: int = 0
    n_tokens: int = 0
    metadata: Mapping[str, object] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "metadata", _frozen_mapping(self.metadata))

    @property
    def indexed_text(self) -> str:
        """What the rankers and the reranker see (`passage_text`)."""
        return passage_text(self.title, self.text)

    def to_json(self) -> str:
        """The chunk as one compact JSON object (every field; `metadata` only when it is not
        empty, so a chunk without metadata keeps the form, and fingerprint, it always had):
        stored, staged and fingerprinted in this form."""
        record = {f.name: getattr(self, f.name) for f in fields(self)}
        if record["metadata"]:
            record["metadata"] = dict(record["metadata"])
        else:
            del record["metadata"]
        return json.dumps(record, ensure_ascii=False, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | bytes) -> Chunk:
        return cls(**json.loads(text))


@dataclass(frozen=True)
class RankedList:
    """One ranker's answer: keys (chunk or document ids) best first, with that ranker's scores."""

    name: str
    keys: tuple[str, ...]
    scores: tuple[float, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "keys", tuple(self.keys))
        object.__setattr__(self, "scores", tuple(float(s) for s in self.scores))
        if len(self.keys) != len(self.scores):
            raise ValueError(
                f"ranked list {self.name!r} has {len(self.keys)} keys but {len(self.scores)} scores"
            )
        if len(set(self.keys)) != len(self.keys):
            raise ValueError(f"ranked list {self.name!r} contains a key more than once")

    def __len__(self) -> int:
        return len(self.keys)


@dataclass(frozen=True)
class Hit(_Reducible):
    """One search result.

    `score` is the final score of the mode (BM25 score, cosine similarity, or fused RRF score;
    after reranking, the reranked head's fused score (retrieve/rerank.py; the cross-encoder's
    own with fusion `none`), while hits below the rerank depth keep their retrieval score: the
    order is `rank`, not `score`);
    `ranks` maps each ranker that found this item to its 1-based rank there.
    """

    doc_id: str
    chunk_id: str
    text: str
    score: float
    rank: int
    title: str = ""
    ranks: Mapping[str, int] = field(default_factory=dict, hash=False)
    metadata: Mapping[str, object] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "ranks", _frozen_mapping(self.ranks))
        object.__setattr__(self, "metadata", _frozen_mapping(self.metadata))

    @property
    def passage(self) -> str:
        """What the cross-encoder reads for this hit (`passage_text`)."""
        return passage_text(self.title, self.text)


@dataclass(frozen=True)
class Citation:
    """A retrieved chunk that an answer quotes; `n` is the number shown as `[n]` in the text."""

    n: int
    doc_id: str
    chunk_id: str
    title: str
    snippet: str


@dataclass(frozen=True)
class Answer:
    """A generated (or extracted) answer with the citations its text refers to.

    `finish_reason` is "stop" for a complete answer; other values say why it is not one
    (for example "no_context" when nothing was retrieved).
    """

    text: str
    citations: tuple[Citation, ...]
    provider: str
    model: str
    finish_reason: str = "stop"

    def __post_init__(self) -> None:
        object.__setattr__(self, "citations", tuple(self.citations))

    @property
    def cited(self) -> bool:
        """True when the answer cites at least one chunk."""
        return len(self.citations) > 0
