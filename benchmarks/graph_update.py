"""What an index update costs the knowledge graph: a full build against an update from the
previous version's graph (graph/extractions.py, graph/store.py `previous`).

    .venv/bin/python benchmarks/graph_update.py --dataset hotpotqa --changes 1,10,100

On the cached index of a collection in ../shared/eval (the eval harness's cache): a full build
with an empty extraction store (every chunk read), then for each change size N, N documents
edited (the first sentence of another chunk appended to each of their chunks, so links move):
the update (only the edited chunks read; communities started from the previous graph; unchanged
communities keep their subtree and summary) against a full build of the same edited chunks.
Median of --repeats runs each; the updated and the full graph must have the same mentions.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import resource
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from llmframe_ray.config import load_settings  # noqa: E402
from llmframe_ray.eval.beir import load_beir  # noqa: E402
from llmframe_ray.eval.runner import cached_index  # noqa: E402
from llmframe_ray.graph.extract import OfflineExtractor  # noqa: E402
from llmframe_ray.graph.extractions import ExtractionStore  # noqa: E402
from llmframe_ray.graph.store import build_graph, index_chunks, sentences  # noqa: E402
from llmframe_ray.index.versions import IndexDirectory  # noqa: E402
from llmframe_ray.models.embedder import load_embedder  # noqa: E402

EVAL = ROOT.parent / "shared" / "eval"


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def edited(chunks, n_docs: int, seed: int):
    """The (shard, row, chunk) triples with n_docs documents' chunks edited."""
    rng = random.Random(seed)
    docs = sorted({c.doc_id for _, _, c in chunks})
    picked = set(rng.sample(docs, n_docs))
    donors = [c for _, _, c in chunks if c.doc_id not in picked]
    out = []
    for shard, row, chunk in chunks:
        if chunk.doc_id in picked:
            extra = (sentences(rng.choice(donors).text) or [""])[0]
            chunk = replace(chunk, text=f"{chunk.text} {extra}".strip())
        out.append((shard, row, chunk))
    return out


def same_mentions(a, b) -> bool:
    def pairs(g):
        m = g.mentions.tocoo()
        return {(g.chunk_fps[r], g.keys[c], float(w)) for r, c, w in zip(m.row, m.col, m.data)}

    return pairs(a) == pairs(b)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", default="hotpotqa")
    parser.add_argument("--changes", default="1,10,100")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    params = load_settings().params()
    dataset = load_beir(EVAL / args.dataset)
    root = cached_index(dataset, params.index, load_embedder(params.embedder), params.indexes_dir)
    loaded = IndexDirectory(root).load()
    chunks = list(index_chunks(list(zip(loaded.shard_ids, loaded.shards))))
    print(f"# {args.dataset}: {len(chunks)} chunks; CPU {cpu_model()}; {os.cpu_count()} cores; extractor {OfflineExtractor.name}")
    rows = []
    work = Path(tempfile.mkdtemp(prefix="graph-update-"))

    def timed(fn):
        seconds, result = [], None
        for _ in range(args.repeats):
            clock = time.perf_counter()
            result = fn()
            seconds.append(time.perf_counter() - clock)
        return statistics.median(seconds), result

    base_store = work / "base"
    full_s, base = timed(lambda: build_graph(chunks, store=ExtractionStore(_fresh(base_store), OfflineExtractor.name)))
    rows.append(("full build, empty store", len(chunks), full_s, base, None))
    for n in [int(x) for x in args.changes.split(",")]:
        changed = edited(chunks, n, seed=n)
        full_s, full = timed(lambda: build_graph(changed))
        update_s, update = timed(lambda: build_graph(
            changed, store=ExtractionStore(_copy(base_store, work / f"s{n}"), OfflineExtractor.name), previous=base))
        if not same_mentions(update, full):
            raise SystemExit(f"{n} documents: the updated graph's mentions differ from a full build's")
        rows.append((f"{n} documents edited: full build", len(chunks), full_s, full, None))
        rows.append((f"{n} documents edited: update", update.info["extracted"], update_s, update, full_s / update_s))
    print("| build | chunks read | seconds (median) | extract s | link s | communities s | communities | entities touched | "
          "level-0 kept whole | sub-communities kept | summaries kept | full / update |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for label, read, seconds, graph, ratio in rows:
        info = graph.info
        print(f"| {label} | {read} | {seconds:.2f} | {info['extract_seconds']:.2f} | {info['link_seconds']:.2f} | "
              f"{info['community_seconds']:.2f} | {len(graph.communities)} | {info.get('entities_touched', '-')} | "
              f"{info.get('level0_kept', '-')} | {info.get('communities_kept', '-')} | "
              f"{info.get('summaries_kept', '-')} | {f'{ratio:.2f}x' if ratio else '-'} |")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS {peak:.0f} MiB; extraction {len(chunks) / base.info['extract_seconds']:.0f} chunks/s (empty store)")


def _fresh(path: Path) -> Path:
    import shutil

    shutil.rmtree(path, ignore_errors=True)
    return path


def _copy(src: Path, dst: Path) -> Path:
    import shutil

    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst)
    return dst


if __name__ == "__main__":
    main()
