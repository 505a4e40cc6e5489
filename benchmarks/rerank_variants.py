"""Reranker variants, quality against speed: SciFact test nDCG@10 from the eval harness's run
files, and pairs/s of the same model at the served batch size, in one table and one plot.

    .venv/bin/python benchmarks/rerank_variants.py --runs-dir runs/variants --plot rerank-variants.png \
        --variant 6L-int8-d50=~/.cache/llmframe-ray/rerankers/scifact-6L:int8:192:50 \
        --variant 2L-int8-d20=~/.cache/llmframe-ray/rerankers/scifact-2L-d128:int8:128:20 [...]
        [--served 2L-int8-d20=6.1/11.3 ...] [--reuse-runs]

A variant is NAME=MODEL_DIR:PRECISION:MAX_LENGTH:DEPTH. For each one this runs
`llmframe-ray eval --mode hybrid --mode rerank --mode rerank-ce` (the harness itself, in a child
process, with LLMFRAME_RERANKER_MAX_LENGTH / --rerank-depth / --reranker-precision) into
RUNS_DIR/NAME/, re-scores the run files, and measures pairs/s on SciFact (query, chunk) pairs
of the hybrid head: batches of 32 (what the served Reranker gets at a few clients), this
machine's threads, median of `--repeats`. `--served NAME=R1/R8` adds the served hybrid+rerank
requests/s at 1 and 8 clients measured with benchmarks/serve.py (it needs a server per variant);
with them for every variant, the plot's x axis is the served requests/s at 8 clients.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from llmframe_ray.config import load_settings  # noqa: E402
from llmframe_ray.eval.beir import load_beir  # noqa: E402
from llmframe_ray.eval.trec import score_run  # noqa: E402
from llmframe_ray.models.cross_encoder import CrossEncoder  # noqa: E402
from llmframe_ray.types import passage_text  # noqa: E402


@dataclass(frozen=True)
class Variant:
    name: str
    model: Path
    precision: str
    max_length: int
    depth: int

    @classmethod
    def parse(cls, text: str) -> Variant:
        name, _, spec = text.partition("=")
        parts = spec.split(":")
        if not name or len(parts) != 4:
            raise argparse.ArgumentTypeError(f"expected NAME=MODEL_DIR:PRECISION:MAX_LENGTH:DEPTH, got {text!r}")
        return cls(name, Path(parts[0]).expanduser(), parts[1], int(parts[2]), int(parts[3]))


def evaluate(variant: Variant, dataset: Path, runs_dir: Path, reuse: bool = False) -> dict[str, float]:
    out = runs_dir / variant.name
    qrels = load_beir(dataset, "test").qrels
    modes = ("hybrid", "rerank", "rerank-ce")
    if reuse and all((out / f"{mode}.trec").is_file() for mode in modes):  # scored again, not rerun
        return {mode: score_run(out / f"{mode}.trec", qrels)["nDCG@10"] for mode in modes}
    env = {**os.environ, "LLMFRAME_RERANKER_MAX_LENGTH": str(variant.max_length)}
    command = [
        sys.executable, "-m", "llmframe_ray.cli", "eval", "--dataset", str(dataset), "--mode", "hybrid",
        "--mode", "rerank", "--mode", "rerank-ce", "--reranker", str(variant.model),
        "--rerank-depth", str(variant.depth), "--reranker-precision", variant.precision, "--runs-dir", str(out),
    ]
    subprocess.run(command, env=env, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    return {mode: score_run(out / f"{mode}.trec", qrels)["nDCG@10"] for mode in modes}


def pairs_per_second(variant: Variant, pairs: list[tuple[str, str]], threads: int, repeats: int) -> float:
    encoder = CrossEncoder(variant.model, precision=variant.precision, max_length=variant.max_length, batch_size=32, threads=threads)
    encoder.score_pairs(pairs[:32])  # warm-up
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        encoder.score_pairs(pairs)
        times.append(time.perf_counter() - started)
    return len(pairs) / statistics.median(times)


def head_pairs(dataset: Path, n: int) -> list[tuple[str, str]]:
    """SciFact test queries with documents of their own judged set and neighbours (title + text,
    as the cross-encoder reads a hit), cycling through queries."""
    data = load_beir(dataset, "test")
    docs = {d.doc_id: d for d in data.corpus}
    ordered = sorted(docs)
    pairs = []
    for i, (qid, query) in enumerate(sorted(data.queries.items())):
        for doc_id in list(data.qrels[qid])[:1] + ordered[i * 7 % len(ordered) : i * 7 % len(ordered) + 4]:
            pairs.append((query, passage_text(docs[doc_id].title, docs[doc_id].text)))
    return pairs[:n]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variant", type=Variant.parse, action="append", required=True)
    parser.add_argument("--dataset", type=Path, default=ROOT.parent / "shared" / "eval" / "scifact")
    parser.add_argument("--runs-dir", type=Path, required=True)
    parser.add_argument("--pairs", type=int, default=320)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--served", action="append", default=[], help="NAME=REQ_S_AT_1/REQ_S_AT_8 from benchmarks/serve.py")
    parser.add_argument("--plot", type=Path, default=None)
    parser.add_argument("--reuse-runs", action="store_true", help="score a variant's existing run files instead of running the eval again")
    args = parser.parse_args()
    served = {}
    for item in args.served:
        name, _, figures = item.partition("=")
        served[name] = tuple(float(x) for x in figures.split("/"))
    threads = load_settings().threads
    pairs = head_pairs(args.dataset, args.pairs)
    flags = sorted({f for line in open("/proc/cpuinfo") if line.startswith("flags") for f in line.split() if f in ("avx2", "avx512f", "avx512_vnni", "avx512_bf16")}) if Path("/proc/cpuinfo").exists() else []
    print(f"machine: {platform.processor() or platform.machine()} ({' '.join(flags)}), {os.cpu_count()} cores, {threads} ONNX Runtime threads; "
          f"{len(pairs)} SciFact pairs per speed run, batches of 32, median of {args.repeats}")
    rows = []
    for variant in args.variant:
        quality = evaluate(variant, args.dataset, args.runs_dir, args.reuse_runs)
        rate = pairs_per_second(variant, pairs, threads, args.repeats)
        rows.append((variant, quality, rate))
        print(f"{variant.name:<22} nDCG@10 hybrid {quality['hybrid']:.4f} rerank {quality['rerank']:.4f} "
              f"rerank-ce {quality['rerank-ce']:.4f}  {rate:7.1f} pairs/s  {rate / variant.depth:6.2f} queries/s of pairs", flush=True)
    print()
    print("| variant | layers source | precision | max length | depth | SciFact nDCG@10 (hybrid / rerank fused / CE alone) | pairs/s | model-only queries/s | served req/s, 1 / 8 clients |")
    print("|---|---|---|---|---|---|---|---|---|")
    for variant, quality, rate in rows:
        s = served.get(variant.name)
        print(f"| {variant.name} | {variant.model.name} | {variant.precision} | {variant.max_length} | {variant.depth} | "
              f"{quality['hybrid']:.4f} / **{quality['rerank']:.4f}** / {quality['rerank-ce']:.4f} | {rate:.1f} | "
              f"{rate / variant.depth:.2f} | {'-' if s is None else f'{s[0]:.1f} / {s[1]:.1f}'} |")
    if args.plot is not None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 4.5))
        by_served = all(variant.name in served for variant, _, _ in rows)  # else what the model allows
        for variant, quality, rate in rows:
            x = served[variant.name][1] if by_served else rate / variant.depth
            ax.scatter(x, quality["rerank"], color="tab:blue", label="fused with hybrid" if variant is rows[0][0] else None)
            ax.scatter(x, quality["rerank-ce"], facecolors="none", edgecolors="tab:orange",
                       label="cross-encoder order alone" if variant is rows[0][0] else None)
            ax.annotate(variant.name, (x, quality["rerank"]), fontsize=8, xytext=(4, 3), textcoords="offset points")
        ax.axhline(rows[0][1]["hybrid"], color="gray", linestyle="--", label=f"hybrid alone ({rows[0][1]['hybrid']:.4f})")
        if by_served:
            ax.axhline(0.74, color="tab:green", linestyle=":", label="goal: 0.74 and 5 req/s at 8 clients")
            ax.axvline(5.0, color="tab:green", linestyle=":")
            ax.set_xlabel("served hybrid + rerank requests/s at 8 clients (benchmarks/serve.py)")
        else:
            ax.set_xscale("log")
            ax.set_xlabel("queries/s the model allows (pairs/s / depth), 2 threads")
        ax.set_ylabel("SciFact test nDCG@10")
        ax.set_title("Reranker variants: quality against speed")
        ax.legend(loc="lower left", fontsize=8)
        fig.tight_layout()
        fig.savefig(args.plot, dpi=110)
        print(f"plot: {args.plot}")


if __name__ == "__main__":
    main()
