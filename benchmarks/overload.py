"""Overload: the served app at several times its capacity, then back to normal load.

    API_SECRET_KEY=k .venv/bin/llmframe-ray serve --index INDEX &
    API_SECRET_KEY=k .venv/bin/python benchmarks/overload.py [--url http://127.0.0.1:8000]
        [--factor 4] [--seconds 60] [--clients 32] [--measure-seconds 10] [--deadline-s 60]

1. capacity: `clients` closed-loop clients send SciFact test queries (hybrid /v1/search, top_k 10)
   back to back for `measure-seconds`; capacity = successful requests/s.
2. overload: requests are started at `factor` x capacity per second for `seconds`, whatever the
   answers (open loop: a new connection when every open one is busy). Every request must be
   answered (200, or a 408 / 429 / 503 / 504 that sheds load) within the server's request deadline
   (LLMFRAME_REQUEST_TIMEOUT_S, `--deadline-s` here); a transport error or a later answer is a
   failure. The replicas' summed RSS is sampled every 0.5 s.
3. after: phase 1 again: the app must serve as before.

The load generator is a minimal HTTP/1.1 keep-alive client on asyncio streams (JSON bodies with
Content-Length only), not httpx: at hundreds of requests/s on the app's own two cores, httpx would
spend more CPU per request than the server. It runs in this process, on the same cores as the
server. Prints one table row per phase and exits 1 if a request failed or answered late.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import statistics
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lean_http import Pool  # noqa: E402  (benchmarks/, this script's folder)
from llmframe_ray.eval.beir import load_beir  # noqa: E402


def _serve_bench():
    """benchmarks/serve.py, for its replica memory sampler and CPU description."""
    spec = importlib.util.spec_from_file_location("serve_bench", ROOT / "benchmarks" / "serve.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["serve_bench"] = module  # dataclasses look their module up here
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


SHED = ("408", "429", "503", "504")  # statuses that shed load: an answer, not a failure
ANSWERED = ("200", *SHED)


@dataclass
class Phase:
    name: str
    seconds: float
    latencies: dict[str, list[float]] = field(default_factory=dict)  # outcome -> seconds
    offered_per_s: float | None = None

    def record(self, outcome: str, seconds: float) -> None:
        self.latencies.setdefault(outcome, []).append(seconds)

    @property
    def counts(self) -> Counter:
        return Counter({k: len(v) for k, v in self.latencies.items()})

    def ok_per_s(self) -> float:
        return len(self.latencies.get("200", [])) / self.seconds


async def one(pool: Pool, phase: Phase, key: str, query: str) -> None:
    body = json.dumps({"query": query, "mode": "hybrid", "top_k": 10}).encode()
    start = time.perf_counter()
    try:
        status, _ = await pool.request("/v1/search", {"X-API-Key": key}, body)
        outcome = str(status)
    except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
        outcome = type(exc).__name__
    phase.record(outcome, time.perf_counter() - start)


async def closed_loop(pool: Pool, key: str, queries: list[str], clients: int, seconds: float, name: str) -> Phase:
    phase = Phase(name, seconds)
    stop = time.perf_counter() + seconds

    async def client(offset: int) -> None:
        i = offset
        while time.perf_counter() < stop:
            await one(pool, phase, key, queries[i % len(queries)])
            i += 1

    await asyncio.gather(*(client(c * len(queries) // clients) for c in range(clients)))
    return phase


async def open_loop(pool: Pool, key: str, queries: list[str], rate: float, seconds: float) -> Phase:
    phase = Phase("overload", seconds, offered_per_s=rate)
    tasks = []
    start = time.perf_counter()
    for i in range(int(rate * seconds)):
        delay = start + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.ensure_future(one(pool, phase, key, queries[i % len(queries)])))
    await asyncio.gather(*tasks)
    return phase


def row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def describe(phase: Phase, deadline_s: float, memory_mib: float | None) -> str:
    counts = phase.counts
    everything = [s for v in phase.latencies.values() for s in v]
    ok = phase.latencies.get("200", [])
    shed = sum(counts[c] for c in SHED)
    other = sum(n for c, n in counts.items() if c not in ANSWERED)
    late = sum(1 for s in everything if s > deadline_s)
    offered = f"{phase.offered_per_s:.0f}" if phase.offered_per_s else "closed loop"
    return row([
        phase.name, offered, str(sum(counts.values())), f"{phase.ok_per_s():.1f}",
        " ".join(f"{c}:{counts[c]}" for c in SHED if counts[c]) or "0", str(shed),
        str(other), f"{statistics.median(ok) * 1e3:.0f}" if ok else "-",
        f"{max(everything):.2f}" if everything else "-", str(late),
        f"{memory_mib:.0f}" if memory_mib is not None else "-",
    ])


async def main_async(args: argparse.Namespace, queries: list[str]) -> int:
    bench = _serve_bench()
    node = bench.serving_node(args.url)
    pool = Pool(args.url)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(f"machine: {bench.cpu_description()}, {cores} cores; {args.url}; SciFact test queries, hybrid, top_k 10")
    print(row(["phase", "offered req/s", "sent", "200/s", "shed by status", "shed", "failed", "p50 ms (200)",
               "max s (all)", f"over {args.deadline_s:g} s", "replicas RSS MiB (peak)"]))
    print(row(["---"] * 11))
    failures = 0
    with bench.ReplicaMemory(node) as memory:
        before = await closed_loop(pool, args.key, queries, args.clients, args.measure_seconds, "capacity")
        print(describe(before, args.deadline_s, memory.peak_bytes / 2**20), flush=True)
        capacity = before.ok_per_s()
        if capacity <= 0:
            print("the app answered nothing in the capacity phase", file=sys.stderr)
            return 1
        overload = await open_loop(pool, args.key, queries, args.factor * capacity, args.seconds)
        print(describe(overload, args.deadline_s, memory.peak_bytes / 2**20), flush=True)
        after = await closed_loop(pool, args.key, queries, args.clients, args.measure_seconds, "after")
        print(describe(after, args.deadline_s, memory.peak_bytes / 2**20), flush=True)
    for phase in (before, overload, after):
        kinds = {c: n for c, n in phase.counts.items() if c not in ANSWERED}
        if kinds:
            print(f"{phase.name}: failed by kind: {dict(sorted(kinds.items()))}")
        everything = [s for v in phase.latencies.values() for s in v]
        failures += sum(n for c, n in phase.counts.items() if c not in ANSWERED)
        failures += sum(1 for s in everything if s > args.deadline_s)
    print(f"connections opened: {pool.opened}; after/capacity throughput: {after.ok_per_s() / capacity:.2f}")
    pool.close()
    return 1 if failures else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--key", default=os.environ.get("API_SECRET_KEY"))
    parser.add_argument("--dataset", default=str(ROOT.parent / "shared" / "eval" / "scifact"))
    parser.add_argument("--factor", type=float, default=4.0)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--measure-seconds", type=float, default=10.0)
    parser.add_argument("--deadline-s", type=float, default=60.0, help="the server's LLMFRAME_REQUEST_TIMEOUT_S")
    args = parser.parse_args()
    if not args.key:
        parser.error("an API key is needed: --key or API_SECRET_KEY")
    queries = list(load_beir(args.dataset, "test").queries.values())
    sys.exit(asyncio.run(main_async(args, queries)))


if __name__ == "__main__":
    main()
