"""What first-stage retrieval is told: the default mode, hybrid fusion, the dense index's
search-time settings (applied to every shard when it is loaded) and the graph ranker's."""

from __future__ import annotations

from dataclasses import dataclass, field

from llmframe_ray.graph.params import GraphParams
from llmframe_ray.index.shard import IndexShard
from llmframe_ray.retrieve.plan import FusionParams
from llmframe_ray.types import SearchMode


@dataclass(frozen=True)
class RetrievalParams:
    default_mode: SearchMode = SearchMode.HYBRID
    fusion: FusionParams = field(default_factory=FusionParams)
    hnsw_ef_search: int = 128
    ivf_nprobe: int = 16
    verify_on_load: bool = True  # serving checks every file's SHA-256 before it serves a version
    # the memory a serving process may use, MiB (index/memory.py); None: what the machine and the
    # container leave; 0: no check
    memory_limit_mb: int | None = None
    # searches waiting or running in one Retriever (a replica) before it answers 503 (0: no limit)
    max_pending: int = 128
    graph: GraphParams = field(default_factory=GraphParams)  # the graph ranker (graph/rank.py)

    def __post_init__(self) -> None:
        object.__setattr__(self, "default_mode", SearchMode.from_str(self.default_mode))

    def prepare(self, shard: IndexShard) -> IndexShard:
        """Apply the search-time settings to a loaded shard (they are not part of its build)."""
        shard.dense.set_search_params(hnsw_ef_search=self.hnsw_ef_search, ivf_nprobe=self.ivf_nprobe)
        return shard
