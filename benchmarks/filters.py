"""What a metadata filter costs per query, by how much of the shard it selects.

    .venv/bin/python benchmarks/filters.py [--chunks 100000] [--queries 200] [--repeats 5]

One flat shard of `--chunks` chunks (one per document; random unit vectors, 384 dimensions, and
texts of 8 words drawn from a 2,000-word vocabulary), each document with a metadata field
`bucket` uniform in 0..999. For filters that select 100%, 50%, 10%, 1% and 0.1% of the chunks, and
no filter, it times `search_dense_arrays` and `search_sparse_arrays` one query at a time (k =
200, what hybrid asks each ranker for) and prints the median over `--repeats` passes of the p50
per query, plus the one-time cost of building the filter's row mask. Threads: 1 (one replica's).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import faiss  # noqa: E402

from benchmarks.serve import cpu_description  # noqa: E402
from llmframe_ray.index.dense import DenseParams  # noqa: E402
from llmframe_ray.index.metadata import parse_filter  # noqa: E402
from llmframe_ray.index.shard import IndexShard  # noqa: E402
from llmframe_ray.index.sparse import SparseParams  # noqa: E402
from llmframe_ray.types import Chunk  # noqa: E402

DIM = 384
FILTERS = {
    "none": None,
    "100%": {"bucket": {"gte": 0}},
    "50%": {"bucket": {"lt": 500}},
    "10%": {"bucket": {"lt": 100}},
    "1%": {"bucket": {"lt": 10}},
    "0.1%": {"bucket": 7},
}


def build(n: int, seed: int = 5) -> IndexShard:
    rng = np.random.default_rng(seed)
    vocab = [f"w{i}" for i in range(2000)]
    words = rng.integers(0, len(vocab), size=(n, 8))
    buckets = rng.integers(0, 1000, size=n)
    chunks = [
        Chunk(f"d{i:07d}#0", f"d{i:07d}", 0, " ".join(vocab[w] for w in words[i]), metadata={"bucket": int(buckets[i])})
        for i in range(n)
    ]
    vectors = rng.normal(size=(n, DIM)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    model = {"name": "random", "provider": "bench", "dim": DIM, "max_length": 64}
    return IndexShard.build(chunks, vectors, dense=DenseParams(), sparse=SparseParams(stemmer=None, stopwords=None),
                            model=model, chunking={})


def p50_ms(run, inputs) -> float:
    times = []
    for item in inputs:
        start = time.perf_counter()
        run(item)
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--chunks", type=int, default=100_000)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--k", type=int, default=200)
    args = parser.parse_args()
    faiss.omp_set_num_threads(1)
    clock = time.perf_counter()
    shard = build(args.chunks)
    print(f"machine: {cpu_description()}, {os.cpu_count()} cores; built {args.chunks} chunks in {time.perf_counter() - clock:.0f} s")
    rng = np.random.default_rng(1)
    vectors = rng.normal(size=(args.queries, DIM)).astype(np.float32)
    texts = [" ".join(f"w{w}" for w in rng.integers(0, 2000, size=4)) for _ in range(args.queries)]
    print("| filter | selected chunks | mask build ms (once) | dense p50 ms | bm25 p50 ms |")
    print("|---|---|---|---|---|")
    for name, raw in FILTERS.items():
        where = None if raw is None else parse_filter(raw)
        mask_ms, selected = 0.0, args.chunks
        if where is not None:
            start = time.perf_counter()
            mask = shard.store.row_mask(where)
            mask_ms = (time.perf_counter() - start) * 1000
            selected = int(mask.sum()) if mask is not None else args.chunks
        shard.search_dense_arrays(vectors[:1], args.k, where)  # warm up (compiles, prefilter)
        shard.search_sparse_arrays(texts[:1], args.k, where)
        dense = statistics.median(
            p50_ms(lambda v: shard.search_dense_arrays(v[None, :], args.k, where), vectors) for _ in range(args.repeats)
        )
        bm25 = statistics.median(
            p50_ms(lambda t: shard.search_sparse_arrays([t], args.k, where), texts) for _ in range(args.repeats)
        )
        print(f"| {name} | {selected} | {mask_ms:.1f} | {dense:.2f} | {bm25:.3f} |")


if __name__ == "__main__":
    main()
