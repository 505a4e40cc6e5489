"""The online half: Ray Serve deployments (thin), the app builder, and the HTTP API.

Modules that import Ray: encoder, shards, retriever, reranker, generator, ingress, app.
The HTTP layer (http, schemas, auth, service, local) is plain Python and testable without Ray.
"""
