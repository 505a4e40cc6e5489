"""Shared fixtures. Models and built test indexes are cached under LLMFRAME_HOME (default: the
user's cache folder), so only the first run pays for the ONNX export and the SciFact index."""

import os
from pathlib import Path

import pytest

from llmframe_ray.config import load_settings
from llmframe_ray.models.embedder import OnnxEmbedder, ensure_local_model

SHARED_EVAL = Path(__file__).resolve().parents[1].parent / "shared" / "eval"

# Tiers (tests/README.md). A test's tier follows from its folder and the fixtures it uses:
# tests/quality -> quality, tests/browser -> browser, tests/integration and the unit tests that import Ray -> integration,
# a test that needs the exported embedder or a torch-made model -> model, the rest -> unit.
MODEL_FIXTURES = {"model_dir", "embedder", "tiny_reranker_dir", "trained", "tiny_model"}
NEEDS_RAY = {"test_deployments_config.py"}


def tier_of(item: pytest.Item) -> str:
    path = Path(str(item.fspath))
    if path.parent.name in ("quality", "browser"):
        return path.parent.name
    if path.parent.name == "integration" or path.name in NEEDS_RAY:
        return "integration"
    if MODEL_FIXTURES & set(getattr(item, "fixturenames", ())) or item.get_closest_marker("model"):
        return "model"
    return "unit"


# CI once printed "1121 passed" and then the process died with SIGSEGV while the interpreter
# tore down (torch, FAISS and Ray's core worker are all loaded here, with two copies of libgomp);
# a full rerun here exited cleanly. Once pytest has written its report, the process leaves with
# pytest's own exit status and skips that native teardown. LLMFRAME_TEST_TEARDOWN=1 keeps it
# (to reproduce the crash, with `python -X faulthandler -m pytest`).
def pytest_sessionfinish(session, exitstatus):
    session.config._llmframe_session = session


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    import os
    import sys

    session = getattr(config, "_llmframe_session", None)
    if session is None or os.environ.get("LLMFRAME_TEST_TEARDOWN") == "1":
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(int(session.exitstatus))


def pytest_collection_modifyitems(config, items):
    for item in items:
        tier = tier_of(item)
        if item.get_closest_marker(tier) is None:
            item.add_marker(getattr(pytest.mark, tier))


@pytest.fixture(scope="session")
def model_dir() -> Path:
    return ensure_local_model(load_settings().models_dir)


def cli_env(home: Path, model_dir: Path, **extra: str) -> dict[str, str]:
    """The environment for running `llmframe-ray` as a subprocess with its own LLMFRAME_HOME in
    `home`, whose models folder links the exported model (so no test exports it again), and
    without RAY_ADDRESS (a command that needs Ray starts its own)."""
    (home / "models").mkdir(parents=True)
    os.symlink(model_dir, home / "models" / model_dir.name)
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    return {**env, "LLMFRAME_HOME": str(home), **extra}


@pytest.fixture(scope="session")
def embedder(model_dir) -> OnnxEmbedder:
    return OnnxEmbedder(model_dir, max_length=256, batch_size=16, threads=2)


@pytest.fixture(scope="session")
def tiny_reranker_dir(tmp_path_factory) -> Path:
    """A small random cross-encoder (seeded BERT, MiniLM tokenizer) exported to ONNX: real
    scores from a real runtime, cheap enough for the Serve tests."""
    import json
    import shutil

    import torch
    from transformers import BertConfig, BertForSequenceClassification

    from llmframe_ray.models.export import bundled_minilm_path, export_graph

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=128, num_labels=1,
    )
    model = BertForSequenceClassification(config).eval()
    folder = tmp_path_factory.mktemp("tiny-reranker")
    export_graph(model, folder / "model.onnx", "logits")
    shutil.copyfile(bundled_minilm_path() / "tokenizer.json", folder / "tokenizer.json")
    (folder / "reranker.json").write_text(json.dumps({"name": "tiny-test-reranker", "max_length": 128}))
    return folder
