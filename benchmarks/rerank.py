"""Cross-encoder throughput: pairs/s and achieved GFLOP/s against the machine's sgemm ceiling.

    .venv/bin/python benchmarks/rerank.py [--model DIR] [--pairs 256] [--repeats 3]

For batch sizes 1, 8, 32, 64 and fp32 weights, and int8 (which runs each pair alone, `threads`
pairs at a time: models/cross_encoder.py): pairs/s (tokenize + run + postprocess) and the
achieved GFLOP/s, counting the model's multiply-adds per pair on the (padded) shapes actually run (per layer: 4*S*H*H for Q, K, V and output projections, 2*S*H*I for the
feed-forward, 2*S*S*H for attention scores and weighted sum; FLOPs = 2 x MACs). The ceiling is
numpy's float32 matrix multiply (2048 x 2048) with the same thread count, measured in a child
process with OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE unset (this machine sets them, which holds
OpenBLAS to older kernels) and, for comparison, with them as set; threadpoolctl names the kernel.
Median of `repeats` runs each.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from llmframe_ray.config import load_settings  # noqa: E402
from llmframe_ray.eval.beir import load_beir  # noqa: E402
from llmframe_ray.models.cross_encoder import CrossEncoder, read_card  # noqa: E402
from serve import cpu_description  # noqa: E402  (benchmarks/, this script's folder)

CEILING = r"""
import json, os, sys, time
import numpy as np
from threadpoolctl import threadpool_info, threadpool_limits
threads = int(sys.argv[1])
with threadpool_limits(limits=threads, user_api="blas"):
    a = np.random.default_rng(0).standard_normal((2048, 2048), dtype=np.float32)
    b = np.random.default_rng(1).standard_normal((2048, 2048), dtype=np.float32)
    a @ b
    runs = []
    for _ in range(5):
        t = time.perf_counter(); a @ b; runs.append(time.perf_counter() - t)
    runs.sort()
    blas = [i for i in threadpool_info() if i.get("user_api") == "blas"]
    print(json.dumps({"gflops": 2 * 2048**3 / runs[len(runs) // 2] / 1e9,
                      "kernel": [(i.get("internal_api"), i.get("architecture"), i.get("num_threads")) for i in blas]}))
"""


def ceiling(threads: int, unset: bool) -> dict:
    env = dict(os.environ)
    if unset:
        env.pop("OPENBLAS_CORETYPE", None)
        env.pop("OPENBLAS_L2_SIZE", None)
    out = subprocess.run([sys.executable, "-c", CEILING, str(threads)], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def macs_per_batch(batch, layers: int, hidden: int, intermediate: int) -> int:
    b, s = batch.input_ids.shape
    per_layer = 4 * s * hidden * hidden + 2 * s * hidden * intermediate + 2 * s * s * hidden
    return b * layers * per_layer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    settings = load_settings()
    parser.add_argument("--model", default=str(settings.home / "rerankers" / "scifact-gated-2ep"))
    parser.add_argument("--dataset", default=str(ROOT.parent / "shared" / "eval" / "scifact"))
    parser.add_argument("--pairs", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    dataset = load_beir(args.dataset)
    queries = list(dataset.queries.values())
    docs = dataset.corpus
    pairs = [(queries[i % len(queries)], f"{docs[i * 7 % len(docs)].title}\n{docs[i * 7 % len(docs)].text}") for i in range(args.pairs)]
    config = json.loads((Path(args.model) / "config.json").read_text())
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    kept = read_card(Path(args.model)).get("layers")  # a smaller student keeps some of them
    layers = len(kept) if kept else config["num_hidden_layers"]
    threads = settings.threads

    print(f"machine: {platform.machine()}, {cpu_description()}, {os.cpu_count()} cores, ONNX Runtime threads {threads}; model {args.model} "
          f"({layers} layers, hidden {hidden}, FFN {inter}); {len(pairs)} SciFact (query, passage) pairs; "
          f"median of {args.repeats} runs")
    print(f"{'precision':<9} {'batch':>5} {'pairs/s':>9} {'GFLOP/s':>9} {'mean tokens':>12}")
    for precision, sizes in (("fp32", (1, 8, 32, 64)), ("int8", (1,))):
        for batch_size in sizes:
            encoder = CrossEncoder(Path(args.model), precision=precision, batch_size=batch_size, threads=threads)
            size = 1 if encoder.pair_by_pair else batch_size
            batches = [encoder.tokenize_pairs(pairs[i : i + size]) for i in range(0, len(pairs), size)]
            flops = 2 * sum(macs_per_batch(b, layers, hidden, inter) for b in batches)
            tokens = sum(int(b.attention_mask.sum()) for b in batches) / len(pairs)
            encoder.score_pairs(pairs[:batch_size])  # warm-up
            times = []
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                encoder.score_pairs(pairs)
                times.append(time.perf_counter() - t0)
            seconds = statistics.median(times)
            shown = f"1 x {threads}" if encoder.pair_by_pair else str(batch_size)
            print(f"{precision:<9} {shown:>5} {len(pairs) / seconds:>9.1f} {flops / seconds / 1e9:>9.1f} {tokens:>12.1f}")
    for unset in (True, False):
        c = ceiling(threads, unset)
        label = "OPENBLAS_CORETYPE/L2_SIZE unset" if unset else "machine's OPENBLAS settings"
        print(f"numpy sgemm ceiling, {threads} threads, {label}: {c['gflops']:.1f} GFLOP/s (kernel {c['kernel']})")
    print(f"peak memory (max RSS of this process): {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")


if __name__ == "__main__":
    main()
