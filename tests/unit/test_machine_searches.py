"""The machine-wide count of searches in flight (serve/activity.py): what a replica reads to
decide that its query has the machine to itself."""

import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from llmframe_ray.serve import activity
from llmframe_ray.serve.activity import SLOTS, MachineSearches

# A second process holding `n` searches in flight until its stdin closes.
HOLDER = textwrap.dedent(
    """
    import sys
    from llmframe_ray.serve.activity import MachineSearches
    searches = MachineSearches(sys.argv[1])
    for _ in range(int(sys.argv[2])):
        searches.enter()
    print("holding", flush=True)
    sys.stdin.read()
    for _ in range(int(sys.argv[2])):
        searches.leave()
    print("left", flush=True)
    """
)


def holder(path, n):
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(path), str(n)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout.readline().strip() == "holding"
    return proc


def table(path):
    return np.fromfile(path, dtype=np.int64).reshape(SLOTS, 2)


def test_alone_until_another_process_has_a_search_in_flight(tmp_path):
    path = tmp_path / "searches"
    mine = MachineSearches(path)
    mine.enter()
    assert mine.alone() and mine.in_flight() == 1
    other = holder(path, 2)
    try:
        assert not mine.alone()
        assert mine.in_flight() == 3
        rows = table(path)
        assert sorted(rows[rows[:, 0] != 0].tolist()) == sorted([[os.getpid(), 1], [other.pid, 2]])
    finally:
        other.stdin.close()
        assert other.stdout.readline().strip() == "left"
        other.wait(timeout=30)
    assert mine.alone() and mine.in_flight() == 1
    mine.leave()
    assert mine.in_flight() == 0


def test_two_searches_in_this_process_are_not_alone(tmp_path):
    mine = MachineSearches(tmp_path / "searches")
    mine.enter()
    mine.enter()
    assert not mine.alone()
    mine.leave()
    assert mine.alone()


def test_a_dead_process_count_is_swept(tmp_path, monkeypatch):
    path = tmp_path / "searches"
    mine = MachineSearches(path)
    mine.enter()
    other = holder(path, 1)
    other.send_signal(signal.SIGKILL)  # dies with its search in flight
    other.wait(timeout=30)
    monkeypatch.setattr(mine, "_next_sweep", float("inf"))
    assert not mine.alone()  # its count stays until the next sweep
    monkeypatch.setattr(mine, "_next_sweep", 0.0)
    assert mine.alone()
    assert other.pid not in table(path)[:, 0]


def test_a_dead_process_slot_is_reused_when_a_slot_is_claimed(tmp_path):
    path = tmp_path / "searches"
    other = holder(path, 1)
    other.send_signal(signal.SIGKILL)
    other.wait(timeout=30)
    mine = MachineSearches(path)
    rows = table(path)
    assert rows[rows[:, 0] != 0].tolist() == [[os.getpid(), 0]]
    assert mine.alone() is True  # alone with no search either: own count 0


def test_a_full_table_turns_counting_off_with_a_warning(tmp_path, caplog):
    path = tmp_path / "searches"
    full = np.zeros((SLOTS, 2), dtype=np.int64)
    full[:, 0] = os.getppid()  # a live process, not this one
    full.tofile(path)
    mine = MachineSearches(path)
    assert f"{path} has no free slot ({SLOTS} processes count searches)" in caplog.text
    mine.enter()
    assert not mine.alone() and mine.in_flight() == 0


def test_a_folder_that_cannot_be_written_turns_counting_off(tmp_path, caplog):
    mine = MachineSearches(tmp_path / "missing" / "searches")
    assert "searches are not counted across processes" in caplog.text
    mine.enter()
    mine.leave()
    assert not mine.alone()


def test_close_frees_the_slot(tmp_path):
    path = tmp_path / "searches"
    mine = MachineSearches(path)
    mine.enter()
    mine.close()
    assert not table(path).any()
    assert not mine.alone()


def test_default_path_is_per_user_in_shared_memory():
    path = activity.default_path()
    assert path.name == f"llmframe-ray-searches-{os.getuid()}"
    if os.access("/dev/shm", os.W_OK):
        assert str(path.parent) == "/dev/shm"


@pytest.mark.parametrize("n", [1, 3])
def test_leave_undoes_enter(tmp_path, n):
    mine = MachineSearches(tmp_path / "searches")
    for _ in range(n):
        mine.enter()
    for _ in range(n):
        mine.leave()
    assert mine.in_flight() == 0 and mine.alone()
