"""One document of an index as each retained version holds it (GET /v1/documents/{id})."""

from __future__ import annotations

from typing import Any

import numpy as np

from llmframe_ray.index.metadata import public_id
from llmframe_ray.index.shard import shard_of
from llmframe_ray.index.store import ChunkStore
from llmframe_ray.index.versions import IndexDirectory, shard_dir_name


def document_in(directory: IndexDirectory, version: str, stored_id: str) -> dict[str, Any] | None:
    """The document's title, metadata and chunks in `version` (None when it is not there). Only
    the chunk store of the one shard its id routes to is opened, memory-mapped."""
    info = directory.version_info(version)
    shard = shard_of(stored_id, int(info["shards"]))
    if shard in set(info.get("empty_shards", [])):
        return None
    store = ChunkStore.load(directory.versions_dir / version / shard_dir_name(shard), mmap=True)
    try:
        code = store.doc_table.index(stored_id)
    except ValueError:
        return None
    chunks = store.get_many(np.flatnonzero(np.asarray(store.doc_index) == code).tolist())
    return {
        "title": chunks[0].title,
        "metadata": dict(store.doc_metadata[code]),
        "chunks": [
            {"chunk_id": public_id(c.chunk_id), "position": c.position, "text": c.text, "start": c.start, "end": c.end}
            for c in chunks
        ],
    }


def find_document(directory: IndexDirectory, stored_id: str) -> dict[str, Any] | None:
    """The document as the served version holds it (or the newest retained version that does:
    `current` says which), with every retained version that holds it; None when none does."""
    current = directory.current_version()
    found: dict[str, dict[str, Any]] = {}
    for version in directory.versions():
        doc = document_in(directory, version, stored_id)
        if doc is not None:
            found[version] = doc
    if not found:
        return None
    shown = current if current in found else max(found)
    return {
        **found[shown], "version": shown, "current": shown == current, "current_version": current, "versions": sorted(found),
    }
