"""Dense index kinds on one shard: build time, query latency and recall@100 against exact.

    .venv/bin/python benchmarks/ann.py [--rows 10000,50000,250000] [--queries 300]
        [--hnsw 32:200,16:100] [--ef 100,128,192,256] [--nprobe 16,32,64,128] [--k 100]

For each row count, vectors made as benchmarks/scale_corpus.py makes them (mixed from real
MiniLM vectors of the evaluation collections) and the collections' real questions: a flat index
(the exact reference, searched through DenseIndex, int8 prefilter included), HNSW for each
M:efConstruction at each efSearch, and IVF-Flat (round(4 sqrt(n)) lists) at each nprobe. One query
at a time, top k: p50 / p99 ms, and recall@k = |approximate top k & exact top k| / k, averaged.
This is what `auto`'s threshold and the HNSW defaults were chosen from (README, "Scale").
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scale_corpus import load_pool, synthetic_vectors  # noqa: E402  (benchmarks/, this script's folder)
from llmframe_ray.config import load_settings  # noqa: E402
from llmframe_ray.index.dense import DenseIndex, DenseParams  # noqa: E402
from llmframe_ray.ingest.build import stderr_progress  # noqa: E402
from llmframe_ray.models.embedder import load_embedder  # noqa: E402


def numbers(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def timed(index: DenseIndex, queries: np.ndarray, k: int) -> tuple[float, float, np.ndarray]:
    for query in queries[:10]:  # warm up
        index.search(query[None], k)
    times, rows = [], []
    for query in queries:
        started = time.perf_counter()
        _, found = index.search(query[None], k)
        times.append(time.perf_counter() - started)
        rows.append(found[0])
    ms = np.asarray(times) * 1e3
    return float(np.percentile(ms, 50)), float(np.percentile(ms, 99)), np.stack(rows)


def recall(found: np.ndarray, exact: np.ndarray) -> float:
    return float(np.mean([len(set(a.tolist()) & set(b.tolist())) / len(b) for a, b in zip(found, exact)]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=numbers, default=[10_000, 50_000, 250_000])
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--hnsw", default="32:200,16:100", help="M:efConstruction pairs")
    parser.add_argument("--ef", type=numbers, default=[100, 128, 192, 256])
    parser.add_argument("--nprobe", type=numbers, default=[16, 32, 64, 128])
    parser.add_argument("--k", type=int, default=100)
    parser.add_argument("--eval-dir", default=str(ROOT.parent / "shared" / "eval"))
    args = parser.parse_args()

    settings = load_settings()
    pool = load_pool(Path(args.eval_dir), settings, load_embedder(settings.params().embedder), stderr_progress())
    queries = pool.query_vectors[np.random.default_rng(1).permutation(len(pool.query_vectors))[: args.queries]]
    print(f"{os.cpu_count()} cores; pool of {len(pool.texts):,} real vectors, {len(queries)} real questions, top {args.k}")
    print()
    print("| rows | kind | parameters | build s | p50 ms | p99 ms | recall@%d |" % args.k)
    print("|---|---|---|---|---|---|---|")
    for n in args.rows:
        vectors = synthetic_vectors(pool, n)
        started = time.perf_counter()
        flat = DenseIndex.build(vectors, DenseParams(kind="flat"))
        built = time.perf_counter() - started
        p50, p99, exact = timed(flat, queries, args.k)
        print(f"| {n:,} | flat | exact | {built:.1f} | {p50:.2f} | {p99:.2f} | 1.0000 |", flush=True)
        for pair in args.hnsw.split(","):
            m, ef_construction = (int(x) for x in pair.split(":"))
            params = DenseParams(kind="hnsw", hnsw_m=m, hnsw_ef_construction=ef_construction)
            sweep(vectors, params, [{"hnsw_ef_search": ef} for ef in args.ef], queries, exact, args.k,
                  lambda index, ef: f"M {m}, efC {ef_construction}, ef {ef['hnsw_ef_search']}")
        sweep(vectors, DenseParams(kind="ivf"), [{"ivf_nprobe": p} for p in args.nprobe], queries, exact, args.k,
              lambda index, probe: f"{index.params.ivf_nlist} lists, nprobe {probe['ivf_nprobe']}")


def sweep(vectors: np.ndarray, params: DenseParams, settings: list[dict], queries: np.ndarray, exact: np.ndarray,
          k: int, label) -> None:
    """Build one index, then a table row per search setting."""
    started = time.perf_counter()
    index = DenseIndex.build(vectors, params)
    built = time.perf_counter() - started
    for setting in settings:
        index.set_search_params(**setting)
        p50, p99, found = timed(index, queries, k)
        print(f"| {len(vectors):,} | {params.kind.value} | {label(index, setting)} | {built:.1f} | {p50:.2f} | {p99:.2f} | "
              f"{recall(found, exact):.4f} |", flush=True)


if __name__ == "__main__":
    main()
