"""Sessions: the app's shared state, in one replica so that every Ingress replica sees the same:
conversation history per session id, generation tokens spent per API key today, and the sum of
every replica's metrics that GET /metrics shows (serve/metrics_hub.py). All live in its memory;
a restart forgets the first two, and the metrics come back with the replicas' next pushes."""

from __future__ import annotations

from ray import serve

from llmframe_ray.generate.base import Message
from llmframe_ray.generate.sessions import SessionParams, SessionStore, TokenLedger
from llmframe_ray.serve.metrics_hub import MetricsHub


@serve.deployment(num_replicas=1, ray_actor_options={"num_cpus": 0.02}, max_ongoing_requests=512, max_queued_requests=1024)
class Sessions(MetricsHub):
    def __init__(self, params: SessionParams, metrics_push_interval_s: float = 5.0) -> None:
        MetricsHub.__init__(self, metrics_push_interval_s)
        self.store = SessionStore(params.token_budget, params.max_sessions)
        self.ledger = TokenLedger()

    def history(self, session_id: str) -> list[Message]:
        return self.store.history(session_id)

    def append(self, session_id: str, question: str, answer: str) -> None:
        self.store.append(session_id, question, answer)

    def tokens_spent(self, owner: str) -> int:
        return self.ledger.spent(owner)

    def charge_tokens(self, owner: str, tokens: int) -> int:
        return self.ledger.charge(owner, tokens)

    def ready(self) -> str:
        return "ready"
