"""One typed configuration, read from environment variables, validated at start, and resolved
once into the small frozen parameter objects that each stage takes (`Settings.params()`).

Core modules never import this one: they define their own parameter classes, and only the
entry points (the CLI, the Serve app builder, the job entry point) read settings. Every setting
is read from `LLMFRAME_<NAME>`. The seed project's switches
(`HYBRID_SEARCH_ENABLED`, `RERANKER_ENABLED`, `EMBEDDING_PROVIDER`, `CHUNK_SIZE`,
`CHUNK_OVERLAP`, and the providers' usual key variables) are accepted without the prefix too;
the prefixed name wins when both are set.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import AliasChoices, Field, ValidationError, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from llmframe_ray.config_pipeline import PipelineSettings
from llmframe_ray.config_writes import ENV_PREFIX, _default_home, _env, _key_list
from llmframe_ray.api.params import ApiLimits, GenerationParams, KeyLimits, ServiceParams
from llmframe_ray.errors import ConfigError
from llmframe_ray.generate.chain import ProviderParams
from llmframe_ray.generate.costs import DEFAULT_PRICES
from llmframe_ray.generate.sessions import SessionParams
from llmframe_ray.index.dense import AUTO_FLAT_MAX_ROWS, DenseIndexKind, DenseParams
from llmframe_ray.index.params import ChunkingParams, IndexParams
from llmframe_ray.index.sparse import SparseParams
from llmframe_ray.ingest.params import IngestParams
from llmframe_ray.ingest.readers import DEFAULT_MAX_FILE_BYTES
from llmframe_ray.models.cross_encoder import Precision
from llmframe_ray.models.embedder import DEFAULT_BATCH_SIZE, EmbedderParams, EmbeddingProvider, OpenAIEmbeddingParams
from llmframe_ray.models.runtime import available_threads
from llmframe_ray.models.sources import RerankerModelParams
from llmframe_ray.retrieve.params import RetrievalParams
from llmframe_ray.graph.params import GraphParams
from llmframe_ray.retrieve.plan import BM25, DENSE, GRAPH, FusionParams
from llmframe_ray.retrieve.rerank import RerankFusion, RerankParams
from llmframe_ray.types import SearchMode

class Settings(PipelineSettings):
    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        populate_by_name=True,
        extra="ignore",
        frozen=True,
        validate_default=True,
    )

    home: Path = Field(default_factory=_default_home, validation_alias=_env("HOME"))

    # Embedding
    embedding_provider: EmbeddingProvider = Field(
        EmbeddingProvider.LOCAL, validation_alias=_env("EMBEDDING_PROVIDER", "EMBEDDING_PROVIDER")
    )
    embedding_max_length: int = Field(
        256, ge=8, le=512, validation_alias=_env("EMBEDDING_MAX_LENGTH")
    )
    embedding_batch_size: int = Field(DEFAULT_BATCH_SIZE, ge=1, le=4096, validation_alias=_env("EMBEDDING_BATCH_SIZE"))
    num_threads: int | None = Field(None, ge=1, le=1024, validation_alias=_env("NUM_THREADS"))
    ort_spinning: bool = Field(True, validation_alias=_env("ORT_SPINNING"))
    solo_threads: int | None = Field(None, ge=1, le=1024, validation_alias=_env("SOLO_THREADS"))
    openai_api_key: str | None = Field(
        None, repr=False, validation_alias=_env("OPENAI_API_KEY", "OPENAI_API_KEY")
    )
    openai_base_url: str | None = Field(None, validation_alias=_env("OPENAI_BASE_URL", "OPENAI_BASE_URL"))
    openai_embedding_model: str = Field(
        "text-embedding-3-small", validation_alias=_env("OPENAI_EMBEDDING_MODEL")
    )
    openai_embedding_dimensions: int | None = Field(
        None, ge=1, le=8192, validation_alias=_env("OPENAI_EMBEDDING_DIMENSIONS")
    )
    openai_timeout_s: float = Field(30.0, gt=0, validation_alias=_env("OPENAI_TIMEOUT_S"))

    # Chunking (sizes in the embedder's tokens, special tokens and title included)
    chunk_size: int = Field(256, ge=16, le=8192, validation_alias=_env("CHUNK_SIZE", "CHUNK_SIZE"))
    chunk_overlap: int = Field(32, ge=0, validation_alias=_env("CHUNK_OVERLAP", "CHUNK_OVERLAP"))

    # Dense index
    dense_index: DenseIndexKind = Field(DenseIndexKind.AUTO, validation_alias=_env("DENSE_INDEX"))
    dense_flat_max_rows: int = Field(AUTO_FLAT_MAX_ROWS, ge=1, validation_alias=_env("DENSE_FLAT_MAX_ROWS"))  # auto: flat up to it
    hnsw_m: int = Field(32, ge=4, le=256, validation_alias=_env("HNSW_M"))
    hnsw_ef_construction: int = Field(200, ge=8, validation_alias=_env("HNSW_EF_CONSTRUCTION"))
    hnsw_ef_search: int = Field(128, ge=8, validation_alias=_env("HNSW_EF_SEARCH"))
    ivf_nlist: int | None = Field(None, ge=1, validation_alias=_env("IVF_NLIST"))
    ivf_nprobe: int = Field(16, ge=1, validation_alias=_env("IVF_NPROBE"))

    # Sparse index
    bm25_k1: float = Field(1.5, gt=0, validation_alias=_env("BM25_K1"))
    bm25_b: float = Field(0.75, ge=0, le=1, validation_alias=_env("BM25_B"))
    bm25_stemmer: str | None = Field("english", validation_alias=_env("BM25_STEMMER"))
    bm25_stopwords: str | None = Field("en", validation_alias=_env("BM25_STOPWORDS"))

    # Retrieval
    hybrid_search_enabled: bool = Field(
        True, validation_alias=_env("HYBRID_SEARCH_ENABLED", "HYBRID_SEARCH_ENABLED")
    )
    # Hybrid defaults chosen on SciFact *train* judgments (benchmarks/fusion_sweep.py; RRF's own default k: 60)
    rrf_k: int = Field(20, ge=0, validation_alias=_env("RRF_K"))
    bm25_weight: float = Field(1.0, ge=0, validation_alias=_env("BM25_WEIGHT"))
    dense_weight: float = Field(1.0, ge=0, validation_alias=_env("DENSE_WEIGHT"))
    fusion_depth: int = Field(200, ge=1, le=10000, validation_alias=_env("FUSION_DEPTH"))
    # hybrid-graph's third list: the least weight within one standard error of the best on both
    # tuning sets, SciFact train and HotpotQA 1-100 (benchmarks/graph_sweep.py; README "GraphRAG")
    graph_weight: float = Field(0.5, ge=0, validation_alias=_env("GRAPH_WEIGHT"))
    graph_depth: int = Field(2, ge=1, le=4, validation_alias=_env("GRAPH_DEPTH"))  # hops of the graph ranker's walk
    graph_max_seed_chunks: int = Field(20, ge=1, validation_alias=_env("GRAPH_MAX_SEED_CHUNKS"))
    graph_name_match: float | None = Field(None, ge=-1, le=1, validation_alias=_env("GRAPH_NAME_MATCH"))  # cosine; unset: off

    # Reranking: a cross-encoder rescores the top `reranker_depth` hits (kept per reranker:
    # (query, passage) scores, so a repeated query is not rescored, and a two-tower reranker's
    # passage vectors: models/two_tower.py; towers false: the pair model; size 0: none)
    reranker_enabled: bool = Field(False, validation_alias=_env("RERANKER_ENABLED", "RERANKER_ENABLED"))
    reranker_model: str = Field("cross-encoder/ms-marco-MiniLM-L-6-v2", validation_alias=_env("RERANKER_MODEL"))
    reranker_revision: str | None = Field(None, validation_alias=_env("RERANKER_REVISION"))
    reranker_onnx_file: str | None = Field(None, validation_alias=_env("RERANKER_ONNX_FILE"))
    reranker_precision: Precision = Field(Precision.AUTO, validation_alias=_env("RERANKER_PRECISION"))
    reranker_depth: int = Field(RerankParams.depth, ge=1, le=1000, validation_alias=_env("RERANKER_DEPTH"))
    reranker_batch_size: int = Field(32, ge=1, le=1024, validation_alias=_env("RERANKER_BATCH_SIZE"))
    reranker_max_length: int | None = Field(None, ge=8, le=512, validation_alias=_env("RERANKER_MAX_LENGTH"))
    reranker_cache_size: int = Field(20000, ge=0, le=10_000_000, validation_alias=_env("RERANKER_CACHE_SIZE"))
    reranker_towers: bool = Field(True, validation_alias=_env("RERANKER_TOWERS"))
    reranker_vector_cache: int = Field(50_000, ge=0, le=10_000_000, validation_alias=_env("RERANKER_VECTOR_CACHE"))
    reranker_window: bool = Field(False, validation_alias=_env("RERANKER_WINDOW"))  # long passages: best sentences
    # Reranker down or too slow: first-stage order with a warning (true) or a 503 (false)
    reranker_fail_open: bool = Field(True, validation_alias=_env("RERANKER_FAIL_OPEN"))
    # score (the scores on [0, 1] added), rrf (k: RERANKER_RRF_K) or none (retrieve/rerank.py)
    reranker_fusion: RerankFusion = Field(RerankFusion.SCORE, validation_alias=_env("RERANKER_FUSION"))
    reranker_rrf_k: int = Field(20, ge=0, validation_alias=_env("RERANKER_RRF_K"))
    reranker_weight: float | None = Field(None, ge=0, le=100, validation_alias=_env("RERANKER_WEIGHT"))  # unset: by domain

    # Ingestion job (Ray Data)
    ingest_batch_size: int = Field(256, ge=1, le=65536, validation_alias=_env("INGEST_BATCH_SIZE"))
    # one-thread actors, one per CPU, embedded more per core than one actor of many threads (README)
    ingest_cpus_per_actor: int = Field(1, ge=1, le=256, validation_alias=_env("INGEST_CPUS_PER_ACTOR"))
    ingest_embed_actors: int | None = Field(None, ge=1, le=1024, validation_alias=_env("INGEST_EMBED_ACTORS"))
    # a document file over this many bytes is refused unread (JSON Lines corpora: no limit)
    max_file_bytes: int = Field(DEFAULT_MAX_FILE_BYTES, ge=1, validation_alias=_env("MAX_FILE_BYTES"))
    index_retention: int = Field(3, ge=1, le=1000, validation_alias=_env("INDEX_RETENTION"))

    # Serving (Ray Serve app, HTTP API)
    api_secret_key: str | None = Field(None, repr=False, validation_alias=_env("API_SECRET_KEY", "API_SECRET_KEY"))
    api_keys: str | None = Field(None, repr=False, validation_alias=_env("API_KEYS"))
    # keys that may also reload the index and read /v1/stats (default: API_SECRET_KEY)
    admin_keys: str | None = Field(None, repr=False, validation_alias=_env("ADMIN_KEYS"))
    # per API key: requests/s (0: off) with bursts of up to RATE_LIMIT_BURST (default: one
    # second's worth), and requests in flight (0: off); each Ingress replica holds its share
    rate_limit_per_s: float = Field(0.0, ge=0, le=1_000_000, validation_alias=_env("RATE_LIMIT_PER_S"))
    rate_limit_burst: int | None = Field(None, ge=1, le=1_000_000, validation_alias=_env("RATE_LIMIT_BURST"))
    body_read_timeout_s: float = Field(10.0, gt=0, le=3600, validation_alias=_env("BODY_READ_TIMEOUT_S"))
    # a request is answered 504 when its response has not started by then (0: no deadline)
    request_timeout_s: float = Field(60.0, ge=0, le=3600, validation_alias=_env("REQUEST_TIMEOUT_S"))
    stage_timeout_s: float = Field(30.0, gt=0, le=3600, validation_alias=_env("STAGE_TIMEOUT_S"))
    max_pending_searches: int = Field(128, ge=0, le=1_000_000, validation_alias=_env("MAX_PENDING_SEARCHES"))
    # generation tokens (input + output) per API key per UTC day (0: no budget); over it: 429
    daily_tokens_per_key: int = Field(0, ge=0, le=10**12, validation_alias=_env("DAILY_TOKENS_PER_KEY"))
    # Ingress replicas that split the per-key limits (default: the app's Ingress options)
    key_limit_replicas: int | None = Field(None, ge=1, le=10_000, validation_alias=_env("KEY_LIMIT_REPLICAS"))
    max_concurrent_per_key: int = Field(0, ge=0, le=1_000_000, validation_alias=_env("MAX_CONCURRENT_PER_KEY"))
    auth_disabled: bool = Field(False, validation_alias=_env("AUTH_DISABLED"))
    max_request_bytes: int = Field(65536, ge=1024, le=64 * 1024 * 1024, validation_alias=_env("MAX_REQUEST_BYTES"))
    max_query_chars: int = Field(2000, ge=16, le=100_000, validation_alias=_env("MAX_QUERY_CHARS"))
    max_top_k: int = Field(100, ge=1, le=1000, validation_alias=_env("MAX_TOP_K"))
    # serving checks every index file's SHA-256 when it loads a version (sizes are always checked)
    index_verify_on_load: bool = Field(True, validation_alias=_env("INDEX_VERIFY_ON_LOAD"))
    index_watch_interval_s: float = Field(2.0, ge=0, validation_alias=_env("INDEX_WATCH_INTERVAL_S"))
    # a serving process refuses to load an index whose estimate is over its memory (index/memory.py); 0: no check
    memory_limit_mb: int | None = Field(None, ge=0, validation_alias=_env("MEMORY_LIMIT_MB"))
    # under Serve, each replica sends its metrics to the Sessions replica (the app's sum) this often (serve/metrics_hub.py)
    metrics_push_interval_s: float = Field(5.0, ge=0.05, le=3600, validation_alias=_env("METRICS_PUSH_INTERVAL_S"))

    # Generation: an ordered chain of providers, each tried (with retries) before the next
    llm_providers: str = Field("auto", validation_alias=_env("LLM_PROVIDERS", "LLM_PROVIDERS"))
    anthropic_api_key: str | None = Field(None, repr=False, validation_alias=_env("ANTHROPIC_API_KEY", "ANTHROPIC_API_KEY"))
    anthropic_base_url: str | None = Field(None, validation_alias=_env("ANTHROPIC_BASE_URL", "ANTHROPIC_BASE_URL"))
    anthropic_model: str = Field("claude-sonnet-4-5", validation_alias=_env("ANTHROPIC_MODEL", "ANTHROPIC_MODEL"))
    openai_chat_model: str = Field("gpt-4o-mini", validation_alias=_env("OPENAI_CHAT_MODEL", "OPENAI_MODEL"))
    llm_timeout_s: float = Field(30.0, gt=0, le=600, validation_alias=_env("LLM_TIMEOUT_S"))
    llm_max_attempts: int = Field(3, ge=1, le=10, validation_alias=_env("LLM_MAX_ATTEMPTS"))
    llm_backoff_s: float = Field(0.5, ge=0, le=60, validation_alias=_env("LLM_BACKOFF_S"))
    llm_backoff_max_s: float = Field(8.0, ge=0, le=600, validation_alias=_env("LLM_BACKOFF_MAX_S"))
    llm_circuit_failures: int = Field(3, ge=1, le=100, validation_alias=_env("LLM_CIRCUIT_FAILURES"))
    llm_circuit_cooldown_s: float = Field(30.0, ge=0, le=3600, validation_alias=_env("LLM_CIRCUIT_COOLDOWN_S"))
    # a whole generation call, retries and fall-through included (0: no deadline); below
    # REQUEST_TIMEOUT_S, so that the extractive answerer still answers within the request's time
    llm_deadline_s: float = Field(45.0, ge=0, le=3600, validation_alias=_env("LLM_DEADLINE_S"))
    llm_max_tokens: int = Field(1024, ge=1, le=65536, validation_alias=_env("LLM_MAX_TOKENS"))
    llm_temperature: float = Field(0.0, ge=0, le=2, validation_alias=_env("LLM_TEMPERATURE"))
    # USD per million tokens, input and output, by model: JSON {"model": [in, out], ...}
    llm_prices: str = Field(DEFAULT_PRICES, validation_alias=_env("LLM_PRICES"))
    session_token_budget: int = Field(2000, ge=0, le=1_000_000, validation_alias=_env("SESSION_TOKEN_BUDGET"))
    session_max: int = Field(10000, ge=1, le=10_000_000, validation_alias=_env("SESSION_MAX"))

    @property
    def api_key_list(self) -> tuple[str, ...]:
        """API_SECRET_KEY and the comma-separated LLMFRAME_API_KEYS, blanks dropped."""
        return _key_list([self.api_secret_key or ""] + (self.api_keys or "").split(","))

    @property
    def admin_key_list(self) -> tuple[str, ...]:
        """The comma-separated LLMFRAME_ADMIN_KEYS; when unset, API_SECRET_KEY."""
        if self.admin_keys is not None:
            return _key_list(self.admin_keys.split(","))
        return _key_list([self.api_secret_key or ""])

    @field_validator("bm25_stemmer", "bm25_stopwords", mode="before")
    @classmethod
    def _none_word(cls, value: Any) -> Any:
        """`none` or an empty value switches stemming / stop-word removal off."""
        if isinstance(value, str) and value.strip().lower() in ("", "none", "off"):
            return None
        return value

    @model_validator(mode="after")
    def _check_relations(self) -> Settings:
        # The chunker's rule: two overlaps must fit in a chunk beside the special tokens.
        special = 2 if self.embedding_provider is EmbeddingProvider.LOCAL else 0
        if 2 * self.chunk_overlap >= self.chunk_size - special:
            raise ValueError(
                f"CHUNK_OVERLAP ({self.chunk_overlap}) must be less than half of CHUNK_SIZE "
                f"({self.chunk_size}) minus {special} special tokens"
            )
        self.sparse_params()  # unknown stemmer or stop-word list: fail now
        if self.embedding_provider is EmbeddingProvider.LOCAL and self.chunk_size > self.embedding_max_length:
            raise ValueError(
                f"CHUNK_SIZE ({self.chunk_size}) exceeds the local embedder's limit "
                f"LLMFRAME_EMBEDDING_MAX_LENGTH ({self.embedding_max_length})"
            )
        if self.embedding_provider is EmbeddingProvider.OPENAI and not self.openai_api_key:
            raise ValueError("EMBEDDING_PROVIDER=openai needs OPENAI_API_KEY to be set")
        return self

    @property
    def threads(self) -> int:
        """ONNX Runtime / BLAS threads for this process: the setting, else every core."""
        return available_threads(self.num_threads)

    @property
    def models_dir(self) -> Path:
        return self.home / "models"

    @property
    def indexes_dir(self) -> Path:
        return self.home / "indexes"

    # Resolution into the parameter objects each stage takes (see Params).
    def sparse_params(self) -> SparseParams:
        return SparseParams(k1=self.bm25_k1, b=self.bm25_b, stemmer=self.bm25_stemmer, stopwords=self.bm25_stopwords)

    def params(self) -> Params:
        """Every stage's parameters, resolved once from these settings."""
        openai = None
        if self.embedding_provider is EmbeddingProvider.OPENAI:
            openai = OpenAIEmbeddingParams(
                model=self.openai_embedding_model, api_key=self.openai_api_key,
                dimensions=self.openai_embedding_dimensions, base_url=self.openai_base_url,
                timeout_s=self.openai_timeout_s,
            )
        rerank = RerankParams(
            enabled=self.reranker_enabled, depth=self.reranker_depth, fusion=self.reranker_fusion,
            rrf_k=self.reranker_rrf_k, weight=self.reranker_weight,
        )
        default_mode = SearchMode.HYBRID if self.hybrid_search_enabled else SearchMode.DENSE
        return Params(
            embedder=EmbedderParams(
                provider=self.embedding_provider, models_dir=self.models_dir,
                max_length=self.embedding_max_length, batch_size=self.embedding_batch_size,
                threads=self.num_threads, spinning=self.ort_spinning, solo_threads=self.solo_threads,
                openai=openai,
            ),
            index=IndexParams(
                chunking=ChunkingParams(chunk_size=self.chunk_size, chunk_overlap=self.chunk_overlap),
                dense=DenseParams(
                    kind=self.dense_index, hnsw_m=self.hnsw_m, hnsw_ef_construction=self.hnsw_ef_construction,
                    hnsw_ef_search=self.hnsw_ef_search, ivf_nlist=self.ivf_nlist, ivf_nprobe=self.ivf_nprobe,
                    flat_max_rows=self.dense_flat_max_rows,
                ),
                sparse=self.sparse_params(),
            ),
            retrieval=RetrievalParams(
                default_mode=default_mode,
                fusion=FusionParams(
                    rrf_k=self.rrf_k, weights={BM25: self.bm25_weight, DENSE: self.dense_weight, GRAPH: self.graph_weight},
                    fusion_depth=self.fusion_depth,
                ),
                hnsw_ef_search=self.hnsw_ef_search, ivf_nprobe=self.ivf_nprobe,
                verify_on_load=self.index_verify_on_load, max_pending=self.max_pending_searches,
                memory_limit_mb=self.memory_limit_mb,
                graph=GraphParams(depth=self.graph_depth, max_seed_chunks=self.graph_max_seed_chunks, name_match=self.graph_name_match),
            ),
            rerank=rerank,
            reranker_model=RerankerModelParams(
                model=self.reranker_model, models_dir=self.models_dir, revision=self.reranker_revision,
                onnx_file=self.reranker_onnx_file, precision=self.reranker_precision,
                batch_size=self.reranker_batch_size, max_length=self.reranker_max_length,
                threads=self.num_threads, spinning=self.ort_spinning, cache_size=self.reranker_cache_size,
                window=self.reranker_window, towers=self.reranker_towers, vector_cache=self.reranker_vector_cache,
            ),
            service=ServiceParams(
                default_mode=default_mode,
                limits=ApiLimits(
                    max_request_bytes=self.max_request_bytes, max_query_chars=self.max_query_chars,
                    max_top_k=self.max_top_k, body_read_timeout_s=self.body_read_timeout_s,
                    request_timeout_s=self.request_timeout_s, stage_timeout_s=self.stage_timeout_s,
                    per_key=KeyLimits(
                        rate_per_s=self.rate_limit_per_s,
                        burst=self.rate_limit_burst or (max(1, math.ceil(self.rate_limit_per_s)) if self.rate_limit_per_s else 0),
                        max_concurrent=self.max_concurrent_per_key,
                    ),
                ),
                rerank=rerank,
                generation=GenerationParams(
                    max_tokens=self.llm_max_tokens, temperature=self.llm_temperature, prices=self.llm_prices,
                ),
                session_token_budget=self.session_token_budget,
                rerank_fail_open=self.reranker_fail_open,
                daily_tokens_per_key=self.daily_tokens_per_key,
                rewrite=self.rewrite_params(), compression=self.compression_params(self.embedding_provider is EmbeddingProvider.LOCAL),
            ),
            providers=ProviderParams(
                providers=self.llm_providers, anthropic_api_key=self.anthropic_api_key,
                anthropic_base_url=self.anthropic_base_url, anthropic_model=self.anthropic_model,
                openai_api_key=self.openai_api_key, openai_base_url=self.openai_base_url,
                openai_model=self.openai_chat_model, timeout_s=self.llm_timeout_s,
                max_attempts=self.llm_max_attempts, backoff_s=self.llm_backoff_s,
                backoff_max_s=self.llm_backoff_max_s, circuit_failures=self.llm_circuit_failures,
                circuit_cooldown_s=self.llm_circuit_cooldown_s, deadline_s=self.llm_deadline_s or None,
            ),
            sessions=SessionParams(token_budget=self.session_token_budget, max_sessions=self.session_max),
            ingest=IngestParams(
                batch_size=self.ingest_batch_size, cpus_per_actor=self.ingest_cpus_per_actor,
                embed_actors=self.ingest_embed_actors, retention=self.index_retention,
                local_cpus=self.threads, max_file_bytes=self.max_file_bytes,
            ),
            index_watch_interval_s=self.index_watch_interval_s,
            indexes_dir=self.indexes_dir,
        )


@dataclass(frozen=True)
class Params:
    """Every stage's parameters. Hand a stage (a Ray task, actor or replica) only its own: no
    secret travels to a stage that does not use it."""

    embedder: EmbedderParams
    index: IndexParams
    retrieval: RetrievalParams
    rerank: RerankParams
    reranker_model: RerankerModelParams
    service: ServiceParams
    providers: ProviderParams
    sessions: SessionParams
    ingest: IngestParams
    index_watch_interval_s: float
    indexes_dir: Path


def _env_names(field: str) -> list[str]:
    info = Settings.model_fields[field]
    alias = info.validation_alias
    return list(alias.choices) if isinstance(alias, AliasChoices) else [f"{ENV_PREFIX}{field.upper()}"]


def _setting_name(loc: tuple[Any, ...]) -> str:
    """The environment variable the user set for the field at `loc` (else the prefixed name)."""
    if not loc:
        return "settings"
    key = str(loc[0])
    for field in Settings.model_fields:
        names = _env_names(field)
        if key == field or key in names:
            return next((n for n in names if n in os.environ), names[0])
    return key


def load_settings(**overrides: Any) -> Settings:
    """Read and validate the settings; raise ConfigError naming every bad setting."""
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            name = _setting_name(tuple(err.get("loc", ())))
            message = err.get("msg", "invalid value").removeprefix("Value error, ")
            loc = tuple(err.get("loc", ()))
            secret = bool(loc) and any(
                info.repr is False and (str(loc[0]) == key or str(loc[0]) in _env_names(key))
                for key, info in Settings.model_fields.items()
            )
            if name == "settings":
                problems.append(message)
            elif secret:  # never echo a key
                problems.append(f"{name}: {message}")
            else:
                problems.append(f"{name}: {message} (got {err.get('input')!r})")
        raise ConfigError("invalid configuration: " + "; ".join(problems)) from None
