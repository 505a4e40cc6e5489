"""Reranking quality against depth, on held-out *training* queries (never test): the curve that
chooses LLMFRAME_RERANKER_DEPTH, and the pairs/s each variant gets on the same pairs.

    .venv/bin/python benchmarks/rerank_depth.py --model M [--model M2 ...] [--precision fp32 --precision int8]
        [--max-length 192 --max-length 128] [--depths 10,20,30,40,50] [--dataset ../shared/eval/scifact]

The queries are the tenth of the split that `train-reranker` holds out (same seed and share as
the first model's card), so no model trained with that card's settings has seen them. Each
query's hybrid top max(depths) documents are scored once per variant; depth d reorders the
first d of them (scores fused with the hybrid order's, as served by default; RRF of the two
orders; the cross-encoder alone) and keeps the rest in hybrid order. Scores of a pair do not
depend on the other pairs of its batch beyond float rounding, so one pass serves every depth.
Prints nDCG@10 per depth and pairs/s, and per variant the depth the one-standard-error rule
picks for the configured order (LLMFRAME_RERANKER_FUSION, at LLMFRAME_RERANKER_WEIGHT or the
home weight 1): the least depth whose mean nDCG@10 is within one standard error (of a query's
paired difference) of the best depth's (`eval/trec.py: within_one_error`, the rule that chose
the graph weight).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from llmframe_ray.config import load_settings  # noqa: E402
from llmframe_ray.eval.beir import load_beir  # noqa: E402
from llmframe_ray.eval.runner import cached_index  # noqa: E402
from llmframe_ray.eval.trec import score_per_query, within_one_error, write_run  # noqa: E402
from llmframe_ray.models.cross_encoder import CrossEncoder, read_card  # noqa: E402
from llmframe_ray.models.embedder import load_embedder  # noqa: E402
from llmframe_ray.models.two_tower import TwoTowerScorer  # noqa: E402
from llmframe_ray.retrieve.pipeline import Pipeline  # noqa: E402
from llmframe_ray.retrieve.rerank import RerankFusion, RerankParams  # noqa: E402
from llmframe_ray.train.reranker import split_queries  # noqa: E402
from llmframe_ray.types import SearchMode  # noqa: E402


def ndcg10(results: dict, qrels) -> float:
    return float(per_query_ndcg10(results, qrels).mean())


def per_query_ndcg10(results: dict, qrels) -> np.ndarray:
    """nDCG@10 of every judged query, in the order of `qrels`."""
    run = {qid: [(h.doc_id, h.score) for h in hits] for qid, hits in results.items()}
    with tempfile.TemporaryDirectory() as work:
        return np.array(list(score_per_query(write_run(Path(work) / "run.trec", run, tag="depth"), qrels)["nDCG@10"].values()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", action="append", required=True, help="a reranker folder (repeat for more)")
    parser.add_argument("--precision", action="append", default=None, help="fp32 and/or int8 (default: both)")
    parser.add_argument("--max-length", action="append", type=int, default=None, help="tokens per pair (default: each card's)")
    parser.add_argument("--depths", default="10,20,30,40,50")
    parser.add_argument("--dataset", default=str(ROOT.parent / "shared" / "eval" / "scifact"))
    parser.add_argument("--split", default="train")
    parser.add_argument("--towers", action="store_true", help="score with each model's two towers (models/two_tower.py)")
    parser.add_argument("--batch-size", type=int, default=32, help="pairs per ONNX Runtime call")
    parser.add_argument("--rrf-k", type=int, default=None, help="default: LLMFRAME_RERANKER_RRF_K")
    args = parser.parse_args()
    if args.split == "test":
        parser.error("depth is chosen on training queries; --split test is what the eval harness reports")
    depths = sorted({int(d) for d in args.depths.split(",")})
    settings = load_settings()
    params = settings.params()
    rrf_k = args.rrf_k if args.rrf_k is not None else params.rerank.rrf_k
    weight = params.rerank.weight_for(1.0)  # LLMFRAME_RERANKER_WEIGHT, else at home (the model's own corpus)
    dataset = load_beir(Path(args.dataset), args.split)
    config = read_card(Path(args.model[0])).get("config") or {}
    _, held = split_queries(list(dataset.queries), config.get("validation_fraction", 0.1), config.get("seed", 13))
    embedder = load_embedder(params.embedder)
    pipeline = Pipeline.open(cached_index(dataset, params.index, embedder, params.indexes_dir), embedder, params.retrieval)
    hybrid = {q: pipeline.search(dataset.queries[q], SearchMode.HYBRID, top_k=100, truncate=True, rerank=False) for q in held}
    qrels = {q: dataset.qrels[q] for q in held}
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, {settings.threads} ONNX Runtime threads; "
          f"{len(held)} held-out {dataset.name} {args.split} queries (seed {config.get('seed', 13)}), hybrid nDCG@10 "
          f"{ndcg10(hybrid, qrels):.4f}; RRF k {rrf_k}; the cross-encoder's weight {weight:g}")
    kinds = (RerankFusion.SCORE, RerankFusion.RRF, RerankFusion.NONE)
    label = "/".join("ce" if kind is RerankFusion.NONE else kind.value for kind in kinds)
    print(f"{'model':<28} {'prec':<5} {'len':>4} {'pairs/s':>8} " + " ".join(f"{'d' + str(d) + ' ' + label:>22}" for d in depths))
    deepest = max(depths)
    rules = []
    for model in args.model:
        for precision in args.precision or ["fp32", "int8"]:
            for max_length in args.max_length or [None]:
                kind = TwoTowerScorer if args.towers else CrossEncoder
                encoder = kind(Path(model), precision=precision, threads=settings.threads, max_length=max_length, batch_size=args.batch_size)
                started = time.perf_counter()
                scores = {q: encoder.score(dataset.queries[q], [h.passage for h in hits[:deepest]]) for q, hits in hybrid.items()}
                rate = sum(len(s) for s in scores.values()) / (time.perf_counter() - started)
                cells, fused = [], {}
                for depth in depths:
                    steps = RerankParams(depth=depth, rrf_k=rrf_k)
                    figures = [
                        per_query_ndcg10({q: steps.apply(dataset.queries[q], hits, scores[q][:depth], fusion, weight) for q, hits in hybrid.items()}, qrels)
                        for fusion in kinds
                    ]
                    fused[(depth,)] = figures[kinds.index(params.rerank.fusion)]
                    cells.append("/".join(f"{f.mean():.4f}" for f in figures))
                print(f"{Path(model).name + (' (towers)' if args.towers else ''):<28} {precision:<5} {encoder.max_length:>4} {rate:>8.1f} " + " ".join(f"{c:>22}" for c in cells))
                best, error, near = within_one_error(fused)
                rules.append((Path(model).name, precision, encoder.max_length, best[0], float(fused[best].mean()), error, near))
    print(f"one-standard-error rule, the configured order ({params.rerank.fusion.value}; the least depth within one standard error of the best):")
    for name, precision, length, best, mean, error, near in rules:
        print(f"  {name} {precision} {length}: best depth {best} ({mean:.4f}), largest standard error {error:.4f}, "
              f"within one: {', '.join(str(k[0]) for k in sorted(near))}; the rule's depth: {min(near)[0]}")


if __name__ == "__main__":
    main()
