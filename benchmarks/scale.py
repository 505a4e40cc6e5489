"""Cost against corpus size: build, bytes, memory, load, query latency and ANN recall.

    .venv/bin/python benchmarks/scale.py --chunks N [--shards S] [--queries 300] [--kind auto]
        [--workdir DIR] [--skip-served] [--results FILE.jsonl]
    .venv/bin/python benchmarks/scale.py --plot FILE.png --results FILE.jsonl
    .venv/bin/python benchmarks/scale.py --table --results FILE.jsonl
    .venv/bin/python benchmarks/scale.py --interleave INDEX_10K INDEX_1M [--queries 300]

Makes a synthetic corpus of N chunks (benchmarks/scale_corpus.py: real text from the evaluation
collections, each vector mixed from real MiniLM vectors; no chunk is embedded here), indexes it
into S shards, then measures three phases, each in its own process so each peak RSS is its own:

1. build: `publish_shards` (what the ingestion job's build and publish stages do, from the
   vectors): seconds, peak RSS (the corpus, its vectors and the pool included), the dense kind
   each shard got, index bytes per chunk (every file of the version).
2. in-process: `Pipeline.open` (SHA-256 verification on, as serving does) seconds and RSS
   after it; then bm25, dense and hybrid, top 10, one query at a time over the collections' real
   questions: p50, p99, queries/s; and recall@100 of the dense index against exact search on the
   same stored vectors (each shard's top 100 merged across shards, both sides the same way).
3. served: `llmframe-ray serve --index` (the local layout), seconds until /readyz answers 200,
   then the same queries over HTTP at 1 client (p50, p99, requests/s) and hybrid at 8 clients
   (requests/s), and the peak summed RSS of its replica processes.

Prints the machine, a header and the row for N (markdown); `--results` appends the row as
JSON, `--plot` draws every cost of a results file against corpus size, log-log, and `--table`
prints its rows as two tables.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import resource
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MODES = ("bm25", "dense", "hybrid")
READY_TIMEOUT_S = 1800.0


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def latencies(values: list[float]) -> dict[str, float]:
    ms = np.asarray(values) * 1e3
    return {"p50": float(np.percentile(ms, 50)), "p99": float(np.percentile(ms, 99)), "qps": len(values) / float(np.sum(values))}


def load_inputs(args: argparse.Namespace):
    from scale_corpus import load_pool  # noqa: E402  (benchmarks/, this script's folder)
    from llmframe_ray.config import load_settings
    from llmframe_ray.ingest.build import stderr_progress
    from llmframe_ray.models.embedder import load_embedder

    settings = load_settings(dense_index=args.kind)
    embedder = load_embedder(settings.params().embedder)
    pool = load_pool(Path(args.eval_dir), settings, embedder, stderr_progress())
    rng = np.random.default_rng(1)
    pick = rng.permutation(len(pool.queries))[: args.queries]
    return settings, embedder, pool, [pool.queries[i] for i in pick], pool.query_vectors[pick]


def phase_build(args: argparse.Namespace) -> dict:
    from scale_corpus import synthetic_chunks, synthetic_vectors
    from llmframe_ray.index.versions import IndexDirectory
    from llmframe_ray.ingest.build import publish_shards

    settings, embedder, pool, _, _ = load_inputs(args)
    started = time.perf_counter()
    chunks = synthetic_chunks(pool, args.chunks)
    vectors = synthetic_vectors(pool, args.chunks)
    made = time.perf_counter() - started
    directory = IndexDirectory(args.index)
    started = time.perf_counter()
    version = publish_shards(directory, chunks, vectors, settings.params().index, embedder.info(), shards=args.shards)
    built = time.perf_counter() - started
    root = directory.versions_dir / version
    size = sum(p.stat().st_size for p in root.rglob("*") if p.is_file())
    kinds = sorted({directory.load_shard(version, s).dense.params.kind.value for s in range(args.shards)})
    return {"corpus_s": made, "build_s": built, "build_rss_mib": peak_rss_mib(), "bytes_per_chunk": size / args.chunks,
            "index_mib": size / 2**20, "kinds": "/".join(kinds)}


def exact_top(vectors: np.ndarray, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Per query, the k best (scores, rows) of `vectors` by inner product (exact, float32)."""
    scores = np.empty((len(queries), k), dtype=np.float32)
    rows = np.empty((len(queries), k), dtype=np.int64)
    for start in range(0, len(queries), 64):
        block = queries[start:start + 64] @ vectors.T
        top = np.argpartition(-block, k - 1, axis=1)[:, :k]
        scores[start:start + 64] = np.take_along_axis(block, top, 1)
        rows[start:start + 64] = top
    return scores, rows


def merged(per_shard: list[tuple[np.ndarray, np.ndarray]], k: int) -> list[set]:
    """Per query, the (shard, row) pairs of the k best scores over every shard's list."""
    scores = np.concatenate([s for s, _ in per_shard], axis=1)
    keys = np.concatenate([r + (i << 40) for i, (_, r) in enumerate(per_shard)], axis=1)
    keys = np.where(np.concatenate([r for _, r in per_shard], axis=1) < 0, -1, keys)
    best = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    return [set(row.tolist()) - {-1} for row in np.take_along_axis(keys, best, 1)]


def dense_recall(shards, query_vectors: np.ndarray, k: int = 100) -> float:
    approx, exact = [], []
    for shard in shards:
        approx.append(shard.dense.search(query_vectors, k))
        exact.append(exact_top(shard.dense.vectors(np.arange(len(shard))), query_vectors, min(k, len(shard))))
    got, want = merged(approx, k), merged(exact, k)
    return float(np.mean([len(g & w) / len(w) for g, w in zip(got, want)]))


def phase_inprocess(args: argparse.Namespace) -> dict:
    from llmframe_ray.retrieve.pipeline import Pipeline
    from llmframe_ray.types import SearchMode

    settings, embedder, _, queries, query_vectors = load_inputs(args)
    started = time.perf_counter()
    pipeline = Pipeline.open(Path(args.index), embedder, settings.params().retrieval)
    out: dict = {"load_s": time.perf_counter() - started, "load_rss_mib": psutil.Process().memory_info().rss / 2**20}
    for mode in MODES:
        for query in queries[:20]:
            pipeline.search(query, SearchMode(mode), 10)
    for mode in MODES:
        times = []
        for query in queries:
            t0 = time.perf_counter()
            pipeline.search(query, SearchMode(mode), 10)
            times.append(time.perf_counter() - t0)
        out[f"inproc_{mode}"] = latencies(times)
    out["recall100"] = dense_recall(pipeline.shards, query_vectors)
    out["inproc_rss_mib"] = peak_rss_mib()
    return out


def interleaved(args: argparse.Namespace) -> None:
    """Hybrid one query at a time on several indexes in one process, in alternating blocks of
    25 queries (order rotating), so every p50 comes from the same minutes: a ratio between
    corpus sizes that the machine's drift between separate runs cannot move."""
    from llmframe_ray.retrieve.pipeline import Pipeline
    from llmframe_ray.types import SearchMode

    settings, embedder, _, queries, _ = load_inputs(args)
    pipelines = [Pipeline.open(Path(index), embedder, settings.params().retrieval) for index in args.interleave]
    times: list[list[float]] = [[] for _ in pipelines]
    for pipeline in pipelines:
        for query in queries[:20]:
            pipeline.search(query, SearchMode.HYBRID, 10)
    for block, start in enumerate(range(0, len(queries), 25)):
        for turn in range(len(pipelines)):
            i = (block + turn) % len(pipelines)
            for query in queries[start:start + 25]:
                t0 = time.perf_counter()
                pipelines[i].search(query, SearchMode.HYBRID, 10)
                times[i].append(time.perf_counter() - t0)
    first = latencies(times[0])["p50"]
    print("| index | chunks | hybrid p50 ms | p99 ms | p50 / first's |")
    print("|---|---|---|---|---|")
    for index, pipeline, measured in zip(args.interleave, pipelines, times):
        cell = latencies(measured)
        print(f"| {Path(index).name} | {pipeline.total_chunks:,} | {cell['p50']:.2f} | {cell['p99']:.2f} | {cell['p50'] / first:.2f} |")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def http_cell(url: str, key: str, mode: str, queries: list[str], clients: int) -> tuple[list[float], int, float]:
    """`clients` keep-alive clients share the queries, each sending its next one as soon as the
    last is answered: latencies of the 200s, other answers, seconds in all."""
    from lean_http import Pool

    headers = {"X-API-Key": key}
    times: list[float] = []
    errors = 0
    position = 0

    async def client() -> None:
        nonlocal position, errors
        pool = Pool(url)
        try:
            while position < len(queries):
                query = queries[position]
                position += 1
                body = json.dumps({"query": query, "top_k": 10, "mode": mode}).encode()
                t0 = time.perf_counter()
                status, _ = await pool.request("/v1/search", headers, body)
                if status == 200:
                    times.append(time.perf_counter() - t0)
                else:
                    errors += 1
        finally:
            pool.close()

    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    return times, errors, time.perf_counter() - started


def phase_served(args: argparse.Namespace, queries: list[str]) -> dict:
    import httpx
    from serve import ReplicaMemory, serving_node  # benchmarks/serve.py

    key, port = secrets.token_urlsafe(16), free_port()
    url = f"http://127.0.0.1:{port}"
    log = open(Path(args.workdir) / "serve.log", "w")
    env = {**os.environ, "API_SECRET_KEY": key}
    cli = Path(sys.executable).with_name("llmframe-ray")
    server = subprocess.Popen([str(cli), "serve", "--index", str(args.index), "--port", str(port)],
                              env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    out: dict = {}
    try:
        started = time.perf_counter()
        while True:
            if server.poll() is not None:
                raise SystemExit(f"the server exited ({server.returncode}) before it was ready; see {log.name}")
            if time.perf_counter() - started > READY_TIMEOUT_S:
                raise SystemExit(f"{url}/readyz not ready after {READY_TIMEOUT_S:.0f} s; see {log.name}")
            try:
                if httpx.get(f"{url}/readyz", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(1)
        out["served_ready_s"] = time.perf_counter() - started
        with ReplicaMemory(serving_node(url)) as memory:
            for mode in MODES:
                asyncio.run(http_cell(url, key, mode, queries[:20], 1))  # warm-up
                times, errors, _ = asyncio.run(http_cell(url, key, mode, queries, 1))
                out[f"served_{mode}"] = {**latencies(times), "errors": errors}
            times, errors, seconds = asyncio.run(http_cell(url, key, "hybrid", queries, 8))
            out["served_hybrid_8"] = {"qps": len(times) / seconds, "errors": errors}
        out["served_rss_mib"] = memory.peak_bytes / 2**20
        out["served_replicas"] = memory.processes
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(120)
        except subprocess.TimeoutExpired:
            pass
        try:  # whatever of its session is left (the server is its process group's leader)
            os.killpg(server.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        server.wait()
        log.close()
    return out


def run_phase(args: argparse.Namespace, name: str) -> dict:
    """One phase in a child process; its JSON result."""
    result = Path(args.workdir) / f"{name}.json"
    command = [sys.executable, __file__, *sys.argv[1:], "--phase", name, "--result", str(result), "--workdir", str(args.workdir)]
    subprocess.run(command, check=True)
    return json.loads(result.read_text())


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


COLUMNS = [
    ("chunks", lambda r: f"{r['chunks']:,}"), ("shards", lambda r: str(r["shards"])), ("dense", lambda r: r["kinds"]),
    ("build s", lambda r: f"{r['build_s']:.0f}"), ("bytes/chunk", lambda r: f"{r['bytes_per_chunk']:,.0f}"),
    ("build peak MiB", lambda r: f"{r['build_rss_mib']:,.0f}"), ("load s", lambda r: f"{r['load_s']:.1f}"),
    ("RSS after load MiB", lambda r: f"{r['load_rss_mib']:,.0f}"),
    *[(f"in-process {m} p50/p99 ms, q/s", (lambda m: lambda r: "{p50:.2f} / {p99:.2f}, {qps:.0f}".format(**r[f"inproc_{m}"]))(m)) for m in MODES],
    ("recall@100", lambda r: f"{r['recall100']:.4f}"),
    ("served ready s", lambda r: f"{r['served_ready_s']:.0f}" if "served_ready_s" in r else "-"),
    ("served peak MiB", lambda r: f"{r['served_rss_mib']:,.0f}" if "served_rss_mib" in r else "-"),
    *[(f"HTTP {m} p50/p99 ms, req/s", (lambda m: lambda r: "{p50:.2f} / {p99:.2f}, {qps:.0f}".format(**r[f"served_{m}"]) if f"served_{m}" in r else "-")(m)) for m in MODES],
    ("HTTP hybrid 8 clients req/s", lambda r: f"{r['served_hybrid_8']['qps']:.0f}" if "served_hybrid_8" in r else "-"),
]


def plot(results: Path, path: Path) -> None:
    """Each cost against corpus size (log-log), one line per shard count, from a results file."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [json.loads(line) for line in results.read_text().splitlines() if line.strip()]
    panels = [
        ("build s", lambda r: r["build_s"]), ("index bytes per chunk", lambda r: r["bytes_per_chunk"]),
        ("load s", lambda r: r["load_s"]), ("RSS after load, MiB", lambda r: r["load_rss_mib"]),
        ("in-process p50 ms", None), ("served peak RSS, MiB", lambda r: r.get("served_rss_mib")),
        ("HTTP p50 ms", None), ("dense recall@100", lambda r: r["recall100"]),
    ]
    fig, axes = plt.subplots(2, 4, figsize=(16, 7))
    for ax, (title, value) in zip(axes.flat, panels):
        for shards in sorted({r["shards"] for r in rows}):
            mine = sorted((r for r in rows if r["shards"] == shards), key=lambda r: r["chunks"])
            if value is None:
                side = "inproc" if title.startswith("in-process") else "served"
                for mode in MODES:
                    points = [(r["chunks"], r[f"{side}_{mode}"]["p50"]) for r in mine if f"{side}_{mode}" in r]
                    ax.plot(*zip(*points), marker="o", label=f"{mode}, {shards} shards") if points else None
            else:
                points = [(r["chunks"], value(r)) for r in mine if value(r) is not None]
                ax.plot(*zip(*points), marker="o", label=f"{shards} shards") if points else None
        ax.set_xscale("log")
        ax.set_yscale("log" if "recall" not in title else "linear")
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    fig.suptitle(f"Cost against corpus size (chunks), {rows[0]['cores']} cores", fontsize=11)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    print(f"plot: {path}")


def print_rows(rows: list[dict], columns: list = COLUMNS) -> None:
    print("| " + " | ".join(name for name, _ in columns) + " |")
    print("|" + "---|" * len(columns))
    for row in rows:
        print("| " + " | ".join(cell(row) for _, cell in columns) + " |")


def print_tables(results: Path) -> None:
    """Every row of a results file, smallest corpus first, as two narrower tables (sizes and
    memory; latency and recall), each led by the chunk and shard counts."""
    rows = sorted((json.loads(line) for line in results.read_text().splitlines() if line.strip()),
                  key=lambda r: (r["chunks"], r["shards"]))
    print_rows(rows, COLUMNS[:8] + COLUMNS[12:14])
    print()
    print_rows(rows, COLUMNS[:3] + COLUMNS[11:12] + COLUMNS[8:11] + COLUMNS[14:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--chunks", type=int)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--queries", type=int, default=300, help="real questions sampled from the collections")
    parser.add_argument("--kind", default="auto", help="dense index kind (LLMFRAME_DENSE_INDEX): auto, flat, hnsw, ivf")
    parser.add_argument("--eval-dir", default=str(ROOT.parent / "shared" / "eval"))
    parser.add_argument("--workdir", type=Path, default=None, help="kept when given; else a temporary folder, removed")
    parser.add_argument("--skip-served", action="store_true")
    parser.add_argument("--results", type=Path, default=None, help="append the row as JSON to this file")
    parser.add_argument("--plot", type=Path, default=None, help="draw the rows of --results, log-log, into this PNG")
    parser.add_argument("--table", action="store_true", help="print every row of --results as two tables")
    parser.add_argument("--interleave", nargs="+", default=None, metavar="INDEX",
                        help="only: hybrid p50 of these indexes measured in alternating blocks, with ratios to the first")
    parser.add_argument("--phase", choices=["build", "inprocess"], help=argparse.SUPPRESS)
    parser.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.interleave:
        return interleaved(args)
    if args.plot is not None or args.table:
        return plot(args.results, args.plot) if args.plot is not None else print_tables(args.results)
    if not args.chunks or args.chunks < args.shards:
        parser.error("--chunks N is required, at least --shards")
    temporary = args.workdir is None
    args.workdir = Path(args.workdir or tempfile.mkdtemp(prefix="llmframe-scale-"))
    args.index = args.workdir / f"index-{args.chunks}-{args.shards}"
    if args.phase:
        phases = {"build": phase_build, "inprocess": phase_inprocess}
        args.result.write_text(json.dumps(phases[args.phase](args)))
        return None

    args.workdir.mkdir(parents=True, exist_ok=True)
    print(f"machine: {cpu_model()}, {os.cpu_count()} cores, {psutil.virtual_memory().total / 2**30:.0f} GiB; "
          f"{args.chunks:,} chunks in {args.shards} shards, dense {args.kind}, {args.queries} queries", flush=True)
    shutil.rmtree(args.index, ignore_errors=True)
    row: dict = {"chunks": args.chunks, "shards": args.shards, "kind": args.kind, "cores": os.cpu_count()}
    try:
        row.update(run_phase(args, "build"))
        row.update(run_phase(args, "inprocess"))
        if not args.skip_served:
            _, _, _, queries, _ = load_inputs(args)  # the same questions as in-process
            row.update(phase_served(args, queries))
    finally:
        if temporary:
            shutil.rmtree(args.workdir, ignore_errors=True)
    print_rows([row])
    if args.results is not None:
        with args.results.open("a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")
    return None


if __name__ == "__main__":
    main()
