"""Build the knowledge graph of an index version and store it in that version (graph/store.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from llmframe_ray.graph.extract import OfflineExtractor
from llmframe_ray.graph.store import GRAPH_DIR, KnowledgeGraph, build_graph, index_chunks
from llmframe_ray.index.versions import IndexDirectory


def ensure_graph(
    index_dir: str | Path,
    version: str | None = None,
    *,
    rebuild: bool = False,
    max_community_size: int = 64,
    progress: Callable[[str, int, int], None] | None = None,
) -> tuple[Path, KnowledgeGraph, bool]:
    """The graph of `version` (default: the served one), built and stored there if it has
    none yet, one by another extractor version, or `rebuild`: (its folder, the graph, whether
    it was built now)."""
    index = IndexDirectory(index_dir)
    loaded = index.load(version)
    directory = loaded.path / GRAPH_DIR
    if directory.is_dir() and not rebuild:
        graph = KnowledgeGraph.load(directory)
        if graph.info.get("extractor") == OfflineExtractor.name:
            return directory, graph, False
    graph = build_graph(
        index_chunks(list(zip(loaded.shard_ids, loaded.shards))),
        max_community_size=max_community_size, progress=progress,
    )
    graph.info["version"] = loaded.version
    with index.writer_lock():
        graph.save(directory)
    return directory, graph, True
