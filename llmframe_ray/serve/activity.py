"""Searches in flight on this machine, counted across processes, so that a replica can tell
when its search is the only one running.

Replicas are sized for load: with one model thread per replica, two replicas keep two cores
busy. A search that arrives while every other replica is idle would leave a core unused; the
Retriever then runs its query through a session with more threads (models/embedder.py: solo
threads). To know that the others are idle, every Retriever process on the machine keeps its
count of searches in flight in its own slot of one small shared file (a table of (pid, count)
pairs in memory-mapped shared memory, one writer per slot). Reading the table is a sum of 256
integers; nothing is locked on the request path.

A process that dies while it has searches in flight leaves its count behind; the table is swept
(slots of processes that no longer exist are freed) when a slot is claimed and at most every
`SWEEP_INTERVAL_S` while a count from elsewhere is seen. Until then a stale count only makes
searches use their replica's own threads, never wrong answers.
"""

from __future__ import annotations

import fcntl
import logging
import mmap
import os
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import numpy as np

logger = logging.getLogger(__name__)

SLOTS = 256
SWEEP_INTERVAL_S = 5.0
FILE_NAME = "llmframe-ray-searches-{uid}"


def default_path() -> Path:
    """Shared memory where the system has it (/dev/shm), else the temporary folder; one file
    per user and machine (a container counts as a machine: it has its own /dev/shm)."""
    shm = Path("/dev/shm")
    folder = shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())
    return folder / FILE_NAME.format(uid=os.getuid() if hasattr(os, "getuid") else 0)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


class MachineSearches:
    """This process's slot in the machine's table of searches in flight.

    `enter()` / `leave()` around a search (from one thread: the replica's event loop);
    `alone()`: whether no other process on the machine has a search in flight and this one
    has at most one. When the table cannot be opened (no shared folder, a full table) `alone()`
    is always False and a warning says why."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = Path(path) if path is not None else default_path()
        self.pid = os.getpid()
        self._table: np.ndarray | None = None
        self._slot = -1
        self._next_sweep = 0.0
        try:
            self._open()
        except OSError as exc:
            logger.warning("searches are not counted across processes (%s): each uses its replica's threads", exc)

    def _open(self) -> None:
        size = SLOTS * 2 * 8
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            with _locked(fd):
                if os.fstat(fd).st_size < size:
                    os.ftruncate(fd, size)
                self._map = mmap.mmap(fd, size)
                table = np.frombuffer(self._map, dtype=np.int64).reshape(SLOTS, 2)
                self._sweep(table)
                free = np.flatnonzero((table[:, 0] == 0) | (table[:, 0] == self.pid))
                if not len(free):
                    raise OSError(f"{self.path} has no free slot ({SLOTS} processes count searches)")
                self._slot = int(free[0])
                table[self._slot] = (self.pid, 0)
        finally:
            os.close(fd)  # the mapping stays valid
        self._table = table

    @staticmethod
    def _sweep(table: np.ndarray) -> None:
        for slot in np.flatnonzero(table[:, 0]):
            if not _alive(int(table[slot, 0])):
                table[slot] = (0, 0)

    def enter(self) -> None:
        if self._table is not None:
            self._table[self._slot, 1] += 1

    def leave(self) -> None:
        if self._table is not None:
            self._table[self._slot, 1] -= 1

    def in_flight(self) -> int:
        """Searches in flight on the machine (every process's count)."""
        return int(self._table[:, 1].sum()) if self._table is not None else 0

    def alone(self) -> bool:
        table = self._table
        if table is None:
            return False
        own = int(table[self._slot, 1])
        others = int(table[:, 1].sum()) - own
        if others and time.monotonic() >= self._next_sweep:  # a count left by a dead process?
            self._next_sweep = time.monotonic() + SWEEP_INTERVAL_S
            self._sweep_others(table)
            others = int(table[:, 1].sum()) - own
        return own <= 1 and others == 0

    def _sweep_others(self, table: np.ndarray) -> None:
        for slot in np.flatnonzero(table[:, 1]):
            pid = int(table[slot, 0])
            if slot != self._slot and (pid == 0 or not _alive(pid)):
                table[slot] = (0, 0)

    def close(self) -> None:
        """Free the slot (a replica that stops; a dead one's slot is freed by the next sweep)."""
        if self._table is not None:
            self._table[self._slot] = (0, 0)
            self._table = None


@contextmanager
def _locked(fd: int) -> Iterator[None]:
    """An exclusive flock on an open file, for claiming slots."""
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
