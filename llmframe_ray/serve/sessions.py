"""Sessions: conversation history per session id (one replica: the history lives in its
memory; a restart forgets it)."""

from __future__ import annotations

from ray import serve

from llmframe_ray.generate.base import Message
from llmframe_ray.generate.sessions import SessionParams, SessionStore


@serve.deployment(num_replicas=1, ray_actor_options={"num_cpus": 0.02}, max_ongoing_requests=512, max_queued_requests=1024)
class Sessions:
    def __init__(self, params: SessionParams) -> None:
        self.store = SessionStore(params.token_budget, params.max_sessions)

    def history(self, session_id: str) -> list[Message]:
        return self.store.history(session_id)

    def append(self, session_id: str, question: str, answer: str) -> None:
        self.store.append(session_id, question, answer)

    def ready(self) -> str:
        return "ready"
