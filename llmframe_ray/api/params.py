"""What the HTTP API and its request service are told: request limits, the default search mode,
reranking, and the generation defaults."""

from __future__ import annotations

from dataclasses import dataclass, field

from llmframe_ray.generate.costs import DEFAULT_PRICES
from llmframe_ray.retrieve.rerank import RerankParams
from llmframe_ray.types import SearchMode


@dataclass(frozen=True)
class ApiLimits:
    max_request_bytes: int = 65536
    max_query_chars: int = 2000
    max_top_k: int = 100


@dataclass(frozen=True)
class GenerationParams:
    """Answer length and temperature unless a request says otherwise; prices (JSON, USD per
    million tokens in and out by model) for the cost of each answer."""

    max_tokens: int = 1024
    temperature: float = 0.0
    prices: str = DEFAULT_PRICES


@dataclass(frozen=True)
class ServiceParams:
    default_mode: SearchMode = SearchMode.HYBRID
    limits: ApiLimits = field(default_factory=ApiLimits)
    rerank: RerankParams = field(default_factory=RerankParams)
    generation: GenerationParams = field(default_factory=GenerationParams)
    session_token_budget: int = 2000
