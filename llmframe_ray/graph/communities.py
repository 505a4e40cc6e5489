"""Hierarchical Leiden communities of the entity graph, and their extractive summaries.

Level 0 partitions the whole relation graph (entities that co-occur in chunks, edge weight the
number of chunks naming both) by modularity with the Leiden algorithm (leidenalg on igraph).
Every community larger than `max_size` is partitioned again, on its own subgraph, as the next
level, down to `max_levels`: the same recursive scheme as GraphRAG's hierarchical Leiden. An
entity with no relation belongs to no community. The seed is fixed, so a build is repeatable.

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

    def as_dict(self) -> dict:
        return {
            "id": self.id, "level": self.level, "parent": self.parent, "size": len(self.entities),
            "title": self.title, "summary": self.summary, "entities": list(self.entities),
        }


def _leiden(relations: sp.csr_matrix, members: np.ndarray, resolution: float) -> list[np.ndarray]:
    """Leiden communities (each with >= 2 members) of the subgraph induced by `members`."""
    import igraph
    import leidenalg

    sub = sp.triu(relations[members][:, members], k=1).tocoo()
    if sub.nnz == 0:
        return []
    graph = igraph.Graph(n=len(members), edges=np.column_stack([sub.row, sub.col]).tolist())
    graph.es["weight"] = sub.data.astype(float).tolist()
    partition = leidenalg.find_partition(
        graph, leidenalg.RBConfigurationVertexPartition, weights="weight",
        resolution_parameter=resolution, seed=SEED, n_iterations=2,
    )
    labels = np.asarray(partition.membership)
    groups = [members[labels == c] for c in range(int(labels.max()) + 1)]
    return [g for g in groups if len(g) >= 2]


def hierarchical_leiden(
    relations: sp.csr_matrix, *, max_size: int = 64, max_levels: int = 3, resolution: float = 1.0
) -> list[tuple[int, int, np.ndarray]]:
    """(level, parent index, member entity ids) of every community, parents before children."""
    relations = sp.csr_matrix(relations)
    connected = np.flatnonzero(np.diff(relations.indptr) > 0)
    out: list[tuple[int, int, np.ndarray]] = []
    frontier = [(0, -1, connected)]
    while frontier:
        level, parent, members = frontier.pop(0)
        for group in _leiden(relations, members, resolution):
            if parent >= 0 and len(group) == len(members):
                continue  # not split further: the parent already is this community
            out.append((level, parent, np.sort(group)))
            if len(group) > max_size and level + 1 < max_levels:
                frontier.append((level + 1, len(out) - 1, np.sort(group)))
    return out


def describe(
    found: Sequence[tuple[int, int, np.ndarray]],
    relations: sp.csr_matrix,
    mentions: sp.csr_matrix,
    names: Sequence[str],
    sentences_of: Callable[[int], Sequence[tuple[str, frozenset[int]]]],
) -> list[Community]:
    """Communities with titles and extractive summaries: `mentions` is chunks x entities, and
    `sentences_of(chunk)` gives a chunk's sentences with the entity ids each one names."""
    relations = sp.csr_matrix(relations)
    by_entity = sp.csc_matrix(mentions)
    out: list[Community] = []
    for index, (level, parent, members) in enumerate(found):
        inside = relations[members][:, members]
        degree = np.asarray(inside.sum(axis=1)).ravel()
        order = members[np.lexsort((members, -degree))]
        title = ", ".join(names[e] for e in order[:TITLE_ENTITIES])
        member_set = set(members.tolist())
        chunks = np.unique(by_entity[:, order[:TITLE_ENTITIES]].indices)
        best, best_count = "", 0
        for chunk in chunks[:SUMMARY_CHUNKS].tolist():
            for sentence, named in sentences_of(chunk):
                count = len(named & member_set)
                if count > best_count:
                    best, best_count = sentence, count
        summary = best if len(best) <= SUMMARY_CHARS else best[: SUMMARY_CHARS - 3].rstrip() + "..."
        out.append(Community(index, level, parent, tuple(order.tolist()), title, summary))
    return out
