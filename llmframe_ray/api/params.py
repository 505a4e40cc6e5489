"""What the HTTP API and its request service are told: request limits, the default search mode,
reranking, and the generation defaults."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from llmframe_ray.generate.costs import DEFAULT_PRICES
from llmframe_ray.retrieve.compress import CompressionParams
from llmframe_ray.retrieve.rerank import RerankParams
from llmframe_ray.retrieve.rewrite import RewriteParams
from llmframe_ray.types import SearchMode


@dataclass(frozen=True)
class KeyLimits:
    """`rate_per_s` requests per second per key with bursts of up to `burst` (0: no rate
    limit), and at most `max_concurrent` requests in flight per key (0: no limit)."""

    rate_per_s: float = 0.0
    burst: int = 0
    max_concurrent: int = 0

    @property
    def enabled(self) -> bool:
        return self.rate_per_s > 0 or self.max_concurrent > 0

    def share(self, replicas: int) -> KeyLimits:
        """This replica's part when `replicas` replicas split the limits."""
        if replicas <= 1:
            return self
        return KeyLimits(
            rate_per_s=self.rate_per_s / replicas,
            burst=math.ceil(self.burst / replicas) if self.burst else 0,
            max_concurrent=math.ceil(self.max_concurrent / replicas) if self.max_concurrent else 0,
        )


@dataclass(frozen=True)
class ApiLimits:
    max_request_bytes: int = 65536
    max_query_chars: int = 2000
    max_top_k: int = 100
    per_key: KeyLimits = field(default_factory=KeyLimits)
    replicas: int = 1  # Ingress replicas that split per_key (each enforces its share)
    body_read_timeout_s: float = 10.0
    request_timeout_s: float = 60.0  # until the response starts (0: none)
    stage_timeout_s: float = 30.0  # one call to a retrieval, reranking or session stage


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
    daily_tokens_per_key: int = 0  # generation tokens (in + out) per API key per UTC day; 0: no budget
    rerank_fail_open: bool = True  # a Reranker that is down: answer unreranked, with a warning
    rewrite: RewriteParams = field(default_factory=RewriteParams)  # query rewriting (retrieve/rewrite.py)
    compression: CompressionParams = field(default_factory=CompressionParams)  # retrieve/compress.py
