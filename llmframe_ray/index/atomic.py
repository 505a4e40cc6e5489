"""Small file-system helpers for crash-safe writes.

A file is written under a temporary name in its final directory, flushed and fsynced, then moved
over the final name with `os.replace` and the directory is fsynced, so that a reader sees either
the old file or the complete new one. Temporary names start with a dot and contain `.tmp-`, which
is how `is_temp_name` recognises the debris a crash leaves behind.
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path
from typing import Any, Callable

import numpy as np

TEMP_MARK = ".tmp-"


def temp_sibling(path: str | Path) -> Path:
    """A fresh, unused temporary name next to `path` (same directory, so renames are atomic)."""
    path = Path(path)
    return path.with_name(f".{path.name}{TEMP_MARK}{secrets.token_hex(6)}")


def is_temp_name(name: str) -> bool:
    """Whether a file or directory name was made by `temp_sibling`."""
    return name.startswith(".") and TEMP_MARK in name


def fsync_file(path: str | Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: str | Path) -> None:
    """Make the directory's entries (creations, renames) durable."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: str | Path) -> None:
    """Fsync every file and directory under `root`, deepest first, then `root` itself."""
    for dirpath, _dirnames, filenames in os.walk(root, topdown=False):
        for name in filenames:
            fsync_file(os.path.join(dirpath, name))
        fsync_dir(dirpath)


def write_via(path: str | Path, write: Callable[[Path], None]) -> None:
    """Atomically create or replace `path` with what `write(temp_path)` writes to `temp_path`.

    The temporary file is removed when `write` (or anything after it) raises.
    """
    path = Path(path)
    tmp = temp_sibling(path)
    try:
        write(tmp)
        fsync_file(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def write_bytes(path: str | Path, data: bytes) -> None:
    write_via(path, lambda tmp: tmp.write_bytes(data))


def write_json(path: str | Path, obj: Any) -> None:
    """Write `obj` as indented UTF-8 JSON (non-ASCII kept as is) with a final newline."""
    text = json.dumps(obj, ensure_ascii=False, indent=2, sort_keys=True) + "\n"
    write_bytes(path, text.encode("utf-8"))


def write_array(path: str | Path, array: np.ndarray) -> None:
    """Write `array` in .npy format (no pickles) under exactly the name `path`."""

    def _save(tmp: Path) -> None:
        with open(tmp, "wb") as f:
            np.save(f, np.ascontiguousarray(array), allow_pickle=False)

    write_via(path, _save)
