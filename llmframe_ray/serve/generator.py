"""Generator: writes the answer from the top passages (the offline extractive answerer for now;
provider-backed generation plugs in here)."""

from __future__ import annotations

from typing import Any, AsyncIterator, Mapping

from ray import serve

from llmframe_ray.generate.extractive import ExtractiveAnswerer
from llmframe_ray.types import Answer, Hit


@serve.deployment(ray_actor_options={"num_cpus": 0.05}, max_ongoing_requests=128)
class Generator:
    def __init__(self, overrides: Mapping[str, Any]) -> None:
        self.answerer = ExtractiveAnswerer()

    def answer(self, question: str, hits: list[Hit]) -> Answer:
        return self.answerer.answer(question, hits)

    async def events(self, question: str, hits: list[Hit]) -> AsyncIterator[str | Answer]:
        """Text deltas, then the complete Answer (call with `.options(stream=True)`)."""
        for item in self.answerer.events(question, hits):
            yield item

    def ready(self) -> str:
        return "ready"
