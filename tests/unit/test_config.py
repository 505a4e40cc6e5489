import os

import pytest

from llmframe_ray.config import load_settings
from llmframe_ray.index.dense import DenseIndexKind
from llmframe_ray.models.embedder import EmbeddingProvider
from llmframe_ray.errors import ConfigError
from llmframe_ray.types import SearchMode

SEED_VARS = ("HYBRID_SEARCH_ENABLED", "RERANKER_ENABLED", "EMBEDDING_PROVIDER", "CHUNK_SIZE", "CHUNK_OVERLAP")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for name in list(os.environ):
        if name.startswith("LLMFRAME_") or name in SEED_VARS + ("OPENAI_API_KEY",):
            monkeypatch.delenv(name)


def test_defaults():
    s = load_settings()
    assert (s.chunk_size, s.chunk_overlap, s.rrf_k, s.fusion_depth) == (256, 32, 20, 200)
    assert s.hybrid_search_enabled is True and s.reranker_enabled is False
    assert s.embedding_provider is EmbeddingProvider.LOCAL
    assert s.dense_index is DenseIndexKind.AUTO and s.dense_flat_max_rows == 20_000


def test_seed_switches_without_prefix(monkeypatch):
    monkeypatch.setenv("HYBRID_SEARCH_ENABLED", "false")
    monkeypatch.setenv("RERANKER_ENABLED", "true")
    monkeypatch.setenv("CHUNK_SIZE", "128")
    monkeypatch.setenv("CHUNK_OVERLAP", "0")
    s = load_settings()
    assert s.hybrid_search_enabled is False and s.reranker_enabled is True
    assert (s.chunk_size, s.chunk_overlap) == (128, 0)


def test_prefixed_name_wins(monkeypatch):
    monkeypatch.setenv("CHUNK_SIZE", "128")
    monkeypatch.setenv("LLMFRAME_CHUNK_SIZE", "200")
    assert load_settings().chunk_size == 200


def test_bad_value_names_the_variable_that_was_set(monkeypatch):
    monkeypatch.setenv("CHUNK_SIZE", "lots")
    with pytest.raises(ConfigError) as err:
        load_settings()
    assert str(err.value) == (
        "invalid configuration: CHUNK_SIZE: Input should be a valid integer, unable to parse "
        "string as an integer (got 'lots')"
    )
    monkeypatch.setenv("LLMFRAME_RRF_K", "-1")
    with pytest.raises(ConfigError, match=r"LLMFRAME_RRF_K: Input should be greater than or equal to 0"):
        load_settings()


def test_unknown_stemmer_fails_at_start(monkeypatch):
    monkeypatch.setenv("LLMFRAME_BM25_STEMMER", "englsh")
    with pytest.raises(ConfigError, match="unknown stemmer 'englsh'; valid stemmers: "):
        load_settings()
    monkeypatch.setenv("LLMFRAME_BM25_STEMMER", "none")
    monkeypatch.setenv("LLMFRAME_BM25_STOPWORDS", "")
    s = load_settings()
    assert s.bm25_stemmer is None and s.bm25_stopwords is None


def test_bad_enum_lists_choices(monkeypatch):
    monkeypatch.setenv("EMBEDDING_PROVIDER", "cohere")
    with pytest.raises(ConfigError) as err:
        load_settings()
    assert str(err.value) == (
        "invalid configuration: EMBEDDING_PROVIDER: Input should be 'local' or 'openai' (got 'cohere')"
    )


def test_relations_are_checked(monkeypatch):
    monkeypatch.setenv("CHUNK_OVERLAP", "127")
    with pytest.raises(ConfigError) as err:
        load_settings()
    assert str(err.value) == (
        "invalid configuration: CHUNK_OVERLAP (127) must be less than half of CHUNK_SIZE (256) "
        "minus 2 special tokens"
    )
    monkeypatch.setenv("CHUNK_OVERLAP", "126")
    assert load_settings().chunk_overlap == 126


def test_every_accepted_chunking_builds_a_chunker(monkeypatch):
    from llmframe_ray.ingest.chunker import Chunker, WhitespaceTokenCounter

    for size, overlap in [(16, 6), (256, 126), (64, 0)]:
        s = load_settings(chunk_size=size, chunk_overlap=overlap)
        Chunker(WhitespaceTokenCounter(), s.chunk_size, s.chunk_overlap, 2)


def test_chunk_size_over_model_limit(monkeypatch):
    monkeypatch.setenv("CHUNK_SIZE", "400")
    with pytest.raises(ConfigError, match=r"CHUNK_SIZE \(400\) exceeds the local embedder's limit"):
        load_settings()


def test_openai_provider_needs_key(monkeypatch):
    monkeypatch.setenv("EMBEDDING_PROVIDER", "openai")
    with pytest.raises(ConfigError, match="EMBEDDING_PROVIDER=openai needs OPENAI_API_KEY"):
        load_settings()
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    s = load_settings()
    assert s.embedding_provider is EmbeddingProvider.OPENAI
    assert "sk-test" not in repr(s)


def test_search_mode_from_str():
    assert SearchMode.from_str(" Hybrid ") is SearchMode.HYBRID
    with pytest.raises(ValueError) as err:
        SearchMode.from_str("semantic")
    assert str(err.value) == "unknown search mode 'semantic'; valid search modes: bm25, dense, hybrid, graph, hybrid-graph"


def test_errors_never_echo_a_secret_setting(monkeypatch):
    from llmframe_ray.config import load_settings
    from llmframe_ray.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        load_settings(api_keys=["sekrit-key-1", "sekrit-key-2"])
    assert "sekrit" not in str(err.value) and "API_KEYS" in str(err.value)


def test_hybrid_and_reranker_rrf_k_are_separate_settings(monkeypatch):
    monkeypatch.setenv("LLMFRAME_RRF_K", "60")
    monkeypatch.setenv("LLMFRAME_RERANKER_RRF_K", "5")
    params = load_settings().params()
    assert params.retrieval.fusion.rrf_k == 60
    assert params.rerank.rrf_k == 5 and params.service.rerank.rrf_k == 5
    monkeypatch.setenv("LLMFRAME_RERANKER_FUSION", "nearest")
    with pytest.raises(ConfigError, match="LLMFRAME_RERANKER_FUSION: Input should be 'score', 'rrf' or 'none'"):
        load_settings()


def test_each_stage_gets_only_its_own_secrets(monkeypatch):
    monkeypatch.setenv("API_SECRET_KEY", "api-secret-1")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "anthropic-secret-2")
    monkeypatch.setenv("OPENAI_API_KEY", "openai-secret-3")
    params = load_settings().params()
    assert params.providers.anthropic_api_key == "anthropic-secret-2"
    assert params.providers.openai_api_key == "openai-secret-3"
    assert params.embedder.openai is None  # the local embedder: no key travels with it
    for name in ("embedder", "index", "retrieval", "rerank", "reranker_model", "service", "sessions", "ingest"):
        text = repr(getattr(params, name))
        assert "secret" not in text, (name, text)
    assert "secret" not in repr(params.providers)  # keys are never shown in a repr


def test_solo_threads_reach_the_embedder_params(monkeypatch):
    assert load_settings().params().embedder.solo_threads is None  # every core, where it is used
    monkeypatch.setenv("LLMFRAME_SOLO_THREADS", "1")
    assert load_settings().params().embedder.solo_threads == 1
    monkeypatch.setenv("LLMFRAME_SOLO_THREADS", "0")
    with pytest.raises(ConfigError, match=r"LLMFRAME_SOLO_THREADS: Input should be greater than or equal to 1"):
        load_settings()


def test_compression_passage_settings(monkeypatch):
    compression = load_settings().params().service.compression
    assert (compression.passage_margin, compression.passage_budget_tokens, compression.budget_tokens) == (1.0, 550, 750)
    monkeypatch.setenv("LLMFRAME_COMPRESSION_PASSAGE_MARGIN", "none")
    monkeypatch.setenv("LLMFRAME_COMPRESSION_PASSAGE_BUDGET_TOKENS", "0")
    compression = load_settings().params().service.compression
    assert compression.passage_margin is None and compression.passage_budget_tokens is None
    monkeypatch.setenv("LLMFRAME_COMPRESSION_PASSAGE_MARGIN", "-2")
    with pytest.raises(ConfigError) as err:
        load_settings()
    assert str(err.value) == (
        "invalid configuration: LLMFRAME_COMPRESSION_PASSAGE_MARGIN: Input should be greater than or equal to 0 (got '-2')"
    )


def test_compression_relative_threshold_and_passage_prior_settings(monkeypatch):
    compression = load_settings().params().service.compression  # auto: by the reranker's card
    fields = lambda c: (c.relative, c.rationale_relative, c.rationale_evidence, c.passage_prior)
    assert fields(compression) == (None, 6.25, 0.002, 1.0)
    monkeypatch.setenv("LLMFRAME_COMPRESSION_RELATIVE", "4.5")
    monkeypatch.setenv("LLMFRAME_COMPRESSION_PASSAGE_PRIOR", "1.5")
    assert fields(load_settings().params().service.compression) == (4.5, None, None, 1.5)
    monkeypatch.setenv("LLMFRAME_COMPRESSION_RELATIVE", "None")
    assert fields(load_settings().params().service.compression)[:3] == (None, None, None)
    monkeypatch.setenv("LLMFRAME_COMPRESSION_RELATIVE", "-1")
    with pytest.raises(ConfigError) as err:
        load_settings()
    assert str(err.value) == (
        "invalid configuration: LLMFRAME_COMPRESSION_RELATIVE: should be auto, none or a number of at least 0 (got '-1')"
    )
    monkeypatch.setenv("LLMFRAME_COMPRESSION_RELATIVE", "auto")
    monkeypatch.setenv("LLMFRAME_COMPRESSION_PASSAGE_PRIOR", "-1")
    with pytest.raises(ConfigError) as err:
        load_settings()
    assert str(err.value) == (
        "invalid configuration: LLMFRAME_COMPRESSION_PASSAGE_PRIOR: Input should be greater than or equal to 0 (got '-1')"
    )


@pytest.mark.parametrize(("field", "name", "default", "values", "bad", "message"), [
    ("floor_share", "FLOOR_SHARE", 0.2, (("none", None), ("", None), ("0.35", 0.35), ("0", 0.0)), "1.5",
     "Input should be less than or equal to 1 (got '1.5')"),
    ("passage_drop", "PASSAGE_DROP", 2.0, (("none", None), ("", None), ("0.5", 0.5)), "-1",
     "Input should be greater than or equal to 0 (got '-1')"),
    ("evidence", "EVIDENCE", 0.0068, (("none", None), ("", None), ("0.02", 0.02)), "1",
     "Input should be less than 1 (got '1')"),
    ("rationale_evidence", "RATIONALE_EVIDENCE", 0.002, (("none", None), ("0.01", 0.01)), "0",
     "Input should be greater than 0 (got '0')"),
])
def test_compression_settings_that_none_turns_off(monkeypatch, field, name, default, values, bad, message):
    assert getattr(load_settings().params().service.compression, field) == default
    for text, value in values:
        monkeypatch.setenv(f"LLMFRAME_COMPRESSION_{name}", text)
        assert getattr(load_settings().params().service.compression, field) == value
    monkeypatch.setenv(f"LLMFRAME_COMPRESSION_{name}", bad)
    with pytest.raises(ConfigError) as err:
        load_settings()
    assert str(err.value) == f"invalid configuration: LLMFRAME_COMPRESSION_{name}: {message}"


def test_the_evidence_rule_needs_the_local_embedder_it_was_fitted_with(monkeypatch):
    monkeypatch.setenv("LLMFRAME_EMBEDDING_PROVIDER", "openai")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    compression = load_settings().params().service.compression
    assert (compression.evidence, compression.rationale_evidence) == (None, 0.002)  # other cosines: the budget


@pytest.mark.parametrize("given", [{"LLMFRAME_COMPRESSION_THRESHOLD": "0.5"},
                                   {"LLMFRAME_COMPRESSION_THRESHOLD": "0.5", "LLMFRAME_COMPRESSION_BUDGET_TOKENS": "0"}])
def test_a_configured_score_threshold_asks_for_the_threshold_and_budget_rules(monkeypatch, given):
    for name, value in given.items():
        monkeypatch.setenv(name, value)
    compression = load_settings().params().service.compression
    assert (compression.evidence, compression.rationale_evidence, compression.threshold) == (None, None, 0.5)
    assert compression.rationale_relative == 6.25  # a rationale reranker: the relative rule, the threshold beside it
