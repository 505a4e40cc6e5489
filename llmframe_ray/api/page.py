"""Routes that need no key: `GET /metrics` (api/metrics.py) and the playground page at `GET /`
with its static files (api/static/: plain HTML, CSS and JavaScript, no build step; the page
loads nothing from anywhere but this app)."""

from __future__ import annotations

from pathlib import Path
from typing import Awaitable, Callable

from fastapi import FastAPI
from fastapi.responses import FileResponse, Response

from llmframe_ray.api.metrics import CONTENT_TYPE, RequestMetrics, exposition
from llmframe_ray.api.failures import NotFoundError

STATIC = Path(__file__).with_name("static")
TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8"}
PAGE_HEADERS = {
    # the page and its scripts come from this app only; the API is called on the same origin
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; connect-src 'self'",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-cache",
}


def add_metrics_and_page(app: FastAPI, scrape: Callable[[], Awaitable[bytes]] | None = None) -> None:
    """`scrape`: where /metrics comes from when not from this process's registry alone (under
    Serve: every replica's, serve/metrics_hub.py)."""

    @app.get("/metrics", include_in_schema=False)
    async def metrics() -> Response:
        body = exposition() if scrape is None else await scrape()
        return Response(body, media_type=CONTENT_TYPE)

    @app.get("/", include_in_schema=False)
    async def playground() -> FileResponse:
        return _static("index.html")

    @app.get("/static/{name}", include_in_schema=False)
    async def static(name: str) -> FileResponse:
        return _static(name)

    app.add_middleware(RequestMetrics, routes=app.router.routes)


def _static(name: str) -> FileResponse:
    path = STATIC / name
    if "/" in name or name.startswith(".") or path.suffix not in TYPES or not path.is_file():
        raise NotFoundError("not_found", f"no static file {name!r}")
    return FileResponse(path, media_type=TYPES[path.suffix], headers=PAGE_HEADERS)
