"""GET /v1/graph/entities?q= and GET /v1/graph/entity/{id}: the served version's knowledge graph,
for inspection (graph/inspect.py says what each shows, and what a tenant key may see)."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Query, Request

from llmframe_ray.api.auth import ApiKeys, presented_key
from llmframe_ray.api.failures import NotFoundError
from llmframe_ray.api.tenants import scope
from llmframe_ray.graph.inspect import MAX_LIMIT

NO_GRAPH = "the served index version has no knowledge graph (build one with `llmframe-ray graph build`)"


def add_graph_routes(app: FastAPI, stages: Any, keys: ApiKeys, auth: list[Any]) -> None:
    def where(request: Request, namespace: str | None) -> Any:
        """None (the whole graph) for an admin key that names no namespace; else the caller's scope."""
        presented = presented_key(request.headers)
        if namespace is None and keys.is_admin(presented):
            return None
        return scope(keys, presented, namespace, None)

    async def ask(method: str, args: dict[str, Any]) -> dict:
        found = await stages.graph_query(method, args)
        if found is None:
            raise NotFoundError("no_graph", NO_GRAPH)
        return found

    @app.get("/v1/graph/entities", dependencies=auth)
    async def graph_entities(
        request: Request,
        q: str = Query(..., min_length=1, max_length=500, description="Text naming entities, or part of a name."),
        limit: int = Query(10, ge=1, le=MAX_LIMIT),
        namespace: str | None = Query(None),
    ) -> dict:
        """Entities the text names (as the graph ranker reads a query), then those whose name holds it."""
        return await ask("entities", {"q": q, "limit": limit, "where": where(request, namespace)})

    @app.get("/v1/graph/entity/{entity_id}", dependencies=auth)
    async def graph_entity(
        request: Request, entity_id: int, limit: int = Query(20, ge=1, le=MAX_LIMIT), namespace: str | None = Query(None),
    ) -> dict:
        """An entity: its mentions, strongest neighbours and (unscoped callers) its communities."""
        found = await ask("entity", {"entity": entity_id, "limit": limit, "where": where(request, namespace)})
        if not found:
            raise NotFoundError("not_found", f"no entity {entity_id} in the served version's knowledge graph")
        return found
