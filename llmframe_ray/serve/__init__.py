"""Ray Serve only: thin deployments (encoder, dense_shard, sparse_shard, retriever, reranker,
generator, sessions, ingress), the app builder (app), replica helpers (replica) and the
`llmframe-ray serve` runner (run). Request logic lives in `llmframe_ray.api`, ranking in
`llmframe_ray.retrieve`."""
