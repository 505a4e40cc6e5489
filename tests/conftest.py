"""Shared fixtures. Models and built test indexes are cached under LLMFRAME_HOME (default: the
user's cache folder), so only the first run pays for the ONNX export and the SciFact index."""

from pathlib import Path

import pytest

from llmframe_ray.config import load_settings
from llmframe_ray.models.embedder import OnnxEmbedder, ensure_local_model

SHARED_EVAL = Path(__file__).resolve().parents[1].parent / "shared" / "eval"


@pytest.fixture(scope="session")
def model_dir() -> Path:
    return ensure_local_model(load_settings().models_dir)


@pytest.fixture(scope="session")
def embedder(model_dir) -> OnnxEmbedder:
    return OnnxEmbedder(model_dir, max_length=256, batch_size=16, threads=2)
