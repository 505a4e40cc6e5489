"""Hierarchical Leiden communities of the entity graph, and their extractive summaries.

Level 0 partitions the whole relation graph (entities that co-occur in chunks, edge weight the
number of chunks naming both) by modularity with the Leiden algorithm (leidenalg on igraph).
Every community larger than `max_size` is partitioned again, on its own subgraph, as the next
level, down to `max_levels`: the same recursive scheme as GraphRAG's hierarchical Leiden. An
entity with no relation belongs to no community. The seed is fixed, so a build is repeatable.

An update starts from the previous version's graph (graph/store.py: build_graph `previous`):
each level's partition starts from the previous communities, and a community whose members and
their mentions are unchanged keeps its previous subtree and summary.

A community's title names its most connected entities; its summary (offline) is the sentence,
among the chunks that name its entities, naming the most of them (ties: the earlier chunk), read from the first
chunks that name its title entities.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import scipy.sparse as sp

SEED = 42
TITLE_ENTITIES = 4
SUMMARY_CHARS = 400
SUMMARY_CHUNKS = 8  # chunks read for a summary: those naming the community's title entities


@dataclass(frozen=True)
class Community:
    id: int
    level: int
    parent: int  # -1 at level 0
    entities: tuple[int, ...]  # by weighted degree inside the community, descending
    title: str = ""
    summary: str = ""
    evidence: str = ""  # the extractive summary, where a model wrote `summary` (graph/llm_summaries.py)

    def as_dict(self) -> dict:
        return {
            "id": self.id, "level": self.level, "parent": self.parent, "size": len(self.entities),
            "title": self.title, "summary": self.summary, "entities": list(self.entities),
            **({"evidence": self.evidence} if self.evidence else {}),
        }


def _leiden(relations: sp.csr_matrix, members: np.ndarray, resolution: float, initial: np.ndarray | None = None) -> list[np.ndarray]:
    """Leiden communities (each with >= 2 members) of the subgraph induced by `members`,
    started from `initial` labels (one per member, -1: a community of its own) where given."""
    import igraph
    import leidenalg

    sub = sp.triu(relations[members][:, members], k=1).tocoo()
    if sub.nnz == 0:
        return []
    graph = igraph.Graph(n=len(members), edges=np.column_stack([sub.row, sub.col]).tolist())
    graph.es["weight"] = sub.data.astype(float).tolist()
    start = None
    if initial is not None:
        labels = np.asarray(initial, dtype=np.int64).copy()
        alone = labels < 0
        labels[alone] = labels.max(initial=-1) + 1 + np.arange(int(alone.sum()))
        start = np.unique(labels, return_inverse=True)[1].tolist()
    partition = leidenalg.find_partition(
        graph, leidenalg.RBConfigurationVertexPartition, weights="weight",
        resolution_parameter=resolution, seed=SEED, n_iterations=2, initial_membership=start,
    )
    labels = np.asarray(partition.membership)
    groups = [members[labels == c] for c in range(int(labels.max()) + 1)]
    return [g for g in groups if len(g) >= 2]


Subtree = list[tuple[int, int, np.ndarray]]


def hierarchical_leiden(
    relations: sp.csr_matrix, *, max_size: int = 64, max_levels: int = 3, resolution: float = 1.0,
    initial: Sequence[np.ndarray] = (), keep: Callable[[int, np.ndarray], Subtree | None] | None = None,
    fixed: Sequence[np.ndarray] = (),
) -> list[tuple[int, int, np.ndarray]]:
    """(level, parent index, member entity ids) of every community, parents before children.

    An update of an index starts from the previous build: `initial[level]` holds each entity's
    community there (-1: none), the start of that level's partitions; and `keep(level, members)`
    gives the previous subtree under a community whose members and their mentions did not change
    (level, parent index within the subtree or -1 for the community itself, members), taken
    instead of splitting it again. `fixed`: level-0 communities that no change touched (none of
    their entities gained or lost a mention), taken as they are; level 0 then partitions only
    the other entities, so an update's cost follows what it changed."""
    relations = sp.csr_matrix(relations)
    connected = np.flatnonzero(np.diff(relations.indptr) > 0)
    taken = np.concatenate([np.asarray(g, dtype=np.int64) for g in fixed]) if len(fixed) else np.zeros(0, dtype=np.int64)
    out: list[tuple[int, int, np.ndarray]] = []
    frontier = [(0, -1, np.setdiff1d(connected, taken))]
    while frontier:
        level, parent, members = frontier.pop(0)
        start = initial[level][members] if level < len(initial) else None
        groups = _leiden(relations, members, resolution, start)
        if level == 0:
            groups = [np.asarray(g, dtype=np.int64) for g in fixed] + groups
        for group in groups:
            if parent >= 0 and len(group) == len(members):
                continue  # not split further: the parent already is this community
            out.append((level, parent, np.sort(group)))
            if len(group) <= max_size or level + 1 >= max_levels:
                continue
            kept = keep(level, out[-1][2]) if keep is not None else None
            if kept is None:
                frontier.append((level + 1, len(out) - 1, np.sort(group)))
                continue
            base, at = len(out) - 1, len(out)
            for sub_level, sub_parent, sub_members in kept:
                out.append((sub_level, base if sub_parent < 0 else at + sub_parent, sub_members))
    return out


def describe(
    found: Sequence[tuple[int, int, np.ndarray]],
    relations: sp.csr_matrix,
    mentions: sp.csr_matrix,
    names: Sequence[str],
    sentences_of: Callable[[int], Sequence[tuple[str, frozenset[int]]]],
    reuse: Callable[[int, np.ndarray], str | None] | None = None,
) -> list[Community]:
    """Communities with titles and extractive summaries: `mentions` is chunks x entities, and
    `sentences_of(chunk)` gives a chunk's sentences with the entity ids each one names;
    `reuse(level, members)`: the previous build's summary of an unchanged community, or None."""
    relations = sp.csr_matrix(relations)
    by_entity = sp.csc_matrix(mentions)
    out: list[Community] = []
    for index, (level, parent, members) in enumerate(found):
        inside = relations[members][:, members]
        degree = np.asarray(inside.sum(axis=1)).ravel()
        order = members[np.lexsort((members, -degree))]
        title = ", ".join(names[e] for e in order[:TITLE_ENTITIES])
        summary = reuse(level, members) if reuse is not None else None
        if summary is None:
            summary = _summary(members, order, by_entity, sentences_of)
        out.append(Community(index, level, parent, tuple(order.tolist()), title, summary))
    return out


def _summary(members: np.ndarray, order: np.ndarray, by_entity: sp.csc_matrix,
             sentences_of: Callable[[int], Sequence[tuple[str, frozenset[int]]]]) -> str:
    member_set = set(members.tolist())
    chunks = np.unique(by_entity[:, order[:TITLE_ENTITIES]].indices)
    best, best_count = "", 0
    for chunk in chunks[:SUMMARY_CHUNKS].tolist():
        for sentence, named in sentences_of(chunk):
            count = len(named & member_set)
            if count > best_count:
                best, best_count = sentence, count
    return best if len(best) <= SUMMARY_CHARS else best[: SUMMARY_CHARS - 3].rstrip() + "..."
