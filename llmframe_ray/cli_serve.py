"""`llmframe-ray serve` (the Serve app on a local Ray or RAY_ADDRESS) and `llmframe-ray mcp` (the
agent tools over a served app); registered on the main command in cli.py."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer


def serve_command(
    index: Path = typer.Option(..., "--index", help="Index directory; its CURRENT version is served, and newer ones as they are published."),
    host: str = typer.Option("127.0.0.1", "--host"),
    port: int = typer.Option(8000, "--port", min=1, max=65535),
    reranker: Optional[bool] = typer.Option(None, "--reranker/--no-reranker", help="Deploy the cross-encoder (default: RERANKER_ENABLED)."),
    layout: str = typer.Option(
        "local", "--layout",
        help="local: retrieval inside each Ingress replica, one per core (fastest on one machine); "
        "dag: QueryEncoder, Retriever and one ShardGroup per shard as their own replicas.",
    ),
) -> None:
    """Serve an index over HTTP with Ray Serve (the app of `serve run deployments/local.yaml`).

    Uses RAY_ADDRESS when set, else starts a local Ray with this machine's CPUs; runs until
    interrupted (Ctrl-C or SIGTERM), then shuts the app down.
    """
    from llmframe_ray.cli import _fail, _settings
    from llmframe_ray.serve.app import AppArgs, local_layout
    from llmframe_ray.serve.run import PortInUseError, serve_until_stopped

    cpus = _settings().threads
    if layout == "local":
        args = local_layout(str(index), cpus, reranker=reranker)
    elif layout == "dag":
        args = AppArgs(index_dir=str(index), reranker=reranker, shards_per_group=1)
    else:
        raise typer.BadParameter(f"unknown layout {layout!r}; valid layouts: local, dag", param_hint="--layout")
    try:
        serve_until_stopped(args, host, port, cpus, typer.echo)
    except PortInUseError as exc:
        _fail(str(exc), code=1)


def mcp_command(
    url: str = typer.Option(..., "--url", help="The served app's base URL, e.g. http://127.0.0.1:8000 (API key: $API_SECRET_KEY)."),
    http: Optional[int] = typer.Option(None, "--http", min=1, max=65535, help="Serve streamable HTTP on this port (path /mcp) instead of stdio."),
    host: str = typer.Option("127.0.0.1", "--host", help="The address --http listens on."),
) -> None:
    """MCP server with the retrieve_context and answer tools, against a served app."""
    from llmframe_ray.tools.mcp_server import run

    run(url, None, http, host)
