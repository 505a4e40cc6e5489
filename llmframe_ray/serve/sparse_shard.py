"""SparseShard: BM25 search over one shard of the index (one deployment per shard); it also
reads the shard's chunks for the hits that are returned."""

from __future__ import annotations

from typing import Any, Mapping

from ray import serve

from llmframe_ray.retrieve.plan import BM25
from llmframe_ray.serve.replica import replica_settings
from llmframe_ray.serve.shard_server import ShardServer


@serve.deployment(ray_actor_options={"num_cpus": 0.05}, max_ongoing_requests=64)
class SparseShard(ShardServer):
    ranker = BM25

    def __init__(self, index_dir: str, shard: int, overrides: Mapping[str, Any]) -> None:
        super().__init__(index_dir, shard, replica_settings(overrides))
