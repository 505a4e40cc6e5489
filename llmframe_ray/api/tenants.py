"""Which documents a request may see: its key's namespaces (api/auth.py) and its filter."""

from __future__ import annotations

from typing import Any

from llmframe_ray.api.auth import ApiKeys
from llmframe_ray.api.failures import FieldError, NotFoundError
from llmframe_ray.index.metadata import DEFAULT_NAMESPACE, Filter, FilterError, check_namespace, parse_filter


def namespace_for(keys: ApiKeys, presented: str | None, asked: str | None) -> str:
    """The namespace a request works in: the one it asks for, else its key's default. One its
    key may not see is answered as one that does not exist (404), whether it exists or not."""
    allowed = keys.namespaces(presented)
    name = asked if asked is not None else (allowed[0] if allowed else DEFAULT_NAMESPACE)
    try:
        check_namespace(name)
    except FilterError as exc:
        raise FieldError("namespace", str(exc)) from None
    if allowed is not None and name not in allowed:
        raise NotFoundError("namespace_not_found", f"namespace {name!r} not found")
    return name


def scope(keys: ApiKeys, presented: str | None, asked: str | None, raw_filter: Any) -> Filter:
    """The request's filter confined to its namespace (422 naming what is wrong with the filter)."""
    namespace = namespace_for(keys, presented, asked)
    try:
        return parse_filter(raw_filter, namespace)
    except FilterError as exc:
        raise FieldError("filter", str(exc)) from None


TENANT_INDEX_FIELDS = ("version", "shards", "problem")


def index_view(keys: ApiKeys, presented: str | None, info: dict[str, Any]) -> dict[str, Any]:
    """GET /v1/index: everything for an admin key; for other keys only the served version, the
    shard count and any problem (counts, BM25 statistics and manifests would tell one tenant
    about the others' documents)."""
    if keys.is_admin(presented):
        return info
    return {k: info.get(k) for k in TENANT_INDEX_FIELDS}
