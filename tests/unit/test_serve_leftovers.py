"""`llmframe-ray serve` stops the HAProxy processes that Ray's shutdown leaves behind."""

from __future__ import annotations

import shutil
import signal
import subprocess
import time

import psutil

from llmframe_ray.serve.run import haproxy_configs, haproxy_descendants, haproxy_serving, stop_leftovers


def test_haproxy_below_this_process_is_found_and_stopped(tmp_path):
    fake = tmp_path / "haproxy"  # a program named like HAProxy, as Serve's proxy starts it
    shutil.copy(shutil.which("sleep"), fake)
    other = subprocess.Popen([shutil.which("sleep"), "60"])
    proxy = subprocess.Popen([str(fake), "60"])
    try:
        found = haproxy_descendants()
        assert [p.pid for p in found] == [proxy.pid]
        assert stop_leftovers(found, timeout_s=5) == [proxy.pid]
        assert found[0].returncode == -signal.SIGTERM  # SIGTERM first (psutil reaps it)
        assert other.poll() is None  # nothing else is touched
        assert stop_leftovers(found) == []  # already gone: nothing to do, no error
    finally:
        for process in (other, proxy):
            if process.poll() is None:
                process.kill()
                process.wait()


def test_one_that_ignores_sigterm_is_killed(tmp_path):
    fake = tmp_path / "haproxy-stuck"
    ready = tmp_path / "ready"
    fake.write_text(f"#!/bin/sh\ntrap '' TERM\ntouch {ready}\nwhile :; do sleep 0.1; done\n")
    fake.chmod(0o755)
    stuck = subprocess.Popen([str(fake)])
    try:
        while not ready.exists():  # SIGTERM is ignored from here on
            time.sleep(0.01)
        proc = psutil.Process(stuck.pid)
        stop_leftovers([proc], timeout_s=0.5)
        assert proc.returncode == -signal.SIGKILL
    finally:
        if stuck.poll() is None:
            stuck.kill()
            stuck.wait()


def _orphan(program, *args) -> psutil.Process:
    """Start `program args` as a child of init, not of this process (its shell exits at once)."""
    quoted = " ".join(f"'{a}'" for a in (program, *args))
    shell = subprocess.run(["sh", "-c", f"{quoted} >/dev/null 2>&1 & echo $!"], capture_output=True, text=True, check=True)
    return psutil.Process(int(shell.stdout))


def test_an_orphaned_haproxy_is_found_by_its_configuration_file(tmp_path):
    fake = tmp_path / "haproxy"  # follows its "configuration" forever, as HAProxy -db runs
    shutil.copy(shutil.which("tail"), fake)
    ours, theirs = tmp_path / "ours.cfg", tmp_path / "theirs.cfg"
    ours.write_text("global\n")
    theirs.write_text("global\n")
    mine = subprocess.Popen([str(fake), "-f", str(ours)])
    orphan = _orphan(fake, "-f", ours)
    other = _orphan(fake, "-f", theirs)
    try:
        below = haproxy_descendants()
        assert [p.pid for p in below] == [mine.pid]  # the orphan is no longer below this process
        configs = haproxy_configs(below)
        assert configs == {str(ours)}
        found = haproxy_serving(configs, exclude=below)
        assert [p.pid for p in found] == [orphan.pid]  # not `mine` (excluded), not another server's
        assert haproxy_serving(set()) == []
        assert sorted(stop_leftovers(below + found, timeout_s=5)) == sorted([mine.pid, orphan.pid])
        assert not orphan.is_running() and mine.poll() is not None
        assert other.is_running()
    finally:
        for proc in (orphan, other):
            if proc.is_running():
                proc.kill()
        if mine.poll() is None:
            mine.kill()
            mine.wait()
