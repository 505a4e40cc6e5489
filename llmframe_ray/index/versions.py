"""A directory of immutable index versions, one of which is served.

    root/
      CURRENT                        the served version id, one line
      .lock                          held by the one process writing versions (see `writer_lock`)
      versions/<version_id>/
        version.json                 {"version", "shards", "empty_shards", "created_at", ...};
                                     written last
        shard-0000/ shard-0001/ ...  IndexShard directories (none for a shard left empty)

`publish` (in-process) and `stage` + `commit` (shards written by other processes, e.g. the
Ray ingestion job) write a new version under a temporary name, verify it, rename it into place,
and only then switch CURRENT atomically. A crash at any point leaves CURRENT naming the previous version,
which is untouched. A crash before the rename leaves a temporary name, ignored by `load` and
deleted by `remove_incomplete`; a crash between the rename and the CURRENT switch leaves a
complete version that is listed by `versions()` but not served (publishing again serves a newer
one; retention of old versions is the ingestion job's concern).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import secrets
import shutil
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

from llmframe_ray.errors import IndexLoadError, LLMFrameError
from llmframe_ray.index import atomic
from llmframe_ray.index.manifest import MANIFEST_NAME, utc_now
from llmframe_ray.index.memory import check_fits, version_need
from llmframe_ray.index.shard import IndexShard

VERSIONS_DIR = "versions"
CURRENT_FILE = "CURRENT"
VERSION_FILE = "version.json"
LOCK_FILE = ".lock"
BUILD_HINT = "build one with `llmframe-ray index build`"

_VERSION_ID = re.compile(r"^\d{8}T\d{12}Z-[0-9a-f]{6}$")


def new_version_id() -> str:
    """UTC time to the microsecond plus a random suffix, e.g. `20250131T120000123456Z-1a2b3c`.

    Ids sort in publication order (as long as the clock does not go back).
    """
    return f"{datetime.now(timezone.utc):%Y%m%dT%H%M%S%f}Z-{secrets.token_hex(3)}"


def shard_dir_name(index: int) -> str:
    return f"shard-{index:04d}"


class IndexBusyError(LLMFrameError):
    """Another process is writing versions of the same index directory."""


@dataclass(frozen=True)
class LoadedIndex:
    """The non-empty shards of one version, opened; `shard_ids[i]` is `shards[i]`'s number."""

    version: str
    path: Path
    shards: tuple[IndexShard, ...]
    shard_ids: tuple[int, ...] = ()
    info: Mapping[str, Any] | None = None


class IndexDirectory:
    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        if self.root.exists() and not self.root.is_dir():  # else a FileExistsError deep in a write
            raise IndexLoadError(f"{self.root} is a file, not an index folder; give a folder (new or holding an index)")

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

    def publish(self, shards: Sequence[IndexShard], *, base: str | None | object = ...) -> str:
        """Write `shards` as a new version, make it the served one, and return its id (`base`:
        see `commit`)."""
        if len(shards) == 0:
            raise ValueError("cannot publish a version with zero shards")
        version, tmp = self.stage()
        try:
            for i, shard in enumerate(shards):
                shard.save(tmp / shard_dir_name(i))
        except Exception:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return self.commit(version, tmp, len(shards), base=base)

    def stage(self) -> tuple[str, Path]:
        """A new version id and the empty temporary folder its shards are written into."""
        self.versions_dir.mkdir(parents=True, exist_ok=True)
        atomic.fsync_dir(self.root)
        version = new_version_id()
        existing = [entry.name for entry in self.versions_dir.iterdir()]
        newest = max((name for name in existing if _VERSION_ID.match(name)), default="")
        if version <= newest:
            raise RuntimeError(
                f"new version id {version} does not sort after {newest}; is the clock behind?"
            )
        tmp = atomic.temp_sibling(self.versions_dir / version)
        tmp.mkdir()
        return version, tmp

    def commit(
        self,
        version: str,
        tmp: Path,
        n_shards: int,
        info: Mapping[str, Any] | None = None,
        *,
        verify: bool = False,
        expected: set[int] | None = None,
        base: str | None | object = ...,
    ) -> str:
        """Check the staged folder `tmp` (every shard present, or listed as empty, and loadable;
        with `verify` every file's SHA-256 too; with `expected`, exactly those shard folders
        present), write version.json, rename it into place and switch CURRENT. On a failed check
        the folder is removed and nothing is published.

        `base` is the version CURRENT named when the writer started (None: nothing published
        yet); if CURRENT names another one now, some other writer published in between (the
        writer lock is advisory and may not hold across machines on shared storage), and this
        version, built from a stale base, is not published."""
        try:
            if base is not ... and self.current_version() != base:
                raise IndexBusyError(
                    f"{self.root / CURRENT_FILE} changed from {base} to {self.current_version()} while "
                    f"version {version} was being built from {base}; nothing was published: run it again"
                )
            present = [i for i in range(n_shards) if (tmp / shard_dir_name(i)).is_dir()]
            if expected is not None and set(present) != set(expected):
                raise IndexLoadError(
                    f"version {version} is incomplete: shards {sorted(set(expected) - set(present))} "
                    f"were not written (is the index directory on storage every Ray node sees?)"
                )
            if not present:
                raise IndexLoadError("cannot publish a version whose shards are all empty")
            for i in present:
                IndexShard.load(tmp / shard_dir_name(i), mmap=True, verify=verify)
            empty = [i for i in range(n_shards) if i not in present]
            record = {
                **dict(info or {}),
                "version": version,
                "shards": n_shards,
                "empty_shards": empty,
                "created_at": utc_now(),
            }
            atomic.write_json(tmp / VERSION_FILE, record)
            atomic.fsync_dir(tmp)
            os.rename(tmp, self.versions_dir / version)
        except Exception:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        atomic.fsync_dir(self.versions_dir)
        atomic.write_bytes(self.root / CURRENT_FILE, f"{version}\n".encode("ascii"))
        return version

    def version_info(self, version: str) -> dict[str, Any]:
        """The version.json of a complete version."""
        path = self.versions_dir / version / VERSION_FILE
        try:
            info = json.loads(path.read_text(encoding="utf-8"))
            int(info["shards"])
        except FileNotFoundError:
            raise IndexLoadError(
                f"version {version} in {self.root} is incomplete ({VERSION_FILE} is missing)"
            ) from None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise IndexLoadError(f"{path} is unreadable: {exc}") from None
        return info

    def load_shard(self, version: str, shard: int, *, mmap: bool = True, verify: bool = False) -> IndexShard | None:
        """Shard number `shard` of `version`; None when that version left it empty (`verify`:
        also check every file's SHA-256)."""
        if not _VERSION_ID.match(version):
            raise IndexLoadError(f"{version!r} is not a version id")
        info = self.version_info(version)
        n_shards = int(info["shards"])
        if not 0 <= shard < n_shards:
            raise IndexLoadError(f"version {version} has {n_shards} shards; there is no shard {shard}")
        if shard in set(info.get("empty_shards", [])):
            return None
        return IndexShard.load(self.versions_dir / version / shard_dir_name(shard), mmap=mmap, verify=verify)

    def check_memory(self, version: str | None, limit_mb: int | None, shards: Sequence[int] | None = None) -> None:
        """Refuse (IndexLoadError) to load `shards` of `version` (default: CURRENT, every shard)
        where the estimate of what they hold in this process is over the memory it may still use
        (index/memory.py; `limit_mb`: LLMFRAME_MEMORY_LIMIT_MB, 0: no check)."""
        version = version or self.current_version()
        if version is None or limit_mb == 0 or not _VERSION_ID.match(version):
            return  # nothing to load, or the load itself reports what is wrong
        info = self.version_info(version)
        every = list(range(int(info["shards"])))
        wanted = every if shards is None else sorted(shards)
        empty = set(info.get("empty_shards", []))
        path = self.versions_dir / version
        dirs = [path / shard_dir_name(s) for s in wanted if s not in empty]
        need = version_need(dirs, path / "graph" if wanted == every else None)
        held = "" if wanted == every else f" (shards {', '.join(map(str, wanted))})"
        check_fits(f"version {version} of {self.root}{held}", need, limit_mb)

    def describe(self, version: str) -> dict[str, Any]:
        """A version's record with every shard's manifest, as JSON-ready data (for /v1/index)."""
        info = self.version_info(version)
        empty = set(info.get("empty_shards", []))
        shards = []
        for i in range(int(info["shards"])):
            entry: dict[str, Any] = {"shard": i, "empty": i in empty}
            if i not in empty:
                path = self.versions_dir / version / shard_dir_name(i) / MANIFEST_NAME
                try:
                    entry["manifest"] = json.loads(path.read_text(encoding="utf-8"))
                except (OSError, ValueError) as exc:
                    raise IndexLoadError(f"{path} is unreadable: {exc}") from None
            shards.append(entry)
        return {"index": str(self.root), **info, "version": version, "shard_manifests": shards}

    def prune(self, keep: int, protect: Sequence[str] = ()) -> list[str]:
        """Delete complete versions older than the newest `keep`, never the served one nor
        those in `protect` (e.g. the version served until a moment ago, which readers that
        read CURRENT just before the switch may still be opening).

        Each doomed folder is first renamed to a temporary name (so a crash mid-delete leaves
        debris that `remove_incomplete` clears, never a half-deleted "complete" version).
        Files shared with newer versions through hard links stay readable there.
        """
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        current = self.current_version()
        versions = self.versions()
        spared = {current, *protect}
        doomed = [v for v in versions[: max(0, len(versions) - keep)] if v not in spared]
        for version in doomed:
            trash = atomic.temp_sibling(self.versions_dir / version)
            os.rename(self.versions_dir / version, trash)
            shutil.rmtree(trash)
        if doomed:
            atomic.fsync_dir(self.versions_dir)
        return doomed

    @contextlib.contextmanager
    def writer_lock(self) -> Iterator[None]:
        """Hold the directory's writer lock (an advisory `flock`, released if the process dies)."""
        self.root.mkdir(parents=True, exist_ok=True)
        handle = open(self.root / LOCK_FILE, "a+")
        try:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise IndexBusyError(
                    f"another process is writing {self.root} (it holds {self.root / LOCK_FILE}); "
                    "wait for it to finish"
                ) from None
            yield
        finally:
            handle.close()

    def load(
        self, version: str | None = None, *, mmap: bool = True, verify: bool = False, memory_limit_mb: int | None = 0
    ) -> LoadedIndex:
        """Open the served version (or `version`), checking every shard (see IndexShard.load);
        first, unless `memory_limit_mb` is 0 (the default here), that it fits this process's
        memory with its graph (check_memory)."""
        self.check_memory(version, memory_limit_mb)
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
        info = self.version_info(version)
        empty = set(info.get("empty_shards", []))
        ids = tuple(i for i in range(int(info["shards"])) if i not in empty)
        shards = tuple(
            IndexShard.load(path / shard_dir_name(i), mmap=mmap, verify=verify) for i in ids
        )
        return LoadedIndex(version=version, path=path, shards=shards, shard_ids=ids, info=info)

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
