"""Start the Serve app for a test: a fresh local Ray (2 CPUs), the app on a free port."""

from __future__ import annotations

import contextlib
import random
import socket
import subprocess
import time
from pathlib import Path
from typing import Any, Iterator


def free_port() -> int:
    """A port free now, on every interface, and outside both the range the OS hands out to
    sockets that ask for any port and Ray's worker ports: a port the OS had picked could be
    given to one of Ray's own listeners before the app or HAProxy binds it (seen once:
    "cannot bind socket (Address already in use)" for HAProxy's stats port)."""
    low, high = _ephemeral_ports()
    # from 20000 up: Ray's worker processes take 10002-19999 (its default min/max_worker_port)
    candidates = [p for p in range(20000, 65536) if not low <= p <= high]
    for port in random.sample(candidates, min(200, len(candidates))):
        with socket.socket() as s:
            try:
                s.bind(("0.0.0.0", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port outside the ephemeral and Ray worker ranges")


def session_leftovers(session: int, wait_s: float = 30.0) -> list[str]:
    """`ps` lines of the processes still running in session `session` (a command started with
    start_new_session=True), after up to `wait_s` for them to exit (Ray's take some seconds
    after the command's own process); zombies do not count."""
    deadline = time.monotonic() + wait_s
    while True:
        listing = subprocess.run(["ps", "-o", "pid=,stat=,cmd=", "-s", str(session)], capture_output=True, text=True).stdout
        left = [line for line in listing.splitlines() if "Z" not in line.split()[1]]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(1)


def _ephemeral_ports() -> tuple[int, int]:
    try:
        low, high = (int(x) for x in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        low, high = 32768, 60999  # Linux's default
    return low, high


def running_replicas(deployment: str, app: str = "llmframe") -> int:
    """Replicas of `deployment` that Serve reports RUNNING."""
    from ray import serve

    status = serve.status().applications[app].deployments[deployment]
    return sum(n for state, n in status.replica_states.items() if str(getattr(state, "value", state)) == "RUNNING")


@contextlib.contextmanager
def uvicorn_in_thread(app: Any, wait_s: float = 30.0) -> Iterator[str]:
    """An ASGI app served by uvicorn on a free localhost port in a daemon thread (no Ray): its
    base URL until the block ends, then the server is stopped."""
    import threading
    import time

    import uvicorn

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + wait_s
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@contextlib.contextmanager
def running_app(
    index_dir: Path, overrides: dict[str, Any], *, reranker: bool = False, local: bool = False, **fields: Any
) -> Iterator[str]:
    """The app's base URL while it runs; Serve and Ray are shut down afterwards. `local`: the
    layout of `llmframe-ray serve` (retrieval inside the Ingress replicas, one per CPU), else the
    DAG of deployments; `fields`: more AppArgs fields (e.g. shards_per_group)."""
    import ray
    from ray import serve

    from llmframe_ray.serve.app import AppArgs, build_app, local_layout

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        port = free_port()
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        if local:
            args = local_layout(str(index_dir), 2, reranker=reranker, settings=overrides, **fields)
        else:
            args = AppArgs(index_dir=str(index_dir), reranker=reranker, settings=overrides, **fields)
        serve.run(build_app(args), name="llmframe", route_prefix="/")
        yield f"http://127.0.0.1:{port}"
    finally:
        serve.shutdown()
        ray.shutdown()

