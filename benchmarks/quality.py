"""Retrieval quality per collection and mode, as a table and a PNG plot.

    .venv/bin/python benchmarks/quality.py [--datasets scifact,hotpotqa,cranfield,cisi,medline]
        [--modes bm25,dense,hybrid,graph,hybrid-graph] [--plot benchmarks/results/quality.png]

For each BEIR folder in ../shared/eval: the eval harness's run of every mode on its test
queries (the cached index; the knowledge graph built with it on first use), scored from the
written TREC run files (nDCG@10). Prints a Markdown table and draws grouped bars (matplotlib:
`.venv/bin/pip install -e '.[bench]'`).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from llmframe_ray.config import load_settings  # noqa: E402
from llmframe_ray.eval.beir import load_beir  # noqa: E402
from llmframe_ray.eval.runner import EvalMode, cached_index, evaluate  # noqa: E402
from llmframe_ray.graph.build import ensure_graph  # noqa: E402
from llmframe_ray.ingest.build import stderr_progress  # noqa: E402
from llmframe_ray.models.embedder import load_embedder  # noqa: E402
from llmframe_ray.retrieve.pipeline import Pipeline  # noqa: E402

EVAL = ROOT.parent / "shared" / "eval"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", default="scifact,hotpotqa,cranfield,cisi,medline")
    parser.add_argument("--modes", default="bm25,dense,hybrid,graph,hybrid-graph")
    parser.add_argument("--metric", default="nDCG@10")
    parser.add_argument("--plot", type=Path, default=ROOT / "benchmarks" / "results" / "quality.png")
    args = parser.parse_args()
    params = load_settings().params()
    embedder = load_embedder(params.embedder)
    modes = [EvalMode.from_str(m) for m in args.modes.split(",")]
    table: dict[str, dict[str, float]] = {}
    runs = Path(tempfile.mkdtemp(prefix="quality-runs-"))
    for name in args.datasets.split(","):
        data = load_beir(EVAL / name)
        root = cached_index(data, params.index, embedder, params.indexes_dir, stderr_progress())
        if any(m.search[0].uses_graph for m in modes):
            ensure_graph(root, embed=embedder.embed)
        pipeline = Pipeline.open(root, embedder, params.retrieval)
        reports = evaluate(pipeline, data, modes, runs / name, rewrite=params.service.rewrite)
        table[f"{name} ({reports[0].queries})"] = {r.mode: r.metrics[args.metric] for r in reports}
        print(f"{name}: " + ", ".join(f"{r.mode} {r.metrics[args.metric]:.4f}" for r in reports), flush=True)
    names = [m.value for m in modes]
    print(f"\n| collection | {' | '.join(names)} |")
    print("|---|" + "---|" * len(names))
    for collection, scores in table.items():
        best = max(scores.values())
        cells = [f"**{scores[m]:.4f}**" if scores[m] == best else f"{scores[m]:.4f}" for m in names]
        print(f"| {collection} | {' | '.join(cells)} |")
    plot(table, names, args.metric, args.plot)
    print(f"\nplot: {args.plot.relative_to(ROOT) if args.plot.is_relative_to(ROOT) else args.plot}")


def plot(table: dict[str, dict[str, float]], modes: list[str], metric: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 4.5))
    width = 0.8 / len(modes)
    for i, mode in enumerate(modes):
        xs = [j + (i - (len(modes) - 1) / 2) * width for j in range(len(table))]
        ax.bar(xs, [scores[mode] for scores in table.values()], width, label=mode)
    ax.set_xticks(range(len(table)), list(table))
    ax.set_ylabel(metric)
    ax.set_ylim(0, 1)
    ax.set_title(f"{metric} per collection and retrieval mode (test queries)")
    ax.legend(ncol=len(modes), loc="upper center", bbox_to_anchor=(0.5, -0.12), frameon=False)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
