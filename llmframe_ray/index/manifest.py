"""The manifest of an index shard: format version, model, parameters, counts and file checksums.

`manifest.json` is written last when a shard is saved, so a shard directory without one is
incomplete. Its `files` entry lists every other file of the shard with its size and SHA-256.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping

from llmframe_ray.errors import IndexLoadError
from llmframe_ray.index import atomic

FORMAT_VERSION = 1
SUPPORTED_VERSIONS = (FORMAT_VERSION,)
MANIFEST_NAME = "manifest.json"

_REQUIRED_KEYS = (
    "format_version",
    "created_at",
    "model",
    "parameters",
    "counts",
    "max_chunks_per_doc",
    "files",
)


def _freeze(value: Any) -> Any:
    """Read-only copy of a JSON-like value: dicts become mapping proxies, lists become tuples."""
    if isinstance(value, Mapping):
        return MappingProxyType({str(k): _freeze(v) for k, v in value.items()})
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    return value


def thaw(value: Any) -> Any:
    """Plain JSON-serialisable copy of a value made by `_freeze`."""
    if isinstance(value, Mapping):
        return {k: thaw(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [thaw(v) for v in value]
    return value


def utc_now() -> str:
    """The current time as an ISO 8601 UTC string, e.g. `2025-01-31T12:00:00+00:00`."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def describe_file(path: str | Path) -> dict[str, Any]:
    """`{"bytes": size, "sha256": hex digest}` of one file, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
            size += len(block)
    return {"bytes": size, "sha256": digest.hexdigest()}


@dataclass(frozen=True)
class Manifest:
    """What a shard holds and how it was built. Nested values are read-only mappings/tuples."""

    model: Mapping[str, Any]
    parameters: Mapping[str, Any]
    counts: Mapping[str, Any]
    max_chunks_per_doc: int
    files: Mapping[str, Any] = field(default_factory=dict)
    created_at: str = field(default_factory=utc_now)
    format_version: int = FORMAT_VERSION

    def __post_init__(self) -> None:
        for name in ("model", "parameters", "counts", "files"):
            object.__setattr__(self, name, _freeze(getattr(self, name)))

    def to_dict(self) -> dict[str, Any]:
        return {name: thaw(getattr(self, name)) for name in _REQUIRED_KEYS}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), ensure_ascii=False, indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str, source: str = "<string>") -> Manifest:
        """Parse a manifest; raise IndexLoadError naming `source` when it is not a valid one."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise IndexLoadError(f"{source}: manifest is not valid JSON ({exc})") from None
        if not isinstance(data, dict):
            raise IndexLoadError(f"{source}: manifest must be a JSON object")
        version = data.get("format_version")
        if version not in SUPPORTED_VERSIONS:
            supported = ", ".join(str(v) for v in SUPPORTED_VERSIONS)
            raise IndexLoadError(
                f"{source}: unsupported index format version {version!r}; "
                f"this release reads version {supported}"
            )
        missing = [key for key in _REQUIRED_KEYS if key not in data]
        if missing:
            raise IndexLoadError(f"{source}: manifest is missing keys: {', '.join(missing)}")
        for key in ("model", "parameters", "counts", "files"):
            if not isinstance(data[key], dict):
                raise IndexLoadError(f"{source}: manifest key {key!r} must be an object")
        return cls(**{key: data[key] for key in _REQUIRED_KEYS})

    def save(self, path: str | Path) -> None:
        atomic.write_bytes(path, self.to_json().encode("utf-8"))

    @classmethod
    def load(cls, path: str | Path) -> Manifest:
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise IndexLoadError(f"{path}: manifest file is missing") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise IndexLoadError(f"{path}: cannot read manifest ({exc})") from None
        return cls.from_json(text, source=str(path))
