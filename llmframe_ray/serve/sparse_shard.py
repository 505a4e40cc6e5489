"""SparseShard: BM25 search over one shard of the index (one deployment per shard); it also
reads the shard's chunks for the hits that are returned."""

from __future__ import annotations

from ray import serve

from llmframe_ray.retrieve.params import RetrievalParams
from llmframe_ray.retrieve.plan import Ranker
from llmframe_ray.retrieve.shard_cache import ShardCache


@serve.deployment(ray_actor_options={"num_cpus": 0.05}, max_ongoing_requests=64)
class SparseShard(ShardCache):
    def __init__(self, index_dir: str, shard: int, params: RetrievalParams) -> None:
        super().__init__(index_dir, shard, Ranker.BM25, params)
