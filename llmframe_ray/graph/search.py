"""A knowledge graph bound to the shards that one process holds: it answers a retrieval plan's
SearchGraph requests (retrieve/plan.py) with the same ShardResults that shard searches give, so
its list fuses with BM25 and dense lists by the same rules."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from llmframe_ray.errors import IndexLoadError
from llmframe_ray.graph.params import GraphParams
from llmframe_ray.graph.rank import GraphRanker
from llmframe_ray.graph.store import GRAPH_DIR, KnowledgeGraph
from llmframe_ray.index.metadata import Filter
from llmframe_ray.index.store import ChunkStore
from llmframe_ray.retrieve.candidates import ShardAnswer, concat_keys, first_occurrences
from llmframe_ray.retrieve.plan import ResultLevel


class GraphSearch:
    """`stores[i]` is the chunk store of plan shard i, whose shard id is `shard_ids[i]`."""

    def __init__(
        self, graph: KnowledgeGraph, stores: Sequence[ChunkStore], shard_ids: Sequence[int], params: GraphParams | None = None
    ) -> None:
        self.graph = graph
        self.ranker = GraphRanker(graph, params)
        self.stores = list(stores)
        position_of = {int(s): i for i, s in enumerate(shard_ids)}
        unknown = sorted(set(np.unique(graph.chunk_shard).tolist()) - set(position_of))
        if unknown or graph.n_chunks != sum(len(s) for s in self.stores):
            raise IndexLoadError(
                f"the knowledge graph ({graph.n_chunks} chunks, shards {sorted(np.unique(graph.chunk_shard).tolist())}) "
                f"does not match the loaded shards ({sum(len(s) for s in self.stores)} chunks, shards {list(shard_ids)}); "
                "rebuild it with `llmframe-ray graph build`"
            )
        self.positions = np.asarray([position_of[int(s)] for s in graph.chunk_shard.tolist()], dtype=np.int64)
        self.rows = graph.chunk_row.astype(np.int64)
        parts, order = [], []
        for position, store in enumerate(self.stores):
            nodes = np.flatnonzero(self.positions == position)
            if len(nodes) and int(self.rows[nodes].max()) >= len(store):
                raise IndexLoadError(f"the knowledge graph names rows past the end of shard {shard_ids[position]}")
            parts.append(store.doc_keys_of(self.rows[nodes]))
            order.append(nodes)
        keys = concat_keys(parts)
        self.doc_keys = keys[np.argsort(np.concatenate(order), kind="stable")] if len(keys) else keys

    @classmethod
    def open(cls, version_path: Path, stores: Sequence[ChunkStore], shard_ids: Sequence[int], params: GraphParams | None = None):
        """The graph stored in an index version, or None when the version has none."""
        directory = Path(version_path) / GRAPH_DIR
        if not directory.is_dir():
            return None
        return cls(KnowledgeGraph.load(directory), stores, shard_ids, params)

    def allowed(self, where: Filter | None) -> np.ndarray | None:
        if where is None or where.empty:
            return None
        out = np.ones(self.graph.n_chunks, dtype=bool)
        for position, store in enumerate(self.stores):
            mask = store.row_mask(where)
            if mask is not None:
                nodes = np.flatnonzero(self.positions == position)
                out[nodes] = mask[self.rows[nodes]]
        return out

    def search(self, queries: Sequence[str], k: int, level: ResultLevel | str, where: Filter | None = None,
               vectors: np.ndarray | None = None) -> ShardAnswer:
        """Each query's top `k` chunks, or best chunks of its top `k` documents, ordered by
        score, then document key, row and shard (retrieve/candidates.py's order rules).
        `vectors`: the queries' embeddings, where the plan has them (graph/rank.py: meant)."""
        level = ResultLevel.from_str(level)
        found = self.ranker.search(list(queries), self.graph.n_chunks, self.allowed(where), vectors)
        nodes_out, scores_out = [], []
        for nodes, scores in found:
            scores = scores.astype(np.float32)
            keys = self.doc_keys[nodes]
            order = np.lexsort((self.positions[nodes], self.rows[nodes], keys, -scores))
            nodes, scores, keys = nodes[order], scores[order], keys[order]
            keep = first_occurrences(keys)[:k] if level is ResultLevel.DOCUMENT else np.arange(min(k, len(nodes)))
            nodes_out.append(nodes[keep])
            scores_out.append(scores[keep])
        offsets = np.zeros(len(found) + 1, dtype=np.int64)
        np.cumsum([len(n) for n in nodes_out], out=offsets[1:])
        if offsets[-1] == 0:
            return ShardAnswer.empty(len(found))
        nodes = np.concatenate(nodes_out)
        return ShardAnswer(self.rows[nodes], np.concatenate(scores_out), self.doc_keys[nodes], offsets, self.positions[nodes])


def open_for_version(index_dir: str | Path, version: str, params: GraphParams | None = None) -> GraphSearch | None:
    """The graph of a version over its chunk stores as saved (document ids as keys, as shard
    groups that each hold some shards answer): for a Retriever whose shards are spread over
    several groups. None when the version has no graph."""
    from llmframe_ray.index.versions import IndexDirectory, shard_dir_name

    index = IndexDirectory(index_dir)
    path = index.versions_dir / version
    if not (path / GRAPH_DIR).is_dir():
        return None
    info = index.version_info(version)
    empty = set(info.get("empty_shards", []))
    live = [i for i in range(int(info["shards"])) if i not in empty]
    return GraphSearch.open(path, [ChunkStore.load(path / shard_dir_name(i)) for i in live], live, params)
