"""DenseShard: FAISS search over one shard of the index (one deployment per shard)."""

from __future__ import annotations

from ray import serve

from llmframe_ray.retrieve.params import RetrievalParams
from llmframe_ray.retrieve.plan import Ranker
from llmframe_ray.retrieve.shard_cache import ShardCache
from llmframe_ray.serve.replica import replica_threads


@serve.deployment(ray_actor_options={"num_cpus": 0.05}, max_ongoing_requests=64)
class DenseShard(ShardCache):
    def __init__(self, index_dir: str, shard: int, params: RetrievalParams, threads: int | None) -> None:
        import faiss

        faiss.omp_set_num_threads(threads if threads is not None else replica_threads())
        super().__init__(index_dir, shard, Ranker.DENSE, params)
