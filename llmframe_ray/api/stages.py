"""What the API's request service calls: `Stages`, implemented by Serve deployment handles
(serve/ingress.py) and by direct in-process calls (api/local.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, AsyncIterator, Mapping, Protocol, Sequence

import numpy as np

from llmframe_ray.generate.base import Completion, Message, StreamEnd, Usage
from llmframe_ray.index.metadata import Filter
from llmframe_ray.retrieve.plan import ResultLevel
from llmframe_ray.retrieve.rewrite import QueryRewrite, Rewrite, RewriteParams
from llmframe_ray.types import Hit, SearchMode


@dataclass(frozen=True)
class Retrieved:
    version: str
    hits: list[Hit]


class Stages(Protocol):
    has_reranker: bool

    async def retrieve(
        self, query: str, mode: SearchMode, level: ResultLevel, top_k: int, where: Filter | None = None,
        alpha: float | None = None,
    ) -> Retrieved: ...

    async def embed_texts(self, texts: list[str]) -> list[np.ndarray | None]: ...  # unit vectors; None: not embeddable

    async def rewrite(
        self, kind: QueryRewrite, question: str, history: Sequence[Message], params: RewriteParams
    ) -> Rewrite: ...  # generate/rewriting.py

    async def extract_sentences(
        self, question: str, passages: list[list[str]], budget_tokens: int, timeout_s: float
    ) -> tuple[list[bool], Usage] | None: ...  # generate/extracting.py; None: no LLM in the chain

    async def rerank_scores(self, query: str, passages: list[str]) -> list[float]: ...

    async def rerank_similarity(self, version: str) -> float | None: ...  # index/domain.py

    async def rerank_card(self) -> Mapping[str, Any]: ...  # the deployed reranker's model card

    async def generate(self, messages: list[Message], system: str, max_tokens: int, temperature: float) -> Completion: ...

    def generate_stream(
        self, messages: list[Message], system: str, max_tokens: int, temperature: float
    ) -> AsyncIterator[str | StreamEnd]: ...

    async def session_history(self, session_id: str) -> list[Message]: ...

    async def session_append(self, session_id: str, question: str, answer: str) -> None: ...

    async def tokens_spent(self, owner: str) -> int: ...

    async def charge_tokens(self, owner: str, tokens: int) -> None: ...

    async def readiness(self) -> dict[str, str]: ...

    async def index_info(self) -> dict[str, Any]: ...

    async def graph_query(self, method: str, args: dict[str, Any]) -> Any: ...  # graph/inspect.py; None: no graph

    async def reload(self) -> dict[str, Any]: ...

    async def stats(self) -> dict[str, Any]: ...
