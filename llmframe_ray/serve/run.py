"""`llmframe-ray serve`: the app on a local Ray (or RAY_ADDRESS) until SIGINT / SIGTERM."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Callable

from ray import serve

from llmframe_ray.batch.session import ray_session
from llmframe_ray.serve.app import AppArgs, build_app


def serve_until_stopped(
    index: Path, host: str, port: int, reranker: bool | None, local_cpus: int, say: Callable[[str], None]
) -> None:
    application = build_app(AppArgs(index_dir=str(index), reranker=reranker))
    stop: list[int] = []
    with ray_session(local_cpus):
        for sig in (signal.SIGINT, signal.SIGTERM):  # after ray.init, which installs its own
            signal.signal(sig, lambda number, frame: stop.append(number))
        serve.start(http_options={"host": host, "port": port})
        serve.run(application, name="llmframe", route_prefix="/")
        url = f"http://{host}:{port}"
        say(f"serving {index} at {url} (OpenAPI docs: {url}/docs); try:")
        say(
            f'  curl -s {url}/v1/search -H "X-API-Key: $API_SECRET_KEY" '
            """-H 'Content-Type: application/json' -d '{"query": "your question", "top_k": 5}'"""
        )
        while not stop:
            signal.pause()
        serve.shutdown()
