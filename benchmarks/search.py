"""In-process search throughput and latency on SciFact, and embedder passages/s.

    .venv/bin/python benchmarks/search.py [--dataset ../shared/eval/scifact] [--repeats 3]

Prints, per mode: queries/s and p50/p99 latency one query at a time, and queries/s with
p50/p99 per-batch latency in batches; then ONNX vs sentence-transformers passages/s on the
same chunk texts; peak memory and the machine's cores. Each figure is the median of `repeats`
runs. The SciFact index is built on first use and cached under LLMFRAME_HOME.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from llmframe_ray.config import load_settings  # noqa: E402
from llmframe_ray.eval.beir import load_beir  # noqa: E402
from llmframe_ray.eval.runner import cached_index  # noqa: E402
from llmframe_ray.ingest.build import stderr_progress  # noqa: E402
from llmframe_ray.models.embedder import load_embedder  # noqa: E402
from llmframe_ray.models.export import bundled_minilm_path  # noqa: E402
from llmframe_ray.retrieve.pipeline import Pipeline  # noqa: E402
from llmframe_ray.types import INDEX_MODES, SearchMode  # noqa: E402


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q))


def one_at_a_time(pipeline: Pipeline, queries: list[str], mode: SearchMode, top_k: int) -> tuple[float, float, float]:
    latencies = []
    started = time.perf_counter()
    for q in queries:
        t0 = time.perf_counter()
        pipeline.search(q, mode, top_k)
        latencies.append(time.perf_counter() - t0)
    elapsed = time.perf_counter() - started
    return len(queries) / elapsed, percentile(latencies, 50) * 1e3, percentile(latencies, 99) * 1e3


def batched(pipeline: Pipeline, queries: list[str], mode: SearchMode, top_k: int, size: int) -> tuple[float, float, float]:
    latencies = []
    started = time.perf_counter()
    for start in range(0, len(queries), size):
        t0 = time.perf_counter()
        pipeline.search_batch(queries[start : start + size], mode, top_k)
        latencies.append(time.perf_counter() - t0)
    elapsed = time.perf_counter() - started
    return len(queries) / elapsed, percentile(latencies, 50) * 1e3, percentile(latencies, 99) * 1e3


def median_of(fn, repeats: int) -> tuple[float, ...]:
    runs = [fn() for _ in range(repeats)]
    return tuple(statistics.median(r[i] for r in runs) for i in range(len(runs[0])))


def embedder_rates(embedder, texts: list[str], threads: int, repeats: int) -> tuple[float, float]:
    import torch
    from sentence_transformers import SentenceTransformer

    torch.set_num_threads(threads)
    reference = SentenceTransformer(str(bundled_minilm_path()), device="cpu")
    batch = embedder.batch_size

    def onnx_rate():
        t0 = time.perf_counter()
        embedder.embed(texts)
        return (len(texts) / (time.perf_counter() - t0),)

    def st_rate():
        t0 = time.perf_counter()
        reference.encode(texts, batch_size=batch, normalize_embeddings=True)
        return (len(texts) / (time.perf_counter() - t0),)

    return median_of(onnx_rate, repeats)[0], median_of(st_rate, repeats)[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", default=str(ROOT.parent / "shared" / "eval" / "scifact"))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--top-k", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--passages", type=int, default=512, help="chunk texts for the embedder comparison")
    parser.add_argument("--graph", action="store_true", help="also the graph modes (the knowledge graph is built on first use)")
    parser.add_argument("--no-embedder", action="store_true", help="skip the embedder comparison")
    args = parser.parse_args()

    settings = load_settings()
    dataset = load_beir(args.dataset)
    params = settings.params()
    embedder = load_embedder(params.embedder)
    root = cached_index(dataset, params.index, embedder, params.indexes_dir, stderr_progress())
    if args.graph:
        from llmframe_ray.graph.build import ensure_graph

        ensure_graph(root, embed=embedder.embed)
    pipeline = Pipeline.open(root, embedder, params.retrieval)
    queries = list(dataset.queries.values())
    modes = [*INDEX_MODES, SearchMode.GRAPH, SearchMode.HYBRID_GRAPH] if args.graph else list(INDEX_MODES)
    for mode in modes:  # warm up every path once
        pipeline.search_batch(queries[:8], mode, args.top_k)

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(f"machine: {platform.machine()}, {cores} cores, python {platform.python_version()}, "
          f"ONNX threads {settings.threads}, {len(queries)} queries, top_k {args.top_k}, "
          f"median of {args.repeats} runs")
    print(f"index: {pipeline.total_chunks} chunks of {len(dataset.corpus)} documents, dense {settings.dense_index.value}")
    print()
    print(f"{'mode':<12} {'1-at-a-time q/s':>16} {'p50 ms':>8} {'p99 ms':>8} "
          f"{'batch-' + str(args.batch_size) + ' q/s':>14} {'batch p50 ms':>13} {'batch p99 ms':>13}")
    for mode in modes:
        single = median_of(lambda: one_at_a_time(pipeline, queries, mode, args.top_k), args.repeats)
        many = median_of(lambda: batched(pipeline, queries, mode, args.top_k, args.batch_size), args.repeats)
        print(f"{mode.value:<12} {single[0]:>16.1f} {single[1]:>8.2f} {single[2]:>8.2f} "
              f"{many[0]:>14.1f} {many[1]:>13.1f} {many[2]:>13.1f}")

    if args.no_embedder:
        return
    shard = pipeline.shards[0]
    texts = [shard.chunk(row).indexed_text for row in range(min(args.passages, len(shard)))]
    onnx, reference = embedder_rates(embedder, texts, settings.threads, args.repeats)
    print()
    print(f"embedder on {len(texts)} SciFact chunks (batch {embedder.batch_size}, {settings.threads} threads):")
    print(f"  ONNX Runtime           {onnx:>8.1f} passages/s")
    print(f"  sentence-transformers  {reference:>8.1f} passages/s   (ONNX / ST = {onnx / reference:.2f}x)")
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak memory (max RSS of this process): {peak_mib:.0f} MiB")


if __name__ == "__main__":
    main()
