import pytest

from llmframe_ray.config import DenseIndexKind, EmbeddingProvider, load_settings
from llmframe_ray.errors import ConfigError
from llmframe_ray.types import SearchMode

SEED_VARS = ("HYBRID_SEARCH_ENABLED", "RERANKER_ENABLED", "EMBEDDING_PROVIDER", "CHUNK_SIZE", "CHUNK_OVERLAP")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for name in SEED_VARS + ("OPENAI_API_KEY",):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(f"LLMFRAME_{name}", raising=False)


def test_defaults():
    s = load_settings()
    assert (s.chunk_size, s.chunk_overlap, s.rrf_k) == (256, 32, 60)
    assert s.hybrid_search_enabled is True and s.reranker_enabled is False
    assert s.embedding_provider is EmbeddingProvider.LOCAL
    assert s.dense_index is DenseIndexKind.FLAT


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


def test_bad_value_names_the_setting(monkeypatch):
    monkeypatch.setenv("CHUNK_SIZE", "lots")
    with pytest.raises(ConfigError) as err:
        load_settings()
    assert "LLMFRAME_CHUNK_SIZE" in str(err.value) and "'lots'" in str(err.value)


def test_bad_enum_lists_choices(monkeypatch):
    monkeypatch.setenv("EMBEDDING_PROVIDER", "cohere")
    with pytest.raises(ConfigError) as err:
        load_settings()
    assert "LLMFRAME_EMBEDDING_PROVIDER" in str(err.value)
    assert "'local'" in str(err.value) and "'openai'" in str(err.value)


def test_relations_are_checked(monkeypatch):
    monkeypatch.setenv("CHUNK_OVERLAP", "200")
    with pytest.raises(ConfigError) as err:
        load_settings()
    assert str(err.value) == (
        "invalid configuration: CHUNK_OVERLAP (200) must be less than half of CHUNK_SIZE (256)"
    )


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
    assert str(err.value) == "unknown search mode 'semantic'; valid modes: bm25, dense, hybrid"
