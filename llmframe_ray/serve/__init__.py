"""The online half: Ray Serve deployments (thin), the app builder, and the HTTP API.

Modules that import Ray: encoder, dense_shard, sparse_shard, retriever, reranker, generator,
sessions, ingress, app, run, replica. The HTTP layer (http, schemas, auth, service, openai_compat,
local, shard_server) is plain Python and testable without Ray.
"""
