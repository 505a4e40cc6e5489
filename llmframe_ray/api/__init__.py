"""The HTTP API without Ray: FastAPI app (http), request and response schemas, API-key auth, the
request service over abstract stages (service), OpenAI-compatible chat (openai_compat) and the
stages answered in this process (local). Serve's Ingress runs the same app over deployment handles."""
