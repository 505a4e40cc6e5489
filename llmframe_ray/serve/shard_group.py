"""ShardGroup: BM25 and dense search, and chunk reads, over some shards of the index (the
deployment file says which: all of them in one group on one machine, one group per shard to
scale out). Each call carries every request of one plan step for this group's shards."""

from __future__ import annotations

from typing import Sequence

from ray import serve

from llmframe_ray.retrieve.params import RetrievalParams
from llmframe_ray.retrieve.shard_cache import ShardCache
from llmframe_ray.serve.metrics_hub import start_pushing
from llmframe_ray.serve.replica import replica_threads


@serve.deployment(ray_actor_options={"num_cpus": 0.1}, max_ongoing_requests=64, max_queued_requests=256)
class ShardGroup(ShardCache):
    def __init__(self, index_dir: str, shards: Sequence[int], params: RetrievalParams, threads: int | None) -> None:
        import faiss

        faiss.omp_set_num_threads(threads if threads is not None else replica_threads())
        super().__init__(index_dir, shards, params)
        start_pushing()
