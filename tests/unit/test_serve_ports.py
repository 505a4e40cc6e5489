"""`llmframe-ray serve` refuses a port that is taken, before it starts Ray, and says who holds it."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import psutil
import pytest

from llmframe_ray.serve.run import PortInUseError, check_ports
from tests.conftest import cli_env


@pytest.fixture
def listener():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    yield sock.getsockname()[1]
    sock.close()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_taken_port_is_named_with_its_listener(listener):
    me = f"pid {os.getpid()} ({psutil.Process().name()})"
    with pytest.raises(PortInUseError) as caught:
        check_ports("127.0.0.1", listener, haproxy=False)
    assert str(caught.value) == (
        f"--port {listener} (127.0.0.1:{listener}) is in use, by {me}: stop what holds it, or serve on another --port"
    )


def test_free_ports_pass():
    check_ports("127.0.0.1", free_port(), haproxy=False)


def test_haproxy_ports_are_checked_only_when_haproxy_serves(listener, monkeypatch):
    monkeypatch.setenv("RAY_SERVE_HAPROXY_STATS_PORT", str(listener))  # bound on 127.0.0.1: 0.0.0.0 collides
    monkeypatch.setenv("RAY_SERVE_HAPROXY_METRICS_PORT", str(free_port()))
    port = free_port()
    check_ports("127.0.0.1", port, haproxy=False)
    with pytest.raises(PortInUseError) as caught:
        check_ports("127.0.0.1", port, haproxy=True)
    message = str(caught.value)
    assert message.startswith(f"HAProxy's stats port (0.0.0.0:{listener}) is in use, by pid {os.getpid()} ")
    assert message.endswith("(RAY_SERVE_ENABLE_HA_PROXY=0 serves without HAProxy and its two ports)")
    assert "metrics port" not in message and "--port" not in message.split(": stop")[0]  # only the taken one


def test_the_command_exits_1_with_the_message_and_starts_no_ray(listener, tmp_path, model_dir):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.txt").write_text("Reciprocal rank fusion merges ranked lists.\n")
    env = cli_env(tmp_path / "home", model_dir, API_SECRET_KEY="k", LLMFRAME_NUM_THREADS="1")

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "llmframe_ray.cli", *args], env=env, capture_output=True, text=True, timeout=120)

    index = str(tmp_path / "index")
    assert cli("index", "build", str(tmp_path / "docs"), "--index", index).returncode == 0
    done = cli("serve", "--index", index, "--port", str(listener))
    assert done.returncode == 1, done.stderr[-2000:]
    assert f"error: --port {listener} (127.0.0.1:{listener}) is in use, by pid {os.getpid()} " in done.stderr
    assert "Traceback" not in done.stderr and "Started a local Ray" not in done.stderr + done.stdout
