"""`llmframe-ray serve` stops the HAProxy processes that Ray's shutdown leaves behind."""

from __future__ import annotations

import shutil
import signal
import subprocess
import time

import psutil

from llmframe_ray.serve.run import haproxy_descendants, stop_leftovers


def test_haproxy_below_this_process_is_found_and_stopped(tmp_path):
    fake = tmp_path / "haproxy"  # a program named like HAProxy, as Serve's proxy starts it
    shutil.copy(shutil.which("sleep"), fake)
    other = subprocess.Popen([shutil.which("sleep"), "60"])
    proxy = subprocess.Popen([str(fake), "60"])
    try:
        found = haproxy_descendants()
        assert [p.pid for p in found] == [proxy.pid]
        stop_leftovers(found, timeout_s=5)
        assert found[0].returncode == -signal.SIGTERM  # SIGTERM first (psutil reaps it)
        assert other.poll() is None  # nothing else is touched
        stop_leftovers(found)  # already gone: nothing to do, no error
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
