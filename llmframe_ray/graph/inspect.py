"""What /v1/graph/entities and /v1/graph/entity/{id} show: entities, their mentions, neighbours
and communities, as JSON-ready data. Only what the caller's scope (a filter: its namespace)
selects is shown: an entity counts only through the chunks the caller may read, so another
tenant's entities and documents never appear; communities (built over every namespace, their
summaries quoting any document) are shown only to an unscoped caller (an admin key asking for
no namespace). Entity ids are per index version."""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp

from llmframe_ray.graph.search import GraphSearch
from llmframe_ray.graph.store import sentences
from llmframe_ray.index.metadata import Filter

MAX_LIMIT = 100


def _visible(gs: GraphSearch, where: Filter | None) -> tuple[sp.csc_matrix, np.ndarray]:
    """The mentions the caller may see (chunks x entities), and per entity its chunks among them."""
    mentions = sp.csc_matrix(gs.graph.mentions)
    allowed = gs.allowed(where)
    if allowed is not None:
        mentions = sp.csc_matrix(sp.diags(allowed.astype(np.float32)) @ mentions)
        mentions.eliminate_zeros()
    return mentions, np.diff(mentions.indptr)


def _entity_brief(gs: GraphSearch, entity: int, chunks: int) -> dict[str, Any]:
    graph = gs.graph
    return {"id": entity, "name": graph.names[entity], "type": graph.types[entity], "key": graph.keys[entity], "chunks": chunks}


def find_entities(gs: GraphSearch, q: str, limit: int = 10, where: Filter | None = None) -> dict[str, Any]:
    """The entities `q` names (as the graph ranker reads a query), then those whose name holds
    `q` (case-insensitive), most mentioned first."""
    limit = max(1, min(int(limit), MAX_LIMIT))
    _, counts = _visible(gs, where)
    named = [e for e in gs.ranker.named(q) if counts[e] > 0]
    needle = q.strip().casefold()
    found = list(dict.fromkeys(named))
    if needle and len(found) < limit:
        hits = [e for e, name in enumerate(gs.graph.names) if needle in name.casefold() and counts[e] > 0]
        hits.sort(key=lambda e: (-counts[e], e))
        found.extend(e for e in hits if e not in set(found))
    return {"query": q, "entities": [_entity_brief(gs, e, int(counts[e])) for e in found[:limit]]}


def describe_entity(gs: GraphSearch, entity: int, limit: int = 20, where: Filter | None = None) -> dict[str, Any]:
    """An entity's mentions (document, chunk, title), strongest neighbours (chunks naming both)
    and communities; {} if there is no such entity for the caller."""
    graph = gs.graph
    if not 0 <= entity < graph.n_entities:
        return {}
    limit = max(1, min(int(limit), MAX_LIMIT))
    mentions, counts = _visible(gs, where)
    start, end = mentions.indptr[entity], mentions.indptr[entity + 1]
    nodes, weights = mentions.indices[start:end], mentions.data[start:end]
    if len(nodes) == 0:
        return {}
    order = np.lexsort((nodes, -weights))[:limit]
    shown = []
    for node in nodes[order].tolist():
        chunk = gs.stores[int(gs.positions[node])].get(int(gs.rows[node]))
        shown.append({"doc_id": chunk.doc_id, "chunk_id": chunk.chunk_id, "title": chunk.title})
    binary = sp.csr_matrix(mentions, dtype=np.float32)
    binary.data[:] = 1.0
    together = np.asarray(binary[nodes].sum(axis=0)).ravel()  # chunks naming both, among the visible
    together[entity] = 0
    neighbours = np.flatnonzero(together > 0)
    neighbours = neighbours[np.lexsort((neighbours, -together[neighbours]))][:limit]
    out = {
        **_entity_brief(gs, entity, len(nodes)),
        "mentions": shown,
        "neighbours": [{**_entity_brief(gs, int(n), int(counts[n])), "weight": int(together[n])} for n in neighbours.tolist()],
    }
    if where is None or where.empty:
        out["communities"] = [
            {**c.as_dict(), "entities": list(c.entities[:limit])} for c in graph.communities if entity in c.entities
        ]
    return out


def communities_for(gs: GraphSearch, q: str, limit: int = 2, where: Filter | None = None) -> list[dict[str, Any]]:
    """The communities that hold the entities `q` names, as context for an answer: the most
    specific first (deepest level, then the most idf of named entities in it). Each is told from
    the caller's visible chunks only: its title names its best-connected visible entities, its
    summary is the visible sentence naming most of its members (communities.py's rule)."""
    graph, ranker = gs.graph, gs.ranker
    mentions, counts = _visible(gs, where)
    named = {e for e in ranker.named(q) if counts[e] > 0}
    if not named:
        return []
    scored = []
    for c in graph.communities:
        inside = named.intersection(c.entities)
        if inside:
            scored.append((-c.level, -sum(ranker.idf[e] for e in inside), c.id, c))
    out = []
    for _, _, _, c in sorted(scored)[: max(1, int(limit))]:
        members = [e for e in c.entities if counts[e] > 0]
        title_entities = members[: 4]
        members_set = set(members)
        best, best_count = "", 0
        chunks = np.unique(np.concatenate([mentions.indices[mentions.indptr[e] : mentions.indptr[e + 1]] for e in title_entities]))
        for node in chunks[:8].tolist():
            text = gs.stores[int(gs.positions[node])].get(int(gs.rows[node])).text
            for sentence in sentences(text):
                count = len(members_set.intersection(ranker.matcher.match(sentence)))
                if count > best_count:
                    best, best_count = sentence, count
        out.append({
            "id": c.id, "level": c.level, "size": len(members),
            "title": ", ".join(graph.names[e] for e in title_entities), "summary": best,
            "entities": [graph.names[e] for e in members[:20]],
        })
    return out


def graph_query(gs: GraphSearch | None, method: str, args: dict[str, Any]) -> Any:
    """One inspection call by name (how the Serve stages pass it along); None without a graph."""
    if gs is None:
        return None
    calls = {"entities": find_entities, "entity": describe_entity, "communities": communities_for}
    if method not in calls:
        raise ValueError(f"unknown graph query {method!r}; known: {', '.join(calls)}")
    return calls[method](gs, **args)
