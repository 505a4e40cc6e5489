"""Sweep the hybrid fusion settings (depth, RRF k, dense weight) on a BEIR split.

    .venv/bin/python benchmarks/fusion_sweep.py --dataset ../shared/eval/scifact --split train

Fusion defaults are chosen on SciFact's *train* judgments with this script, never on test.
Each ranker's document list is fetched once (depth 1000); every setting is then fused from
those lists exactly as the pipeline does (RRF over each ranker's top `depth` documents),
written as a TREC run and scored from the file.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from llmframe_ray.config import load_settings  # noqa: E402
from llmframe_ray.eval.beir import load_beir  # noqa: E402
from llmframe_ray.eval.runner import cached_index, run_mode  # noqa: E402
from llmframe_ray.eval.trec import score_run, write_run  # noqa: E402
from llmframe_ray.ingest.build import stderr_progress  # noqa: E402
from llmframe_ray.models.embedder import load_embedder  # noqa: E402
from llmframe_ray.retrieve.pipeline import Pipeline  # noqa: E402
from llmframe_ray.retrieve.fusion import reciprocal_rank_fusion  # noqa: E402
from llmframe_ray.types import RankedList, SearchMode  # noqa: E402

MAX_DEPTH = 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", required=True)
    parser.add_argument("--split", default="train")
    parser.add_argument("--depths", default="50,100,200,1000")
    parser.add_argument("--ks", default="20,60,100")
    parser.add_argument("--dense-weights", default="0.8,1.0,1.2,1.5")
    args = parser.parse_args()

    settings = load_settings()
    params = settings.params()
    embedder = load_embedder(params.embedder)
    dataset = load_beir(args.dataset, args.split)
    # the index covers the corpus only, so the split does not change the cache key
    root = cached_index(dataset, params.index, embedder, params.indexes_dir, stderr_progress())
    pipeline = Pipeline.open(root, embedder, params.retrieval)
    lists = {mode: run_mode(pipeline, dataset, mode, MAX_DEPTH) for mode in (SearchMode.BM25, SearchMode.DENSE)}
    out = Path(tempfile.mkdtemp(prefix="fusion-sweep-"))

    def score(results) -> dict[str, float]:
        return score_run(write_run(out / "run.trec", results, tag="sweep"), dataset.qrels)

    print(f"dataset {dataset.name}, split {args.split}, {len(dataset.queries)} judged queries")
    for mode, results in lists.items():
        cut = {q: r[:100] for q, r in results.items()}
        m = score(cut)
        print(f"{mode.value:<8} nDCG@10 {m['nDCG@10']:.4f}  Recall@100 {m['Recall@100']:.4f}")
    print(f"{'depth':>6} {'k':>5} {'w_dense':>8} {'nDCG@10':>8} {'Recall@100':>11}")
    grid = itertools.product(
        [int(d) for d in args.depths.split(",")],
        [int(k) for k in args.ks.split(",")],
        [float(w) for w in args.dense_weights.split(",")],
    )
    for depth, k, weight in grid:
        fused = {}
        for qid in lists[SearchMode.BM25]:
            ranked = [
                RankedList(mode.value, [d for d, _ in lists[mode][qid][:depth]], [s for _, s in lists[mode][qid][:depth]])
                for mode in (SearchMode.BM25, SearchMode.DENSE)
            ]
            items = reciprocal_rank_fusion(ranked, k=k, weights={"dense": weight}, limit=100)
            fused[qid] = [(f.key, f.score) for f in items]
        m = score(fused)
        print(f"{depth:>6} {k:>5} {weight:>8.2f} {m['nDCG@10']:>8.4f} {m['Recall@100']:>11.4f}")


if __name__ == "__main__":
    main()
