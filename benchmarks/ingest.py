"""Ingestion job throughput vs a bare embedding loop, on a generated corpus.

    .venv/bin/python benchmarks/ingest.py [--docs 50000] [--words 24] [--shards 4] [--repeats 1] [--text real]

Writes a JSONL corpus of `--docs` documents of `--words` words each (drawn, seeded, from the
SciFact corpus' vocabulary when ../shared/eval/scifact is present, else from this file's text;
with `--text real`, consecutive words of the evaluation collections' texts), one chunk per
document at the default chunk size. Then, in the same run and on the same chunk
texts:
  - bare: one process, the ONNX embedder with every core's threads, embedding all chunk texts
  - job:  `llmframe-ray ingest` (local Ray sized to the machine) into a fresh index directory
and prints chunks/s of both and their ratio (the issue's goal: >= 0.9), the job's time per
stage, the peak memory of the job (driver + Ray workers, sampled every 0.2 s), and index bytes
per chunk. Each figure is the median of `--repeats` runs.

`--plan-only` runs the job with `dry_run` instead (read, chunk, plan; nothing embedded) and prints
the driver's peak RSS (this process: Ray is started here and the plan is made here), to show
what the driver holds per chunk when it plans a large run.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import psutil  # noqa: E402

from llmframe_ray.batch.job import ingest  # noqa: E402
from llmframe_ray.config import load_settings  # noqa: E402
from llmframe_ray.ingest.readers import read_jsonl  # noqa: E402
from llmframe_ray.ingest.build import chunk_documents, make_chunker  # noqa: E402
from llmframe_ray.models.embedder import load_embedder  # noqa: E402


def vocabulary() -> list[str]:
    scifact = ROOT.parent / "shared" / "eval" / "scifact" / "corpus.jsonl"
    text = scifact.read_text(encoding="utf-8")[:3_000_000] if scifact.is_file() else Path(__file__).read_text()
    words = sorted(set(re.findall(r"[a-z]{3,12}", text.lower())))
    return words


def write_corpus(path: Path, docs: int, words: int, seed: int = 11, real: bool = False) -> None:
    """`real`: each document is `words` consecutive words of the evaluation collections' texts
    (real sentences), starting at evenly spaced places (spans overlap where the documents hold
    more words than the texts); otherwise words drawn at random from SciFact's vocabulary."""
    source = real_words() if real else None
    vocab = None if real else vocabulary()
    rng = random.Random(seed)
    with path.open("w", encoding="utf-8") as f:
        for i in range(docs):
            if source is not None:  # spread evenly over all the texts: the same mix at every size
                start = i * len(source) // docs
                text = " ".join(source[(start + k) % len(source)] for k in range(words))
            else:
                text = " ".join(rng.choice(vocab) for _ in range(words)).capitalize() + "."
            f.write(json.dumps({"_id": f"gen-{i:07d}", "title": "", "text": text}) + "\n")


def real_words() -> list[str]:
    """Every word of the five evaluation collections' document texts, in file order."""
    words: list[str] = []
    for name in ("scifact", "hotpotqa", "cranfield", "cisi", "medline"):
        corpus = ROOT.parent / "shared" / "eval" / name / "corpus.jsonl"
        if not corpus.is_file():
            sys.exit(f"--text real needs {corpus} (the evaluation collections beside the repository)")
        with corpus.open(encoding="utf-8") as f:
            for line in f:
                words.extend(json.loads(line)["text"].split())
    return words


class PeakMemory:
    """Peak summed RSS of this process and its descendants (Ray's raylet, GCS and workers)."""

    def __init__(self) -> None:
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        me = psutil.Process()
        while not self._stop.is_set():
            total = 0
            for proc in [me, *me.children(recursive=True)]:
                try:
                    total += proc.memory_info().rss
                except psutil.Error:
                    pass
            self.peak = max(self.peak, total)
            time.sleep(0.2)

    def __enter__(self) -> "PeakMemory":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--docs", type=int, default=50_000)
    parser.add_argument("--words", type=int, default=24)
    parser.add_argument("--text", choices=("words", "real"), default="words",
                        help="words: drawn at random from a vocabulary; real: spans of the evaluation collections' texts")
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--plot", type=Path, default=None,
                        help="write a PNG of the job's embedding progress over time (first run), against the bare loop's pace")
    parser.add_argument("--plan-only", action="store_true",
                        help="only read, chunk and plan (ingest --dry-run): the driver's peak memory")
    parser.add_argument("--graph", action="store_true",
                        help="ingest --graph: also the entity extraction stage and the graph build (their time counts in the job's)")
    args = parser.parse_args()

    settings = load_settings()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="llmframe-ingest-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    corpus = work / "corpus.jsonl"
    write_corpus(corpus, args.docs, args.words, real=args.text == "real")
    params = settings.params()
    if args.plan_only:
        return plan_memory(corpus, work, params, args)
    embedder = load_embedder(params.embedder)
    chunks = chunk_documents(read_jsonl(corpus), make_chunker(params.index, embedder))
    texts = [c.indexed_text for c in chunks]
    print(f"corpus: {args.docs} documents, {len(chunks)} chunks, {args.words} words each ({args.text}); "
          f"{os.cpu_count()} cores, {settings.threads} ONNX threads", flush=True)

    bare, job, stages, peaks, bytes_per_chunk, extracted = [], [], [], [], [], []
    for repeat in range(args.repeats):
        started = time.perf_counter()
        embedder.embed(texts)
        bare.append(len(texts) / (time.perf_counter() - started))
        print(f"  run {repeat + 1}: bare loop {bare[-1]:.1f} chunks/s", flush=True)

        index = work / f"index-{repeat}"
        shutil.rmtree(index, ignore_errors=True)
        with PeakMemory() as memory:
            started = time.perf_counter()
            timeline: list[tuple[float, str, int]] = []
            result = ingest([corpus], index, params, shards=args.shards, log=lambda line: None, graph=args.graph,
                            progress=lambda stage, done, total: timeline.append((time.perf_counter() - started, stage, done)))
            seconds = time.perf_counter() - started
        job.append(result.chunks_embedded / seconds)
        stages.append(result.seconds)
        peaks.append(memory.peak)
        size = sum(p.stat().st_size for p in (index / "versions").rglob("*") if p.is_file())
        bytes_per_chunk.append(size / max(1, result.chunks_read))
        print(f"  run {repeat + 1}: job {job[-1]:.1f} chunks/s ({seconds:.1f}s)", flush=True)
        if args.graph:
            extracted.append(result.chunks_extracted / result.seconds["extract"])
        if args.plot is not None and repeat == 0:
            plot_timeline(timeline, bare[-1], seconds, result.seconds["read+chunk"], args.plot)
            print(f"  plot: {args.plot}", flush=True)

    med = statistics.median
    print()
    print("| measure | value |")
    print("|---|---|")
    print(f"| chunks | {len(texts)} |")
    print(f"| bare ONNX loop, chunks/s | {med(bare):.1f} |")
    print(f"| ingestion job, chunks/s (end to end) | {med(job):.1f} |")
    print(f"| ratio job / bare | {med(job) / med(bare):.3f} |")
    print(f"| ingestion job, ms per chunk (end to end) | {1000 / med(job):.2f} |")
    for stage in stages[0]:
        print(f"| job stage {stage}, s | {med(s[stage] for s in stages):.1f} |")
    if extracted:
        print(f"| entity extraction stage, chunks/s (offline) | {med(extracted):.0f} |")
    print(f"| job peak RSS (driver + Ray processes), MiB | {med(peaks) / 2**20:.0f} |")
    print(f"| index bytes per chunk ({args.shards} shards) | {med(bytes_per_chunk):.0f} |")
    print(f"| cores | {os.cpu_count()} |")
    print(f"ratio job/bare = {med(job) / med(bare):.3f}")
    shutil.rmtree(work, ignore_errors=True) if args.workdir is None else None


def plan_memory(corpus: Path, work: Path, params, args: argparse.Namespace) -> None:
    """The driver's peak RSS when it reads, chunks and plans `corpus` (a dry run)."""
    import resource

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    with PeakMemory() as memory:
        started = time.perf_counter()
        result = ingest([corpus], work / "index-plan", params, shards=args.shards, log=lambda line: None, dry_run=True)
        seconds = time.perf_counter() - started
    driver = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print("| documents | chunks | read+chunk+plan s | driver peak RSS MiB (before the job) | job peak RSS MiB (driver + Ray) |")
    print("|---|---|---|---|---|")
    print(f"| {args.docs:,} | {result.chunks_read:,} | {seconds:.0f} | {driver:,.0f} ({before:,.0f}) | {memory.peak / 2**20:,.0f} |")
    if args.workdir is None:
        shutil.rmtree(work, ignore_errors=True)


def plot_timeline(timeline: list[tuple[float, str, int]], bare_rate: float, total_s: float, embed_start_s: float,
                  path: Path) -> None:
    """Chunks embedded so far against time since the job started (each point: a finished
    batch), beside the pace of the bare loop from the moment the embedding stage began."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = [(0.0, 0)] + [(t, done) for t, stage, done in timeline if stage == "embed chunks"]
    fig, ax = plt.subplots(figsize=(9, 4))
    ax.step([t for t, _ in points], [d for _, d in points], where="post", label="job: chunks embedded (as batches finish)")
    final = points[-1][1]
    end = embed_start_s + final / bare_rate
    ax.plot([embed_start_s, end], [0, final], color="grey", linestyle="--",
            label=f"bare ONNX loop's pace ({bare_rate:.0f} chunks/s) from the embedding stage's start")
    ax.axvline(total_s, color="black", linewidth=0.8, label=f"job ends ({total_s:.0f} s)")
    ax.set_xlabel("seconds since the job started")
    ax.set_ylabel("chunks embedded")
    ax.set_title(f"Ingestion job progress over time ({os.cpu_count()} cores)")
    ax.legend(loc="upper left")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
