"""Sessions that read one shared, memory-mapped copy of a model's prepacked weights
(models/runtime.py: prepacked_model): the same outputs bit for bit, made once in the cache
folder (never beside the model), and a plain session when the copy cannot be made."""

import json
import logging
import os
import platform
import shutil
from pathlib import Path

import numpy as np
import pytest

from llmframe_ray.models import runtime
from llmframe_ray.models.runtime import (
    PREPACKED_MODEL,
    PREPACKED_SOURCE,
    PREPACKED_WEIGHTS,
    create_session,
    load_tokenizer,
    pad_encodings,
)

TEXTS = ["what causes tides", "a much longer question about the waggle dance of honey bees and flowers", "x"]


@pytest.fixture()
def model_copy(tmp_path, model_dir) -> Path:
    folder = tmp_path / "model"
    folder.mkdir()
    for name in ("model.onnx", "tokenizer.json"):
        shutil.copyfile(model_dir / name, folder / name)  # a copy: a test changes its times
    return folder / "model.onnx"


def outputs(session, tokenizer_path: Path) -> list[np.ndarray]:
    tokenizer = load_tokenizer(tokenizer_path, 256)
    names = {i.name for i in session.get_inputs()}
    return [session.run(None, pad_encodings(tokenizer.encode_batch([t])).feeds(names))[0] for t in TEXTS]


def test_shared_weights_give_the_same_outputs_from_a_mapped_file(model_copy, tmp_path):
    cache = tmp_path / "prepacked"
    plain = create_session(model_copy, 1)
    shared = create_session(model_copy, 1, prepacked_dir=cache)
    (made,) = sorted(cache.iterdir())
    assert made.name.startswith("model-model-")  # <model folder>-<file stem>-<key>
    assert sorted(p.name for p in made.iterdir()) == sorted([PREPACKED_MODEL, PREPACKED_SOURCE, PREPACKED_WEIGHTS])
    source = json.loads((made / PREPACKED_SOURCE).read_text())
    assert source == {"model": str(model_copy.resolve()), "size": model_copy.stat().st_size,
                      "mtime_ns": model_copy.stat().st_mtime_ns, "host": platform.node()}
    assert (made / PREPACKED_WEIGHTS).stat().st_size > model_copy.stat().st_size  # weights plus their packed form
    tokenizer = model_copy.parent / "tokenizer.json"
    for a, b in zip(outputs(plain, tokenizer), outputs(shared, tokenizer)):
        assert np.array_equal(a, b)
    with open("/proc/self/maps", encoding="utf-8") as maps:
        assert str(made / PREPACKED_WEIGHTS) in maps.read()  # file-backed pages: one copy per machine

    stamp = (made / PREPACKED_WEIGHTS).stat().st_mtime_ns
    assert runtime.prepacked_model(model_copy, cache) == made / PREPACKED_MODEL  # made once, then reused
    assert (made / PREPACKED_WEIGHTS).stat().st_mtime_ns == stamp
    assert sorted(p.name for p in cache.iterdir()) == [made.name]  # no staging folder left
    assert sorted(p.name for p in model_copy.parent.iterdir()) == ["model.onnx", "tokenizer.json"]


def test_a_new_model_file_gets_its_own_copy_and_the_old_copy_goes(model_copy, tmp_path):
    cache = tmp_path / "prepacked"
    first = runtime.prepacked_model(model_copy, cache)
    session = create_session(model_copy, 1, prepacked_dir=cache)  # maps the first copy's weights
    os.utime(model_copy, ns=(model_copy.stat().st_atime_ns, model_copy.stat().st_mtime_ns + 10**9))
    second = runtime.prepacked_model(model_copy, cache)
    assert first != second and second.is_file()
    assert sorted(p.name for p in cache.iterdir()) == [second.parent.name]  # the stale copy is removed
    tokenizer = model_copy.parent / "tokenizer.json"
    for a, b in zip(outputs(session, tokenizer), outputs(create_session(model_copy, 1), tokenizer)):
        assert np.array_equal(a, b)  # a session that mapped the removed copy still runs


def test_copies_of_missing_or_changed_models_are_stale_and_others_are_not(model_copy, tmp_path):
    cache = tmp_path / "prepacked"
    other = tmp_path / "other" / "model.onnx"
    other.parent.mkdir()
    shutil.copyfile(model_copy, other)
    kept = runtime.prepacked_model(other, cache).parent
    gone = runtime.prepacked_model(model_copy, cache).parent
    older = cache / "model-model-0123456789abcdef"  # made before copies recorded their source
    older.mkdir()
    unreadable = cache / "model-model-fedcba9876543210"
    unreadable.mkdir()
    (unreadable / PREPACKED_SOURCE).write_text("[1, 2]")
    elsewhere = cache / "model-model-00000000000000ff"  # made on another host sharing the folder
    elsewhere.mkdir()
    (elsewhere / PREPACKED_SOURCE).write_text(json.dumps({"model": "/nowhere/model.onnx", "size": 1, "mtime_ns": 1,
                                                          "host": platform.node() + "-other"}))
    assert runtime.stale_copies(cache) == []
    model_copy.unlink()
    assert runtime.stale_copies(cache) == [gone]
    other.write_bytes(other.read_bytes() + b"\0")  # same path, another size
    assert runtime.stale_copies(cache) == sorted([gone, kept])
    assert older.is_dir() and unreadable.is_dir() and elsewhere.is_dir()


def test_a_sweep_that_fails_keeps_the_new_copy(model_copy, tmp_path, monkeypatch, caplog):
    def broken(cache_dir):
        raise PermissionError(13, "Permission denied", str(cache_dir))

    monkeypatch.setattr(runtime, "stale_copies", broken)
    with caplog.at_level(logging.WARNING, logger="llmframe_ray.models.runtime"):
        made = runtime.prepacked_model(model_copy, tmp_path / "prepacked")
    assert made.name == PREPACKED_MODEL and made.is_file()
    assert "cannot remove stale prepacked copies in" in caplog.text and "Permission denied" in caplog.text


def test_the_first_copy_wins_a_race(model_copy, tmp_path, monkeypatch):
    real_rename = Path.rename

    def other_process_first(self, target):
        shutil.copytree(self, target)  # another replica renamed its copy into place just before
        return real_rename(self, target)  # -> the directory is not empty: OSError

    monkeypatch.setattr(Path, "rename", other_process_first)
    made = runtime.prepacked_model(model_copy, tmp_path / "prepacked")
    assert made.name == PREPACKED_MODEL and made.parent.parent == tmp_path / "prepacked"
    assert [p.name for p in (tmp_path / "prepacked").iterdir()] == [made.parent.name]  # the loser's folder is gone


def test_without_a_copy_the_model_itself_is_served(model_copy, tmp_path, monkeypatch, caplog):
    def refuse(self, *args, **kwargs):
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "mkdir", refuse)
    with caplog.at_level(logging.WARNING, logger="llmframe_ray.models.runtime"):
        session = create_session(model_copy, 1, prepacked_dir=tmp_path / "prepacked")
    assert session.get_inputs()  # loaded from model.onnx itself
    assert f"serving {model_copy} without shared prepacked weights: [Errno 13] Permission denied" in caplog.text
    assert not (tmp_path / "prepacked").exists()


def test_a_damaged_copy_falls_back_to_the_model(model_copy, tmp_path, caplog):
    cache = tmp_path / "prepacked"
    made = runtime.prepacked_model(model_copy, cache)
    weights = made.parent / PREPACKED_WEIGHTS
    weights.write_bytes(weights.read_bytes()[: 1 << 20])  # truncated, as by a full disk
    with caplog.at_level(logging.WARNING, logger="llmframe_ray.models.runtime"):
        session = create_session(model_copy, 1, prepacked_dir=cache)
    assert f"cannot load {made} (" in caplog.text and f"loading {model_copy} instead" in caplog.text
    tokenizer = model_copy.parent / "tokenizer.json"
    for a, b in zip(outputs(session, tokenizer), outputs(create_session(model_copy, 1), tokenizer)):
        assert np.array_equal(a, b)


def test_skipped_fusions_stay_skipped_in_the_copy_and_on_load(tiny_reranker_dir, tmp_path):
    """The int8 cross-encoder's session skips SkipLayerNormalization fusion (models/cross_encoder.py):
    the optimized copy is made without it, under its own key, and loading it does not fuse again."""
    import onnx

    from llmframe_ray.models.cross_encoder import INT8_SKIPPED_FUSIONS
    from llmframe_ray.models.export import quantize_int8

    int8 = tmp_path / "tiny" / "model.int8.onnx"
    int8.parent.mkdir()
    quantize_int8(tiny_reranker_dir / "model.onnx", int8)
    fused = runtime.prepacked_model(int8, tmp_path / "prepacked")
    unfused = runtime.prepacked_model(int8, tmp_path / "prepacked", INT8_SKIPPED_FUSIONS)
    assert fused != unfused

    def ops(path: Path) -> list[str]:
        return [node.op_type for node in onnx.load(str(path), load_external_data=False).graph.node]

    assert ops(fused).count("SkipLayerNormalization") == 2  # one in each of the 2 layers
    assert "SkipLayerNormalization" not in ops(unfused)
    plain = create_session(int8, 1, skipped_fusions=INT8_SKIPPED_FUSIONS)
    shared = create_session(int8, 1, prepacked_dir=tmp_path / "prepacked", skipped_fusions=INT8_SKIPPED_FUSIONS)
    for a, b in zip(outputs(plain, tiny_reranker_dir / "tokenizer.json"), outputs(shared, tiny_reranker_dir / "tokenizer.json")):
        assert np.array_equal(a, b)
