"""The sentence encoder's ONNX export (models/export.py) and its upgrade in place
(models/embedder.py: ensure_local_model)."""

import json
import logging
import os
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import llmframe_ray.models.export as export
from llmframe_ray.errors import MissingDependencyError
from llmframe_ray.models.embedder import ensure_local_model, local_model_dir


def _folder(path: Path, attention: str | None, marker: str) -> Path:
    path.mkdir(parents=True)
    for name in ("model.onnx", *export.EXPORT_FILES):
        (path / name).write_text(marker, encoding="utf-8")
    info = {"opset": export.ONNX_OPSET} if attention is None else {"opset": export.ONNX_OPSET, "attention": attention}
    (path / export.EXPORT_INFO).write_text(json.dumps(info), encoding="utf-8")
    return path


def _fake_export(calls: list):
    """Stands in for export_encoder: writes a current folder through the real write_folder."""

    def fake(source_dir, target_dir, *, replace=False):
        calls.append((Path(source_dir), Path(target_dir), replace))

        def fill(tmp: Path) -> None:
            for name in ("model.onnx", *export.EXPORT_FILES):
                (tmp / name).write_text("new", encoding="utf-8")
            (tmp / export.EXPORT_INFO).write_text(json.dumps({"attention": export.ENCODER_ATTENTION}), encoding="utf-8")

        return export.write_folder(target_dir, fill, replace=replace)

    return fake


def test_the_bundled_encoder_is_traced_without_sdpa_mask_passes(model_dir):
    """The export in use is the eager-attention trace: no IsNaN and (almost) no Where nodes,
    which the SDPA trace runs over (heads x tokens x tokens) in every layer (it had 6 and 13)."""
    import importlib.util

    import onnx

    if "attention" not in export.export_info(model_dir) and importlib.util.find_spec("torch") is None:
        pytest.skip("an older export kept where torch is missing (ensure_local_model's fallback)")

    assert export.export_info(model_dir)["attention"] == "eager"
    ops = Counter(node.op_type for node in onnx.load(str(model_dir / "model.onnx")).graph.node)
    assert ops["IsNaN"] == 0 and ops["Where"] <= 2, ops
    assert ops["Softmax"] == 6 and ops["MatMul"] == 48  # the same six layers' products


def test_write_folder_keeps_an_existing_folder_unless_told_to_replace(tmp_path):
    target = _folder(tmp_path / "m", None, "old")

    def fill(tmp: Path) -> None:
        (tmp / "model.onnx").write_text("new", encoding="utf-8")

    export.write_folder(target, fill)
    assert (target / "model.onnx").read_text() == "old"  # another process made it first
    export.write_folder(target, fill, replace=True)
    assert (target / "model.onnx").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]  # no temporary or set-aside folder left
    assert sorted(p.name for p in target.iterdir()) == ["model.onnx"]


def test_an_older_export_is_exported_again_in_place(tmp_path, monkeypatch):
    old = _folder(local_model_dir(tmp_path), None, "old")
    calls: list = []
    monkeypatch.setattr(export, "export_encoder", _fake_export(calls))
    monkeypatch.setattr(export, "bundled_minilm_path", lambda: tmp_path / "bundled")

    assert ensure_local_model(tmp_path) == old
    assert calls == [(tmp_path / "bundled", old, True)]
    assert (old / "model.onnx").read_text() == "new" and export.is_current_export(old)
    assert sorted(p.name for p in tmp_path.iterdir()) == [f".{old.name}.lock", old.name]  # nothing set aside left

    assert ensure_local_model(tmp_path) == old  # current now: not exported again
    assert len(calls) == 1


def test_a_missing_folder_is_exported_and_a_current_one_is_kept(tmp_path, monkeypatch):
    calls: list = []
    monkeypatch.setattr(export, "export_encoder", _fake_export(calls))
    monkeypatch.setattr(export, "bundled_minilm_path", lambda: tmp_path / "bundled")
    target = ensure_local_model(tmp_path)
    assert calls == [(tmp_path / "bundled", local_model_dir(tmp_path), False)] and export.is_current_export(target)

    current = _folder(local_model_dir(tmp_path / "other"), export.ENCODER_ATTENTION, "kept")
    assert ensure_local_model(tmp_path / "other") == current and len(calls) == 1
    assert (current / "model.onnx").read_text() == "kept"


@pytest.mark.parametrize("content", ["", "not json", "[1, 2]"])
def test_an_unreadable_export_record_counts_as_older(tmp_path, content):
    folder = _folder(tmp_path / "m", export.ENCODER_ATTENTION, "x")
    (folder / export.EXPORT_INFO).write_text(content, encoding="utf-8")
    assert export.export_info(folder) == {} and not export.is_current_export(folder)


def test_processes_that_find_an_older_export_at_once_export_it_once(tmp_path, monkeypatch):
    old = _folder(local_model_dir(tmp_path), None, "old")
    calls: list = []
    fake = _fake_export(calls)

    def slow(source_dir, target_dir, *, replace=False):
        time.sleep(0.3)  # a real export takes tens of seconds: the others arrive meanwhile
        return fake(source_dir, target_dir, replace=replace)

    monkeypatch.setattr(export, "export_encoder", slow)
    monkeypatch.setattr(export, "bundled_minilm_path", lambda: tmp_path / "bundled")
    with ThreadPoolExecutor(4) as pool:  # flock: each open of the lock file is its own holder
        found = list(pool.map(lambda _: ensure_local_model(tmp_path), range(4)))
    assert found == [old] * 4 and len(calls) == 1 and export.is_current_export(old)
    assert sorted(p.name for p in tmp_path.iterdir()) == [f".{old.name}.lock", old.name]


@pytest.mark.parametrize("error, said", [
    (MissingDependencyError("torch", "exporting a model to ONNX"),
     "(MissingDependencyError: exporting a model to ONNX needs the package 'torch'"),
    (PermissionError(13, "Permission denied", "models"), "(PermissionError: [Errno 13] Permission denied"),
])
def test_an_older_export_stays_in_use_where_it_cannot_be_exported_again(tmp_path, monkeypatch, caplog, error, said):
    old = _folder(local_model_dir(tmp_path), None, "old")

    def fails(source_dir, target_dir, *, replace=False):
        raise error

    monkeypatch.setattr(export, "export_encoder", fails)
    monkeypatch.setattr(export, "bundled_minilm_path", lambda: tmp_path / "bundled")
    with caplog.at_level(logging.WARNING, logger="llmframe_ray.models.embedder"):
        assert ensure_local_model(tmp_path) == old
    assert (old / "model.onnx").read_text() == "old"
    assert f"{old} is an older, slower export of the embedding model; it stays in use because it cannot be exported again here {said}" in caplog.text


def test_a_replacement_that_cannot_go_in_puts_the_old_folder_back(tmp_path, monkeypatch):
    target = _folder(tmp_path / "m", None, "old")
    real_rename = os.rename

    def rename(src, dst):
        if Path(src).name.startswith(".m.tmp-"):
            raise PermissionError(13, "Permission denied", str(dst))
        return real_rename(src, dst)

    monkeypatch.setattr(export.os, "rename", rename)

    def fill(tmp: Path) -> None:
        (tmp / "model.onnx").write_text("new", encoding="utf-8")

    with pytest.raises(PermissionError):
        export.write_folder(target, fill, replace=True)
    assert (target / "model.onnx").read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]
