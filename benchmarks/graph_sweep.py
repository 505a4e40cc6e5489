"""Choose the graph ranker's settings and its RRF weight in hybrid-graph on tuning queries only.

    .venv/bin/python benchmarks/graph_sweep.py      # SciFact train + HotpotQA questions 1-100

For each collection: hybrid once, then hybrid-graph for every (seed types, depth, seed cap, name-embedding threshold, weight), each
scored from a written TREC run file (nDCG@10, and R_all@10 where every query has two or more
relevant documents). The knowledge graph is built with the cached index on first use.

Then the one-standard-error rule over those settings: per collection, the best by nDCG@10 and
every setting within one standard error (of a query's paired difference from the best) of it;
at the end, the settings within it on every collection and, of them, the one with the least
graph weight (how LLMFRAME_GRAPH_WEIGHT's default was chosen, with the other settings at
their defaults: `--seeds titles --depths 2 --weights 0.1,0.25,0.4,0.5,0.6,0.75,1.0,1.5,2.0`).
"""

from __future__ import annotations

import argparse
import itertools
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.tuning import TUNE, label, load_split  # noqa: E402
from llmframe_ray.config import load_settings  # noqa: E402
from llmframe_ray.eval.runner import multi_hop, run_mode  # noqa: E402
from llmframe_ray.eval.trec import score_all_found, score_per_query, within_one_error, write_run  # noqa: E402
from llmframe_ray.graph.build import ensure_graph  # noqa: E402
from llmframe_ray.graph.extract import NAME, PHRASE, QUOTED, TITLE  # noqa: E402
from llmframe_ray.graph.params import GraphParams  # noqa: E402
from llmframe_ray.eval.runner import cached_index  # noqa: E402
from llmframe_ray.ingest.build import stderr_progress  # noqa: E402
from llmframe_ray.index.versions import IndexDirectory  # noqa: E402
from llmframe_ray.models.embedder import load_embedder  # noqa: E402
from llmframe_ray.retrieve.pipeline import Pipeline  # noqa: E402
from llmframe_ray.types import SearchMode  # noqa: E402

SEEDS = {  # seed types, and the fewest words a NAME seed has
    "all": ((TITLE, QUOTED, NAME, PHRASE), 1), "names": ((TITLE, QUOTED, NAME), 1), "names2": ((TITLE, QUOTED, NAME), 2),
    "titles": ((TITLE, QUOTED), 1),
}


def scores(path: Path, dataset) -> tuple[dict[str, float], np.ndarray]:
    """The run's means (nDCG@10, Recall@100, and R_all@10 on a multi-hop collection) and its
    per-query nDCG@10."""
    per_query = score_per_query(path, dataset.qrels)
    out = {name: float(np.mean(list(values.values()))) for name, values in per_query.items()}
    if multi_hop(dataset):
        out.update(score_all_found(path, dataset.qrels, (10,)))
    return out, np.array(list(per_query["nDCG@10"].values()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--weights", default="0.1,0.25,0.5,1.0")
    parser.add_argument("--depths", default="1,2")
    parser.add_argument("--seeds", default="all,names,names2,titles")
    parser.add_argument("--max-seed-chunks", default="20", help="Comma-separated caps (none: no cap).")
    parser.add_argument("--name-match", default="off", help="Comma-separated cosine thresholds for seeds by name embedding (off: none).")
    args = parser.parse_args()
    params = load_settings().params()
    embedder = load_embedder(params.embedder)
    out = Path(tempfile.mkdtemp(prefix="graph-sweep-"))
    weights = [float(w) for w in args.weights.split(",")]
    depths = [int(d) for d in args.depths.split(",")]
    seeds = args.seeds.split(",")
    kept: set[tuple] | None = None
    for name, split, first in TUNE:
        dataset = load_split(name, split, first)
        root = cached_index(dataset, params.index, embedder, params.indexes_dir, stderr_progress())
        ensure_graph(root, embed=embedder.embed)
        pipeline = Pipeline.open(root, embedder, params.retrieval)
        loaded = IndexDirectory(root).load()
        base, _ = scores(write_run(out / f"{name}-hybrid.trec", run_mode(pipeline, dataset, SearchMode.HYBRID), "hybrid"), dataset)
        print(f"\n{label(name, split, first)}: hybrid " + " ".join(f"{k} {v:.4f}" for k, v in base.items()))
        print(f"{'seeds':<6} {'depth':>5} {'cap':>5} {'names':>5} {'weight':>6} {'nDCG@10':>8} {'delta':>7}" + ("  R_all@10  delta" if "R_all@10" in base else ""))
        caps = [None if c == "none" else int(c) for c in args.max_seed_chunks.split(",")]
        matches = [None if m == "off" else float(m) for m in args.name_match.split(",")]
        tried: dict[tuple, np.ndarray] = {}
        for seed, depth, cap, match in itertools.product(seeds, depths, caps, matches):
            graph_params = GraphParams(depth=depth, seed_types=SEEDS[seed][0], min_name_words=SEEDS[seed][1], max_seed_chunks=cap,
                                       name_match=match)
            pipeline.load_graph(loaded.path, loaded.shard_ids, graph_params)
            for weight in weights:
                fusion = replace(params.retrieval.fusion, weights={**params.retrieval.fusion.weights, "graph": weight})
                pipeline.retrieval = replace(params.retrieval, fusion=fusion)
                run = run_mode(pipeline, dataset, SearchMode.HYBRID_GRAPH)
                got, per_query = scores(write_run(out / f"{name}-{seed}-{depth}-{cap}-{match}-{weight}.trec", run, "hybrid-graph"), dataset)
                line = (f"{seed:<6} {depth:>5} {str(cap):>5} {str(match or 'off'):>5} {weight:>6} {got['nDCG@10']:>8.4f} "
                        f"{got['nDCG@10'] - base['nDCG@10']:>+7.4f}")
                if "R_all@10" in got:
                    line += f"  {got['R_all@10']:>8.4f} {got['R_all@10'] - base['R_all@10']:>+6.4f}"
                print(line, flush=True)
                tried[(seed, depth, cap, match, weight)] = per_query
        best, error, near = within_one_error(tried)
        print(f"best {best}, nDCG@10 {tried[best].mean():.4f}; within one standard error of a query's paired difference "
              f"(largest {error:.4f}): " + "; ".join(str(key) for key in near))
        kept = set(near) if kept is None else kept & set(near)
    if kept:
        print("\nwithin one standard error of the best on every set: " + "; ".join(str(key) for key in sorted(kept, key=str))
              + f"\nthe most cautious of them (least graph weight): {min(kept, key=lambda key: (key[-1], str(key)))}")
    else:
        print("\nno setting is within one standard error of the best on every set")


if __name__ == "__main__":
    main()
