"""A directory of immutable index versions, one of which is served.

    root/
      CURRENT                        the served version id, one line
      versions/<version_id>/
        version.json                 {"version", "shards", "created_at"}; written last
        shard-0000/ shard-0001/ ...  IndexShard directories

`publish` writes a new version under a temporary name, renames it into place, and only then
switches CURRENT atomically. A crash at any point leaves CURRENT naming the previous version,
which is untouched. A crash before the rename leaves a temporary name, ignored by `load` and
deleted by `remove_incomplete`; a crash between the rename and the CURRENT switch leaves a
complete version that is listed by `versions()` but not served (publishing again serves a newer
one; retention of old versions is the ingestion job's concern).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Sequence

from llmframe_ray.errors import IndexLoadError
from llmframe_ray.index import atomic
from llmframe_ray.index.manifest import utc_now
from llmframe_ray.index.shard import IndexShard

VERSIONS_DIR = "versions"
CURRENT_FILE = "CURRENT"
VERSION_FILE = "version.json"
BUILD_HINT = "build one with `llmframe-ray index build`"

_VERSION_ID = re.compile(r"^\d{8}T\d{12}Z-[0-9a-f]{6}$")


def new_version_id() -> str:
    """UTC time to the microsecond plus a random suffix, e.g. `20250131T120000123456Z-1a2b3c`.

    Ids sort in publication order (as long as the clock does not go back).
    """
    return f"{datetime.now(timezone.utc):%Y%m%dT%H%M%S%f}Z-{secrets.token_hex(3)}"


def shard_dir_name(index: int) -> str:
    return f"shard-{index:04d}"


@dataclass(frozen=True)
class LoadedIndex:
    """The shards of one version, opened."""

    version: str
    path: Path
    shards: tuple[IndexShard, ...]


class IndexDirectory:
    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    @property
    def versions_dir(self) -> Path:
        return self.root / VERSIONS_DIR

    def versions(self) -> list[str]:
        """Complete versions, oldest first (published ones that are not served included)."""
        if not self.versions_dir.is_dir():
            return []
        return sorted(
            entry.name
            for entry in self.versions_dir.iterdir()
            if _VERSION_ID.match(entry.name) and (entry / VERSION_FILE).is_file()
        )

    def current_version(self) -> str | None:
        """The id CURRENT names, or None when nothing was published yet."""
        path = self.root / CURRENT_FILE
        try:
            text = path.read_text(encoding="utf-8").strip()
        except FileNotFoundError:
            return None
        if not _VERSION_ID.match(text):
            raise IndexLoadError(f"{path} does not name a version: {text!r}")
        return text

    def publish(self, shards: Sequence[IndexShard]) -> str:
        """Write `shards` as a new version, make it the served one, and return its id."""
        if len(shards) == 0:
            raise ValueError("cannot publish a version with zero shards")
        self.versions_dir.mkdir(parents=True, exist_ok=True)
        atomic.fsync_dir(self.root)
        version = new_version_id()
        existing = [entry.name for entry in self.versions_dir.iterdir()]
        newest = max((name for name in existing if _VERSION_ID.match(name)), default="")
        if version <= newest:
            raise RuntimeError(
                f"new version id {version} does not sort after {newest}; is the clock behind?"
            )
        final = self.versions_dir / version
        tmp = atomic.temp_sibling(final)
        tmp.mkdir()
        try:
            for i, shard in enumerate(shards):
                shard.save(tmp / shard_dir_name(i))
            info = {"version": version, "shards": len(shards), "created_at": utc_now()}
            atomic.write_json(tmp / VERSION_FILE, info)
            atomic.fsync_dir(tmp)
            os.rename(tmp, final)
        except Exception:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        atomic.fsync_dir(self.versions_dir)
        atomic.write_bytes(self.root / CURRENT_FILE, f"{version}\n".encode("ascii"))
        return version

    def load(
        self, version: str | None = None, *, mmap: bool = True, verify: bool = False
    ) -> LoadedIndex:
        """Open the served version (or `version`), checking every shard (see IndexShard.load)."""
        if not self.root.is_dir():
            raise IndexLoadError(f"index directory {self.root} does not exist; {BUILD_HINT}")
        named_by = f"version {version!r}"
        if version is None:
            version = self.current_version()
            if version is None:
                raise IndexLoadError(f"no published version in {self.root}; {BUILD_HINT}")
            named_by = f"{self.root / CURRENT_FILE} names version {version}, which"
        path = self.versions_dir / version
        if not _VERSION_ID.match(version) or not path.is_dir():
            raise IndexLoadError(f"{named_by} does not exist in {self.versions_dir}")
        try:
            info = json.loads((path / VERSION_FILE).read_text(encoding="utf-8"))
            n_shards = int(info["shards"])
        except FileNotFoundError:
            raise IndexLoadError(
                f"version {version} in {self.root} is incomplete ({VERSION_FILE} is missing)"
            ) from None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise IndexLoadError(f"{path / VERSION_FILE} is unreadable: {exc}") from None
        shards = tuple(
            IndexShard.load(path / shard_dir_name(i), mmap=mmap, verify=verify)
            for i in range(n_shards)
        )
        return LoadedIndex(version=version, path=path, shards=shards)

    def remove_incomplete(self) -> list[Path]:
        """Delete what interrupted publishes left behind; return the removed paths.

        Only call this while no publish to the same root is running: an unfinished version
        cannot be told apart from one being written.
        """
        removed = []
        for directory in (self.root, self.versions_dir):
            if not directory.is_dir():
                continue
            for entry in sorted(directory.iterdir()):
                if not atomic.is_temp_name(entry.name):
                    continue
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry)
                else:
                    entry.unlink()
                removed.append(entry)
        return removed
