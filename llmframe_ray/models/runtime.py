"""ONNX Runtime pieces shared by the embedder and the cross-encoder."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from llmframe_ray.errors import ModelError

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class EncodedBatch:
    """Token ids of a batch, padded to its longest member."""

    input_ids: np.ndarray
    attention_mask: np.ndarray
    token_type_ids: np.ndarray

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    def feeds(self, input_names: set[str]) -> dict[str, np.ndarray]:
        all_inputs = {
            "input_ids": self.input_ids,
            "attention_mask": self.attention_mask,
            "token_type_ids": self.token_type_ids,
        }
        return {name: value for name, value in all_inputs.items() if name in input_names}


def pad_encodings(encodings: Sequence) -> EncodedBatch:
    """`tokenizers` encodings (unpadded) -> int64 arrays padded with zeros to the longest."""
    width = max((len(e.ids) for e in encodings), default=0)
    ids = np.zeros((len(encodings), width), dtype=np.int64)
    mask = np.zeros((len(encodings), width), dtype=np.int64)
    types = np.zeros((len(encodings), width), dtype=np.int64)
    for row, enc in enumerate(encodings):
        n = len(enc.ids)
        ids[row, :n] = enc.ids
        mask[row, :n] = enc.attention_mask
        types[row, :n] = enc.type_ids
    return EncodedBatch(ids, mask, types)


def available_threads(threads: int | None = None) -> int:
    """`threads` when given, else every core this process may run on."""
    if threads is not None:
        return threads
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def create_session(
    model_path: Path,
    threads: int,
    spinning: bool = True,
    prepacked_dir: Path | None = None,
    stop_spinning: bool = False,
    skipped_fusions: Sequence[str] = (),
):
    """An ONNX Runtime CPU session using `threads` intra-op threads (one inter-op thread).

    `spinning`: whether idle pool threads spin-wait between runs (ONNX Runtime's default; only a
    session with 2 or more threads has a pool). Measured on 2 cores: one query through 2 threads
    takes 4.2 ms spinning, 5.5 ms not; but Serve replicas sharing the cores with 2 spinning
    threads each served half the requests of replicas with one thread each (README "Serving
    benchmark"): LLMFRAME_ORT_SPINNING=false where multi-threaded sessions share cores.
    `stop_spinning`: the pool threads spin only while a run is in progress and stop as soon as
    it returns (`session.force_spinning_stop`), for a session that runs now and then on cores
    that other processes use in between.

    `prepacked_dir`: run the model from its optimized copy in this folder, whose weights, already
    packed for this CPU's kernels, sit in a file that ONNX Runtime maps into memory (made once:
    `prepacked_model`), so that every process on the machine reads one copy of them instead of
    packing its own; same outputs, bit for bit. Falls back to the model itself when the copy
    cannot be made.

    `skipped_fusions`: graph optimizers of ONNX Runtime (by name) not to run, here and in the
    optimized copy (e.g. INT8_SKIPPED_FUSIONS)."""
    import onnxruntime as ort

    if threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    flag = "1" if spinning else "0"
    options.add_session_config_entry("session.intra_op.allow_spinning", flag)
    options.add_session_config_entry("session.inter_op.allow_spinning", flag)
    if stop_spinning:
        options.add_session_config_entry("session.force_spinning_stop", "1")
    path = Path(model_path)

    def load(model: Path):
        return ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"], **_skipping(skipped_fusions))

    if prepacked_dir is not None and path.is_file():
        copy = prepacked_model(path, Path(prepacked_dir), skipped_fusions)
        if copy != path:
            try:
                return load(copy)
            except Exception as exc:  # a damaged copy: the model itself still serves
                logger.warning("cannot load %s (%s); loading %s instead", copy, exc, path)
    try:
        return load(path)
    except Exception as exc:  # onnxruntime raises its own exception types
        raise ModelError(f"cannot load {path}: {exc}") from exc


PREPACKED_DIR = "prepacked"  # under a models folder: copies of models with shared weights
PREPACKED_MODEL = "model.onnx"
PREPACKED_WEIGHTS = "weights.bin"
PREPACKED_SOURCE = "source.json"  # the model file a copy was made from: path, size, modification time


def prepacked_model(model_path: Path, cache_dir: Path, skipped_fusions: Sequence[str] = ()) -> Path:
    """The optimized copy of `model_path` with its weights prepacked into an external file,
    in `cache_dir/<model name>-<key>/`, made on first use. The key covers the model file (path,
    size, modification time), the ONNX Runtime version, the CPU (the packing depends on its
    instruction set) and the fusions skipped (create_session). Several processes may race to
    make it: each writes a private folder and renames it into place; the first rename wins. Returns `model_path` itself (with a warning)
    when the copy cannot be made, e.g. in a read-only folder.

    A process that makes a new copy removes the copies whose model file is gone or has changed
    since (`stale_copies`): a model exported again, a reranker trained again into the same
    folder, a test's temporary model. A process that already mapped such a copy keeps its pages."""
    import onnxruntime as ort

    stat = model_path.stat()
    key = hashlib.sha256(
        f"{model_path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}|{ort.__version__}|{_cpu_signature()}".encode()
        + (f"|skipped:{','.join(sorted(skipped_fusions))}".encode() if skipped_fusions else b"")  # none: the old keys
    ).hexdigest()[:16]
    target = cache_dir / f"{model_path.parent.name}-{model_path.stem}-{key}"
    if (target / PREPACKED_MODEL).is_file():
        return target / PREPACKED_MODEL
    staging = cache_dir / f".{target.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        staging.mkdir()
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.optimized_model_filepath = str(staging / PREPACKED_MODEL)
        options.add_session_config_entry("session.optimized_model_external_initializers_file_name", PREPACKED_WEIGHTS)
        options.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
        options.add_session_config_entry("session.save_external_prepacked_constant_initializers", "1")
        options.log_severity_level = 3  # it warns that the file suits this machine only, which the key ensures
        ort.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"], **_skipping(skipped_fusions))
        source = {"model": str(model_path.resolve()), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns,
                  "host": platform.node()}
        (staging / PREPACKED_SOURCE).write_text(json.dumps(source) + "\n", encoding="utf-8")
        try:
            staging.rename(target)
            made = True
        except OSError:  # another process put its copy there first
            if not (target / PREPACKED_MODEL).is_file():
                raise
            made = False
    except Exception as exc:  # noqa: BLE001 - a copy that cannot be made only costs memory
        logger.warning("serving %s without shared prepacked weights: %s", model_path, exc)
        return model_path
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    if made:
        try:
            for stale in stale_copies(cache_dir):
                shutil.rmtree(stale, ignore_errors=True)
        except Exception as exc:  # noqa: BLE001 - a sweep that fails leaves only disk space behind
            logger.warning("cannot remove stale prepacked copies in %s: %s", cache_dir, exc)
    return target / PREPACKED_MODEL


def stale_copies(cache_dir: Path) -> list[Path]:
    """The prepacked copies in `cache_dir`, made on this host, whose model file no longer
    exists, or no longer has the size and modification time the copy was made from. Copies
    made on another host (a models folder on shared storage: that host judges them, as its
    paths and its mapped pages are its own) and copies that do not say what they were made
    from (made before PREPACKED_SOURCE was written) are left alone."""
    found = []
    for folder in sorted(Path(cache_dir).iterdir()) if Path(cache_dir).is_dir() else []:
        if folder.name.startswith(".") or not folder.is_dir():
            continue  # a copy being made
        try:
            source = json.loads((folder / PREPACKED_SOURCE).read_text(encoding="utf-8"))
            model = Path(source["model"])
        except (OSError, ValueError, KeyError, TypeError):
            continue  # an older copy, or a record it cannot read: nothing to judge it by
        if source.get("host") != platform.node():
            continue
        try:
            stat = model.stat()
        except FileNotFoundError:
            found.append(folder)  # its model file is gone
            continue
        except (OSError, ValueError):
            continue
        if (stat.st_size, stat.st_mtime_ns) != (source.get("size"), source.get("mtime_ns")):
            found.append(folder)
    return found


def _skipping(fusions: Sequence[str]) -> dict[str, list[str]]:
    """InferenceSession's keyword for graph optimizers not to run (none: no keyword at all)."""
    return {"disabled_optimizers": list(fusions)} if fusions else {}


def _cpu_signature() -> str:
    """The processor's name and instruction-set flags (Linux), else what `platform` knows."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            lines = [line for line in f if line.startswith(("model name", "flags"))]
        return "|".join(sorted(set(line.strip() for line in lines)))
    except OSError:
        return f"{platform.machine()}|{platform.processor()}"


def load_tokenizer(path: Path, max_length: int | None):
    """A `tokenizers.Tokenizer` from tokenizer.json, padding off, truncation as asked."""
    from tokenizers import Tokenizer

    try:
        tokenizer = Tokenizer.from_file(str(path))
    except Exception as exc:  # tokenizers raises a bare Exception on a bad file
        raise ModelError(f"cannot load {path}: {exc}") from exc
    tokenizer.no_padding()
    if max_length is None:
        tokenizer.no_truncation()
    else:
        tokenizer.enable_truncation(max_length=max_length)
    return tokenizer
