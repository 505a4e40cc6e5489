"""Sessions: conversation history per session id, and generation tokens spent per API key today
(one replica, so every Ingress replica sees the same counts; both live in its memory and a
restart forgets them)."""

from __future__ import annotations

from ray import serve

from llmframe_ray.generate.base import Message
from llmframe_ray.generate.sessions import SessionParams, SessionStore, TokenLedger


@serve.deployment(num_replicas=1, ray_actor_options={"num_cpus": 0.02}, max_ongoing_requests=512, max_queued_requests=1024)
class Sessions:
    def __init__(self, params: SessionParams) -> None:
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
