"""`llmframe-ray serve` (the Serve app on a local Ray or RAY_ADDRESS), `llmframe-ray mcp` (the
agent tools over a served app) and `llmframe-ray rerank-vectors` (a two-tower reranker's passage
vectors, ahead of serving); registered on the main command in cli.py (`register`)."""

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


def rerank_vectors_command(
    index: Path = typer.Option(..., "--index", help="Index directory (e.g. built by `ingest`); its served version's chunks are read."),
    reranker: Optional[str] = typer.Option(None, "--reranker", help="Reranker folder with two towers (default: LLMFRAME_RERANKER_MODEL)."),
) -> None:
    """Compute a two-tower reranker's vector of every chunk of the index ahead of serving, so that
    a reranker of that tower on this host (same LLMFRAME_HOME) does not encode them at its first
    requests (models/two_tower.py)."""
    import sys
    import time

    from llmframe_ray.config import load_settings
    from llmframe_ray.errors import ModelError
    from llmframe_ray.index.versions import IndexDirectory
    from llmframe_ray.models.sources import load_reranker
    from llmframe_ray.models.two_tower import TwoTowerScorer

    settings = load_settings(**({"reranker_model": reranker} if reranker else {}))
    scorer = load_reranker(settings.params().reranker_model)
    if not isinstance(scorer, TwoTowerScorer):
        raise ModelError(f"{scorer.model_dir} has no two towers (tower.json), or LLMFRAME_RERANKER_TOWERS is off: "
                         "nothing to compute ahead")
    loaded = IndexDirectory(index).load()
    passages = [chunk.indexed_text for shard in loaded.shards for chunk in shard.store]
    started = time.perf_counter()
    done = scorer.warm(passages, progress=lambda n, total: print(f"  {n}/{total} passages", file=sys.stderr, flush=True))
    typer.echo(f"{index}: {len(passages)} chunks, {done} vectors computed in {time.perf_counter() - started:.0f} s; "
               f"{len(scorer.cache)} kept in {scorer.store_path}")


def register(app: typer.Typer) -> None:
    app.command("serve")(serve_command)
    app.command("mcp")(mcp_command)
    app.command("rerank-vectors")(rerank_vectors_command)
