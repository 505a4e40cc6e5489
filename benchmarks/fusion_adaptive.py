"""Per-query fusion weights from the rankers' score shapes, against equal-weight RRF.

    .venv/bin/python benchmarks/fusion_adaptive.py --tune          # SciFact train + HotpotQA questions 1-100
    .venv/bin/python benchmarks/fusion_adaptive.py --report        # every collection's test queries

Hybrid RRF with equal weights can fall below its better ranker when the other is much weaker on
a corpus. A ranker that is sure of a query tends to put a few documents well clear of the rest:
its top score stands out of its top-N scores. `shape` weighting gives each ranker the weight
    w = 2 * c_r ** p / (c_bm25 ** p + c_dense ** p),   c_r = (s_1 - mean(s_1..s_N)) / std(s_1..s_N)
(equal weights when p = 0), per query, from the document scores each ranker returned; RRF then
fuses as usual. Settings are chosen with --tune only (SciFact train judgments, the first 100
HotpotQA questions); --report prints every collection's test figures for the chosen setting.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.tuning import TUNE, label, load_split  # noqa: E402
from llmframe_ray.config import load_settings  # noqa: E402
from llmframe_ray.eval.runner import cached_index, run_mode  # noqa: E402
from llmframe_ray.eval.trec import score_run, write_run  # noqa: E402
from llmframe_ray.ingest.build import stderr_progress  # noqa: E402
from llmframe_ray.models.embedder import load_embedder  # noqa: E402
from llmframe_ray.retrieve.fusion import reciprocal_rank_fusion  # noqa: E402
from llmframe_ray.retrieve.pipeline import Pipeline  # noqa: E402
from llmframe_ray.types import RankedList, SearchMode  # noqa: E402

REPORT = [(name, "test", None) for name in ("scifact", "cranfield", "cisi", "medline", "hotpotqa")]


def confidence(scores: list[float], n: int) -> float:
    top = np.asarray(scores[:n], dtype=np.float64)
    if len(top) < 2 or top.std() == 0:
        return 1.0
    return float((top[0] - top.mean()) / top.std())


def fuse(lists, depth: int, k: int, power: float, n: int) -> dict:
    fused = {}
    for qid in lists[SearchMode.BM25]:
        ranked, conf = [], {}
        for mode in (SearchMode.BM25, SearchMode.DENSE):
            pairs = lists[mode][qid][:depth]
            ranked.append(RankedList(mode.value, [d for d, _ in pairs], [s for _, s in pairs]))
            conf[mode.value] = max(confidence([s for _, s in pairs], n), 1e-3) ** power
        total = sum(conf.values())
        weights = {name: 2 * c / total for name, c in conf.items()}
        items = reciprocal_rank_fusion(ranked, k=k, weights=weights, limit=100)
        fused[qid] = [(f.key, f.score) for f in items]
    return fused


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tune", action="store_true")
    parser.add_argument("--report", action="store_true")
    parser.add_argument("--powers", default="0,0.5,1,2")
    parser.add_argument("--tops", default="10,20")
    args = parser.parse_args()
    settings = load_settings()
    params = settings.params()
    fusion = params.retrieval.fusion
    embedder = load_embedder(params.embedder)
    out = Path(tempfile.mkdtemp(prefix="fusion-adaptive-"))
    specs = (TUNE if args.tune else []) + (REPORT if args.report else [])
    grid = [(p, n) for p in map(float, args.powers.split(",")) for n in map(int, args.tops.split(","))]
    print(f"RRF k {fusion.rrf_k}, depth {fusion.fusion_depth}; rows: power p, top N (p = 0: equal weights)")
    for name, split, first in specs:
        dataset = load_split(name, split, first)
        root = cached_index(dataset, params.index, embedder, params.indexes_dir, stderr_progress())
        pipeline = Pipeline.open(root, embedder, params.retrieval)
        lists = {m: run_mode(pipeline, dataset, m, fusion.fusion_depth) for m in (SearchMode.BM25, SearchMode.DENSE)}
        singles = {m.value: score_run(write_run(out / "r.trec", {q: r[:100] for q, r in lists[m].items()}, tag="x"), dataset.qrels)["nDCG@10"] for m in lists}
        print(f"{label(name, split, first)}: bm25 {singles['bm25']:.4f}, dense {singles['dense']:.4f}")
        for power, n in grid:
            metrics = score_run(write_run(out / "r.trec", fuse(lists, fusion.fusion_depth, fusion.rrf_k, power, n), tag="x"), dataset.qrels)
            print(f"  p {power:>4.1f}  N {n:>3}  nDCG@10 {metrics['nDCG@10']:.4f}  R@100 {metrics['Recall@100']:.4f}")


if __name__ == "__main__":
    main()
