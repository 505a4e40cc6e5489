"""DenseShard: FAISS search over one shard of the index (one deployment per shard)."""

from __future__ import annotations

from typing import Any, Mapping

from ray import serve

from llmframe_ray.retrieve.plan import DENSE
from llmframe_ray.serve.replica import replica_settings
from llmframe_ray.serve.shard_server import ShardServer


@serve.deployment(ray_actor_options={"num_cpus": 0.05}, max_ongoing_requests=64)
class DenseShard(ShardServer):
    ranker = DENSE

    def __init__(self, index_dir: str, shard: int, overrides: Mapping[str, Any]) -> None:
        settings = replica_settings(overrides)
        import faiss

        faiss.omp_set_num_threads(settings.threads)
        super().__init__(index_dir, shard, settings)
