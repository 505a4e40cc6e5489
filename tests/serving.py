"""Start the Serve app for a test: a fresh local Ray (2 CPUs), the app on a free port."""

from __future__ import annotations

import contextlib
import socket
from pathlib import Path
from typing import Any, Iterator


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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

