"""train-reranker --init M: training that starts from a trained reranker's weights, read back
from its ONNX file (train/warm_start.py)."""

import hashlib
import json
import shutil
from dataclasses import replace

import numpy as np
import pytest

from llmframe_ray.errors import DatasetError, ModelError
from llmframe_ray.eval.beir import load_beir
from llmframe_ray.eval.runner import check_reranker_data
from llmframe_ray.models.cross_encoder import CrossEncoder, Precision, read_card
from llmframe_ray.models.export import bundled_minilm_path
from llmframe_ray.train.reranker import mean_pool_classifier, pair_tokenizer
from llmframe_ray.train.run import train_reranker
from llmframe_ray.train.warm_start import init_layers, load_weights, torch_scores
from tests.unit.tiny_beir import CONFIG, TOPICS, tiny_settings, train_params, train_tiny, write_tiny_beir

PAIRS = [("why do tides happen", text) for text in TOPICS.values()]


@pytest.fixture(scope="module")
def dataset_dir(tmp_path_factory):
    return write_tiny_beir(tmp_path_factory.mktemp("collection"))


@pytest.fixture(scope="module")
def settings(tmp_path_factory, model_dir):
    return tiny_settings(tmp_path_factory.mktemp("home"), model_dir)


@pytest.fixture(scope="module")
def trained(dataset_dir, settings, tmp_path_factory):
    return train_tiny(dataset_dir, settings, tmp_path_factory.mktemp("models") / "tiny-reranker")


def fp32(folder):
    return CrossEncoder(folder, precision=Precision.FP32).score_pairs(PAIRS)


def fresh(layers=6):
    tokenizer = pair_tokenizer(bundled_minilm_path(), 48)
    tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")
    return mean_pool_classifier(bundled_minilm_path(), layers=layers), tokenizer


def test_the_weights_read_back_score_as_the_onnx_file_does(trained):
    """Every parameter the graph uses comes back from the file (MiniLM's unused pooler keeps its
    own values), and the module then scores the pairs as ONNX Runtime does on that file."""
    folder, _ = trained
    model, tokenizer = fresh()
    before = torch_scores(model, tokenizer, PAIRS)
    unused = load_weights(model, folder, tokenizer)
    assert unused == ["encoder.pooler.dense.weight", "encoder.pooler.dense.bias"]
    after = torch_scores(model, tokenizer, PAIRS)
    np.testing.assert_allclose(after, fp32(folder), atol=1e-4)
    assert np.abs(before - fp32(folder)).max() > 1e-3  # the file's model is not MiniLM's start
    assert init_layers(folder) == 6


def test_a_training_started_from_a_reranker_continues_it_and_says_so(trained, dataset_dir, settings, tmp_path):
    """Zero steps from --init M export M again; the card names M (and its weights' digest),
    and the eval's leak check follows the new model to what M was trained on."""
    folder, _ = trained
    lines = []
    card = train_reranker(dataset_dir, "train", tmp_path / "again", replace(CONFIG, max_steps=0), lines.append,
                          init=folder, **train_params(settings))
    np.testing.assert_allclose(fp32(tmp_path / "again"), fp32(folder), atol=1e-4)
    assert f"starting from the weights of {folder}" in lines
    assert card["init"]["name"] == "tiny-reranker" and card["layers"] == [0, 1, 2, 3, 4, 5]
    assert card["init"]["model_sha256"] == hashlib.sha256((folder / "model.onnx").read_bytes()).hexdigest()
    assert card["initialised_from"] == "the reranker tiny-reranker (card: init)"
    assert not any("warning" in line for line in lines)  # same seed and held-out share as the model started from

    scratch = train_reranker(dataset_dir, "train", tmp_path / "scratch", replace(CONFIG, max_steps=0), lambda line: None,
                             **train_params(settings))
    assert "init" not in scratch and np.abs(fp32(tmp_path / "scratch") - fp32(folder)).max() > 1e-3
    # untrained, its gates are all equal and the export merged them into one weight: still read back
    model, tokenizer = fresh()
    load_weights(model, tmp_path / "scratch", tokenizer)
    np.testing.assert_allclose(torch_scores(model, tokenizer, PAIRS), fp32(tmp_path / "scratch"), atol=1e-4)

    moved = dict(card, data={"dataset": "elsewhere", "split": "train"})
    check_reranker_data(moved, load_beir(dataset_dir, "test"))
    with pytest.raises(ModelError, match="trained on tiny-beir/qrels/train.tsv"):
        check_reranker_data(moved, load_beir(dataset_dir, "train"))  # through the model it started from


def test_init_refuses_what_it_cannot_start_from(trained, dataset_dir, settings, tmp_path):
    folder, _ = trained
    bare = tmp_path / "bare"
    bare.mkdir()
    shutil.copy(folder / "model.onnx", bare / "model.onnx")
    with pytest.raises(ModelError, match=f"{bare} is not a reranker made by train-reranker"):
        train_reranker(dataset_dir, "train", tmp_path / "x", CONFIG, lambda line: None, init=bare, **train_params(settings))
    with pytest.raises(DatasetError, match=f"--layers 2 contradicts --init {folder}, a 6-layer reranker"):
        train_reranker(dataset_dir, "train", tmp_path / "y", replace(CONFIG, layers=2), lambda line: None, init=folder,
                       **train_params(settings))
    # a 6-layer card over a 2-layer file: its weights do not map onto a 6-layer model
    small = tmp_path / "small"
    train_reranker(dataset_dir, "train", small, replace(CONFIG, layers=2, max_steps=1), lambda line: None,
                   **train_params(settings))
    (small / "reranker.json").write_text(json.dumps({**read_card(small), "layers": [0, 1, 2, 3, 4, 5]}))
    model, tokenizer = fresh()
    with pytest.raises(ModelError, match=r"small/model.onnx was not exported from this model \(its graph has \d+ nodes of other kinds or order, this model.s \d+\)"):
        load_weights(model, small, tokenizer)
