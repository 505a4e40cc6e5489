"""`llmframe-ray` command line: build an index, search it, evaluate retrieval modes."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, List, Optional

import typer

from llmframe_ray.errors import LLMFrameError

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__)
index_app = typer.Typer(no_args_is_help=True, help="Build and inspect indexes.")
app.add_typer(index_app, name="index")


def _print_version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        typer.echo(f"llmframe-ray {version('llmframe-ray')}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True, help="Print the version and exit."),
) -> None:
    """`llmframe-ray` command line: build an index, search it, evaluate retrieval modes."""


def _fail(message: str, code: int = 2) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def _settings():
    from llmframe_ray.config import load_settings

    return load_settings()


@index_app.command("build")
def index_build(
    sources: List[str] = typer.Argument(..., help="Files, folders, globs or JSONL corpora."),
    index: Path = typer.Option(..., "--index", help="Index directory (versions are kept inside)."),
) -> None:
    """Read, chunk, embed and index documents in this process; publish a new version."""
    from llmframe_ray.ingest.build import build_index, stderr_progress
    from llmframe_ray.ingest.readers import iter_documents
    from llmframe_ray.models.embedder import load_embedder

    params = _settings().params()
    skipped: list = []
    documents = list(iter_documents(sources, errors=skipped, max_bytes=params.ingest.max_file_bytes))
    for error in skipped:
        typer.echo(f"skipped {error}", err=True)
    if not documents:
        _fail("no readable documents in the given sources")
    embedder = load_embedder(params.embedder)
    version = build_index(documents, index, params.index, embedder, stderr_progress())
    typer.echo(f"published version {version} of {index}: {len(documents)} documents")
    if skipped:
        raise typer.Exit(1)


@index_app.command("info")
def index_info(
    index: Path = typer.Argument(..., help="Index directory."),
) -> None:
    """Print the versions, shards, document and chunk counts, model and parameters."""
    import json

    from llmframe_ray.index.manifest import thaw
    from llmframe_ray.index.versions import IndexDirectory

    directory = IndexDirectory(index)
    current = directory.current_version()
    versions = directory.versions()
    if not versions:
        _fail(f"no published version in {index}")
    typer.echo(f"index {index}")
    for version in versions:
        info = directory.version_info(version)
        mark = "*" if version == current else " "
        typer.echo(f" {mark} {version}  created {info.get('created_at', '?')}  shards {info['shards']}"
                   + (f"  documents {info['documents']}  chunks {info['chunks']}" if "documents" in info else ""))
    loaded = directory.load()
    typer.echo(f"served version {loaded.version} ({len(loaded.shards)} non-empty of {loaded.info['shards']} shards)")
    for shard_id, shard in zip(loaded.shard_ids, loaded.shards):
        counts = shard.manifest.counts
        size = sum(f["bytes"] for f in shard.manifest.files.values())
        typer.echo(f"  shard {shard_id}: {counts['documents']} documents, {counts['chunks']} chunks, {size / 2**20:.1f} MiB, dense {shard.dense.params.kind.value}")
    for shard_id in loaded.info.get("empty_shards", []):
        typer.echo(f"  shard {shard_id}: empty")
    manifest = loaded.shards[0].manifest
    typer.echo("model: " + json.dumps(dict(manifest.model), sort_keys=True))
    typer.echo("parameters: " + json.dumps(thaw(manifest.parameters), sort_keys=True))
    corpus = loaded.shards[0].sparse.corpus
    if corpus is not None:
        typer.echo(f"bm25 corpus statistics: {corpus['n_docs']} chunks, {corpus['n_tokens']} terms (shared by every shard)")
    spaces: dict[str, int] = {}
    fields: set[str] = set()
    for shard in loaded.shards:
        documents = shard.store.documents
        for code in documents.namespace_codes.tolist():
            spaces[documents.namespaces[code]] = spaces.get(documents.namespaces[code], 0) + 1
        fields.update(documents.fields)
    typer.echo("namespaces: " + ", ".join(f"{ns} ({n} documents)" for ns, n in sorted(spaces.items())))
    typer.echo("metadata fields: " + (", ".join(sorted(fields)) or "none"))
    graph_info = loaded.path / "graph" / "graph.json"
    if graph_info.is_file():
        graph = json.loads(graph_info.read_text(encoding="utf-8"))
        sizes = ("chunks", "entities", "mentions", "relations", "communities", "levels")
        typer.echo("knowledge graph: " + ", ".join(f"{graph.get(k)} {k}" for k in sizes) + f" (extractor {graph.get('extractor')})")
    else:
        typer.echo("knowledge graph: none (llmframe-ray graph build --index INDEX)")


def _served_version(index: Path) -> str | None:
    """The version an index folder's CURRENT names (None: none yet, or no index there)."""
    from llmframe_ray.index.versions import IndexDirectory

    try:
        return IndexDirectory(index).current_version()
    except LLMFrameError:
        return None


@app.command()
def ingest(
    sources: Optional[List[str]] = typer.Argument(None, help="Files, folders, globs or JSONL / BEIR corpus files."),
    index: Path = typer.Option(..., "--index", help="Index directory (versions are kept inside)."),
    shards: Optional[int] = typer.Option(None, "--shards", min=1, max=4096, help="Shards of a new index (default 1; an existing index keeps its count)."),
    delete: Optional[List[str]] = typer.Option(None, "--delete", help="Remove this document id; repeat for several."),
    namespace: str = typer.Option("default", "--namespace", help="The namespace (tenant) the documents and --delete ids belong to."),
    adapt_reranker: Optional[Path] = typer.Option(None, "--adapt-reranker", help="Then train a reranker for this corpus from pseudo-queries (train-reranker --index INDEX --synthetic) into this folder."),
    adapt_teacher: Optional[Path] = typer.Option(None, "--adapt-teacher", help="With --adapt-reranker: a trained reranker to adapt to this corpus (training starts from it and distils from its scores); with --adapt-layers, a MiniLM student distilled from it."),
    adapt_layers: Optional[int] = typer.Option(None, "--adapt-layers", min=1, max=6, help="With --adapt-reranker: layers of MiniLM to keep (default all 6, or the teacher's when it is adapted)."),
    graph: Optional[bool] = typer.Option(None, "--graph/--no-graph", help="Build the new version's knowledge graph (entities, relations, communities) for the graph and hybrid-graph strategies. Default: if the previous version has one."),
    graph_extractor: str = typer.Option("offline", "--graph-extractor", help="offline (no key), or llm (the provider chain; answers cached by chunk, cost in the report)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Read, chunk and print the plan (added, replaced, unchanged, deleted); embed and write nothing."),
) -> None:
    """Ingest with the Ray Data job: upsert documents, delete ids, publish a new version.

    Uses the Ray cluster at RAY_ADDRESS, or starts a local one. Exit status 0: published (or
    nothing to change); 3: done, but some inputs were skipped (listed, and in ingest-report.json);
    2: bad arguments or input; 1: the job failed (CURRENT still serves the previous version).
    """
    from llmframe_ray.batch.job import ingest as run_ingest
    from llmframe_ray.ingest.build import stderr_progress
    from llmframe_ray.batch.report import summary_lines
    from llmframe_ray.batch.plan import PlanError
    from llmframe_ray.errors import ConfigError, DocumentReadError
    from llmframe_ray.index.versions import IndexBusyError

    if adapt_reranker is None and (adapt_teacher is not None or adapt_layers is not None):
        _fail("--adapt-teacher and --adapt-layers go with --adapt-reranker OUT")
    adapting: dict = {}
    if adapt_reranker is not None:  # checked before the job: the training is its last step
        from llmframe_ray.train.synthetic import adaptation

        adapting = adaptation(adapt_teacher, adapt_layers)
    from llmframe_ray.index.metadata import FilterError, check_namespace, internal_id

    try:
        check_namespace(namespace)
    except FilterError as exc:
        _fail(f"--namespace: {exc}")
    params = _settings().params()
    before = _served_version(index)
    try:
        result = run_ingest(sources or [], index, params, shards=shards, deletes=[internal_id(namespace, d) for d in delete or []],
                            log=lambda line: typer.echo(line, err=True), namespace=namespace, graph=graph,
                            graph_extractor=graph_extractor, progress=stderr_progress(), dry_run=dry_run)
    except ValueError as exc:  # an unknown --graph-extractor, or llm with no key
        _fail(str(exc))
    except (PlanError, DocumentReadError, IndexBusyError, ConfigError):
        raise  # bad arguments or input: exit 2 (main)
    except KeyboardInterrupt:  # Ctrl-C: a version is published whole or not at all
        after = _served_version(index)
        if after == before:
            typer.echo(f"interrupted: nothing was published; {index} still serves {after or 'no version'}", err=True)
        else:
            typer.echo(f"interrupted after publishing {after} in {index}", err=True)
        raise typer.Exit(130)
    except Exception as exc:  # the job itself failed: CURRENT still serves the previous version
        typer.echo(f"error: ingestion failed: {type(exc).__name__}: {exc}", err=True)
        raise typer.Exit(1)
    for line in summary_lines(result):
        typer.echo(line, err=True)
    stages = ", ".join(f"{k} {v:.1f}s" for k, v in result.seconds.items())
    typer.echo(f"{'published ' + result.version if result.version else 'no new version'} in {index} ({stages})")
    if dry_run:
        raise typer.Exit(result.exit_code)
    if graph and result.version is None and result.exit_code in (0, 3):  # unchanged: the served version gets one
        from llmframe_ray.graph.build import ensure_graph

        from llmframe_ray.models.embedder import load_embedder

        folder, built_graph, built = ensure_graph(index, embed=load_embedder(params.embedder).embed)
        typer.echo(f"knowledge graph {'built' if built else 'already there'}: {built_graph.sizes()}", err=True)
    if adapt_reranker is not None:  # the optional step: a reranker at home in this corpus
        _train_reranker(None, index, "train", adapt_reranker, adapt_teacher, **adapting)
    raise typer.Exit(result.exit_code)


@index_app.command("sample")
def index_sample(
    out: Path = typer.Argument(..., help="Folder to write the sample corpus into."),
) -> None:
    """Write the bundled sample corpus (the standard library's docstrings) as Markdown files."""
    from llmframe_ray.ingest.samples import write_stdlib_corpus

    paths = write_stdlib_corpus(out)
    typer.echo(f"wrote {len(paths)} documents to {out}")


@app.command()
def search(
    query: str = typer.Argument(..., help="The query text."),
    index: Path = typer.Option(..., "--index", help="Index directory."),
    mode: Optional[str] = typer.Option(None, "--mode", help="bm25, dense or hybrid (default: hybrid if HYBRID_SEARCH_ENABLED)."),
    top_k: int = typer.Option(5, "--top-k", min=1, max=1000),
    level: str = typer.Option("document", "--level", help="document or chunk"),
    rerank: Optional[bool] = typer.Option(None, "--rerank/--no-rerank", help="Rescore with the cross-encoder (default: RERANKER_ENABLED)."),
    reranker: Optional[str] = typer.Option(None, "--reranker", help="Model folder or hub repo id (default: LLMFRAME_RERANKER_MODEL)."),
) -> None:
    """Search an index and print the hits."""
    from llmframe_ray.models.embedder import load_embedder
    from llmframe_ray.models.sources import load_reranker
    from llmframe_ray.retrieve.pipeline import Pipeline
    from llmframe_ray.types import SearchMode

    params = _settings().params()
    search_mode = None if mode is None else SearchMode.from_str(mode)
    needs_model = search_mode is not SearchMode.BM25
    embedder = load_embedder(params.embedder) if needs_model else None
    use_reranker = params.rerank.enabled if rerank is None else rerank
    encoder = load_reranker(params.reranker_model, reranker) if use_reranker else None
    pipeline = Pipeline.open(index, embedder, params.retrieval, encoder, params.rerank)
    hits = pipeline.search(query, search_mode, top_k, level, rerank=use_reranker)
    used = (search_mode or pipeline.default_mode).value
    typer.echo(f"{len(hits)} hits for {query!r} (mode {used}):")
    for hit in hits:
        ranks = ", ".join(f"{name} #{rank}" for name, rank in sorted(hit.ranks.items()))
        snippet = " ".join(hit.text.split())[:160]
        typer.echo(f"{hit.rank:>3}. {hit.doc_id}  score={hit.score:.4f}  [{ranks}]")
        typer.echo(f"     {hit.chunk_id}: {snippet}")


@app.command("eval")
def eval_command(
    dataset: Path = typer.Option(..., "--dataset", help="BEIR folder: corpus.jsonl, queries.jsonl, qrels/<split>.tsv."),
    mode: List[str] = typer.Option(["bm25", "dense", "hybrid"], "--mode", help="bm25, dense, hybrid, rerank (head fused with hybrid, see LLMFRAME_RERANKER_FUSION), rerank-ce (cross-encoder order alone), multi-query (offline rewrites fused), prf (pseudo-relevance feedback), graph (the knowledge graph's ranker, built with the index on first use) or hybrid-graph (bm25, dense and graph fused); repeat for several."),
    runs_dir: Optional[Path] = typer.Option(None, "--runs-dir", help="Write <mode>.trec run files here."),
    split: str = typer.Option("test", "--split"),
    reranker: Optional[str] = typer.Option(None, "--reranker", help="Model folder or hub repo id (default: LLMFRAME_RERANKER_MODEL)."),
    rerank_depth: Optional[int] = typer.Option(None, "--rerank-depth", min=1, max=1000, help="Candidates rescored (default: LLMFRAME_RERANKER_DEPTH, 25)."),
    precision: Optional[str] = typer.Option(None, "--reranker-precision", help="fp32, int8 or auto (int8 where the model folder has model.int8.onnx; default: LLMFRAME_RERANKER_PRECISION, auto)."),
    index: Optional[Path] = typer.Option(None, "--index", help="Evaluate this index directory (e.g. built by `ingest`) instead of the cached one-shard build."),
) -> None:
    """Score retrieval modes (nDCG@10, Recall@100) on the judged queries of a BEIR collection."""
    from llmframe_ray.config import load_settings
    from llmframe_ray.eval.beir import load_beir
    from llmframe_ray.eval.runner import EvalMode, cached_index, check_reranker_data, evaluate, format_table
    from llmframe_ray.ingest.build import stderr_progress
    from llmframe_ray.models.embedder import load_embedder
    from llmframe_ray.models.sources import load_reranker
    from llmframe_ray.retrieve.pipeline import Pipeline

    modes = [EvalMode.from_str(m) for m in mode]
    overrides = {} if rerank_depth is None else {"reranker_depth": rerank_depth}
    params = load_settings(**overrides).params()
    data = load_beir(dataset, split)
    encoder = None
    if EvalMode.RERANK in modes or EvalMode.RERANK_CE in modes:
        encoder = load_reranker(params.reranker_model, reranker, precision)
        check_reranker_data(encoder.card, data)
    embedder = load_embedder(params.embedder)
    if index is not None:
        root = index
    else:
        root = cached_index(data, params.index, embedder, params.indexes_dir, stderr_progress())
    if any(m.search[0].uses_graph for m in modes):
        from llmframe_ray.graph.build import ensure_graph

        folder, graph, built = ensure_graph(root, embed=embedder.embed)
        typer.echo(f"knowledge graph {'built' if built else 'loaded'}: {folder} {graph.sizes()}", err=True)
    pipeline = Pipeline.open(root, embedder, params.retrieval, encoder, params.rerank)
    indexed = sum(int(s.manifest.counts["documents"]) for s in pipeline.shards)
    if index is not None and indexed != len(data.corpus):
        typer.echo(f"warning: {index} holds {indexed} documents; the {data.name} corpus has {len(data.corpus)}", err=True)
    reports = evaluate(pipeline, data, modes, runs_dir, rewrite=params.service.rewrite, progress=stderr_progress())
    typer.echo(format_table(data, reports))
    if encoder is not None:
        similarity = pipeline.domain_similarity()
        home = "set" if params.rerank.weight is not None else "unknown" if similarity is None else f"{similarity:.3f}"
        typer.echo(f"reranker: {encoder.model_dir} ({encoder.precision.value}{encoder.form_note}, depth {params.rerank.depth}, max length "
                   f"{encoder.max_length}, {params.rerank.fusion.value} fusion, weight {pipeline.rerank_weight:.3f}; domain similarity {home})")


@app.command("train-reranker")
def train_reranker_command(
    dataset: Optional[Path] = typer.Option(None, "--dataset", help="BEIR folder with qrels/<split>.tsv."),
    index: Optional[Path] = typer.Option(None, "--index", help="With --synthetic, instead of --dataset: an index directory (your own corpus, as ingested)."),
    split: str = typer.Option("train", "--split", help="Judgments to train on (never test)."),
    out: Path = typer.Option(..., "--out", help="Model folder to write."),
    epochs: Optional[int] = typer.Option(None, "--epochs", min=1, help="Passes over the training groups [default: 2; 1 with --synthetic]."),
    seed: int = typer.Option(13, "--seed"),
    negatives: int = typer.Option(4, "--negatives", min=1, help="Hard negatives per positive."),
    max_length: int = typer.Option(192, "--max-length", min=16, max=512),
    max_steps: Optional[int] = typer.Option(None, "--max-steps", min=1, help="Stop after this many steps."),
    layers: Optional[int] = typer.Option(None, "--layers", min=1, max=6, help="Keep this many of MiniLM's 6 layers (evenly spaced): a smaller, faster reranker. Default: all 6."),
    teacher: Optional[Path] = typer.Option(None, "--teacher", help="A trained reranker folder whose scores of the training pairs are soft labels too (distillation)."),
    distill_weight: float = typer.Option(0.5, "--distill-weight", min=0.0, max=1.0, help="With --teacher: the soft loss's share."),
    synthetic: bool = typer.Option(False, "--synthetic", help="No judgments: train on pseudo-queries made from the corpus (its documents' titles, or sentences); --split is not read."),
    synthetic_queries: int = typer.Option(1500, "--synthetic-queries", min=1, help="With --synthetic: at most this many pseudo-queries (one per document)."),
    pseudo_queries: str = typer.Option("auto", "--pseudo-queries", help="With --synthetic: title (each document's title of 3+ words, or its first sentence where it has no title, with 20+ words left; every passage read without its title), sentence (one sentence taken out of its document), or auto: titles when at least half the documents have one."),
    init: Optional[Path] = typer.Option(None, "--init", help="Start from this reranker folder (made by train-reranker; its layers) instead of MiniLM: e.g. adapt a trained model to a corpus with --synthetic."),
    rationales: bool = typer.Option(False, "--rationales", help="Also train on the dataset's rationale sentences (rationales/, SciFact's layout): the sentence scores that contextual compression reads."),
    held_out: float = typer.Option(0.1, "--held-out", min=0.0, max=0.9, help="Share of the split's queries held out from training (seeded): the card's validation."),
    average_last: float = typer.Option(0.0, "--average-last", min=0.0, max=0.95, help="Export the mean of the weights over this last share of the steps (e.g. 0.5: the second of two epochs) instead of the last step's."),
) -> None:
    """Fine-tune a cross-encoder reranker from the bundled MiniLM (or --init M); export ONNX fp32 + int8."""
    from llmframe_ray.train.synthetic import SYNTHETIC_EPOCHS, PseudoQueries

    if (dataset is None) == (index is None):
        _fail("give exactly one of --dataset DIR (a BEIR folder) or --index DIR (with --synthetic)")
    try:
        source = PseudoQueries.from_str(pseudo_queries)
    except ValueError as exc:
        _fail(f"--pseudo-queries: {exc}")
    _train_reranker(
        dataset, index, split, out, teacher, synthetic_queries if synthetic else None, seed=seed,
        epochs=epochs or (SYNTHETIC_EPOCHS if synthetic else 2),
        negatives=negatives, max_length=max_length, max_steps=max_steps, layers=layers, distill_weight=distill_weight,
        rationales=rationales, validation_fraction=held_out, average_last=average_last,
        pseudo_queries=source, init=init,
    )


def _train_reranker(
    dataset: Path | None, index: Path | None, split: str, out: Path, teacher: Path | None,
    synthetic_queries: int | None, rationales: bool = False, pseudo_queries: Any = "auto",
    init: Path | None = None, **config: Any,
) -> None:
    from llmframe_ray.train.reranker import TrainConfig
    from llmframe_ray.train.run import train_reranker

    settings = _settings()
    params = settings.params()
    card = train_reranker(
        dataset, split, out, TrainConfig(threads=settings.threads, **config), lambda line: typer.echo(line, err=True),
        embedder=params.embedder, index=params.index, indexes_dir=params.indexes_dir,
        retrieval=params.retrieval, rerank_rrf_k=params.rerank.rrf_k, teacher=teacher,
        synthetic_queries=synthetic_queries, index_dir=index, rationales=rationales,
        pseudo_queries=pseudo_queries, init=init,
    )
    typer.echo(f"wrote {out}: {card['steps']} steps, {card['data']['groups']} groups")
    for name, figures in (card.get("validation") or {}).items():
        if isinstance(figures, dict):
            typer.echo(f"  validation {name}: nDCG@10 {figures['nDCG@10']:.4f}")


from llmframe_ray.cli_graph import graph_app  # noqa: E402  (the `graph` commands)
from llmframe_ray.cli_serve import register  # noqa: E402  (`serve`, `mcp` and `rerank-vectors`)

app.add_typer(graph_app, name="graph")
register(app)


def _click_error(exc: Exception) -> bool:
    """A click usage error (missing argument, bad value, unknown command), from click itself or
    from the copy of click that typer bundles since 0.2x (`typer._click`, whose classes are not
    click's: checked by class, a usage error printed a traceback)."""
    return any(cls.__name__ == "ClickException" for cls in type(exc).__mro__) and hasattr(exc, "show")


def main() -> None:
    try:
        # without standalone mode, click returns an Exit's code instead of raising it
        code = app(standalone_mode=False)
    except typer.Exit as exc:
        code = exc.exit_code
    except (LLMFrameError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        sys.exit(2)
    except Exception as exc:  # click's usage errors arrive here in non-standalone mode
        if _click_error(exc):
            exc.show()
            sys.exit(exc.exit_code)
        raise
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
