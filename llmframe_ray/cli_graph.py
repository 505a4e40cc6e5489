"""`llmframe-ray graph ...`: the knowledge graph of an index version (graph/)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer


def fail(message: str) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


graph_app = typer.Typer(no_args_is_help=True, help="The knowledge graph of an index version (GraphRAG).")


@graph_app.command("build")
def graph_build(
    index: Path = typer.Option(..., "--index", help="Index directory."),
    version: Optional[str] = typer.Option(None, "--version", help="Index version (default: the served one)."),
    rebuild: bool = typer.Option(False, "--rebuild", help="Build it again even if the version has one."),
    extractor: str = typer.Option("offline", "--extractor", help="offline (no key) or llm (the provider chain reads the chunks and writes the community summaries; answers cached)."),
) -> None:
    """Build the knowledge graph of an index version and store it in the version."""
    from llmframe_ray.config import load_settings
    from llmframe_ray.graph.build import ensure_graph, llm_extractor, llm_summarizer

    if extractor not in ("offline", "llm"):
        fail(f"--extractor must be offline or llm, got {extractor!r}")
    from llmframe_ray.models.embedder import load_embedder

    llm = summarizer = None
    params = load_settings().params()
    try:
        if extractor == "llm":
            llm, summarizer = llm_extractor(index, params), llm_summarizer(index, params)
    except ValueError as exc:
        fail(str(exc))
    embed = load_embedder(params.embedder).embed
    folder, graph, built = ensure_graph(index, version, rebuild=rebuild, llm=llm, summarizer=summarizer, embed=embed)
    info = graph.info
    for part, what, fallback in (("llm", "llm extraction", "read offline"), ("llm_summaries", "llm community summaries", "extractive summary kept")):
        if part in info:
            typer.echo(f"{what}: " + ", ".join(f"{k} {v}" for k, v in info[part].items() if k != "problems"))
            for problem in info[part]["problems"]:
                typer.echo(f"  {fallback}: {problem}", err=True)
    typer.echo(f"{'built' if built else 'already built'}: {folder}")
    typer.echo("sizes: " + ", ".join(f"{k} {v}" for k, v in graph.sizes().items()))
    typer.echo(f"extractor {info.get('extractor')}: extraction {info.get('extract_seconds')} s, linking {info.get('link_seconds')} s, "
               f"communities {info.get('community_seconds')} s, in all {info.get('build_seconds')} s")
