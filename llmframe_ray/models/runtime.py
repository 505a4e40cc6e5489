"""ONNX Runtime pieces shared by the embedder and the cross-encoder."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from llmframe_ray.errors import ModelError


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


def create_session(model_path: Path, threads: int, spinning: bool = True):
    """An ONNX Runtime CPU session using `threads` intra-op threads (one inter-op thread).

    `spinning`: whether idle pool threads spin-wait between runs (ONNX Runtime's default; only a
    session with 2 or more threads has a pool). Measured on 2 cores: one query through 2 threads
    takes 4.2 ms spinning, 5.5 ms not; but Serve replicas sharing the cores with 2 spinning
    threads each served half the requests of replicas with one thread each (README "Serving
    benchmark"): LLMFRAME_ORT_SPINNING=false where multi-threaded sessions share cores."""
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
    try:
        return ort.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime raises its own exception types
        raise ModelError(f"cannot load {model_path}: {exc}") from exc


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
