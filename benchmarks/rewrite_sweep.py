"""Choose the PRF settings (feedback documents, terms, fusion weight) on tuning queries only.

    .venv/bin/python benchmarks/rewrite_sweep.py            # SciFact train + HotpotQA questions 1-100

Also the weight of the offline multi-query parts. The first hybrid pass is run once per collection; each (documents, terms) pair gives one
expanded pass; each weight is a fusion of the two (retrieve/rewrite.py, as the service and the
`prf` eval mode do). Scores come from written TREC run files.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.tuning import TUNE, label, load_split  # noqa: E402
from llmframe_ray.config import load_settings  # noqa: E402
from llmframe_ray.eval.runner import QUERY_BATCH, cached_index  # noqa: E402
from llmframe_ray.eval.trec import score_run, write_run  # noqa: E402
from llmframe_ray.ingest.build import stderr_progress  # noqa: E402
from llmframe_ray.models.embedder import load_embedder  # noqa: E402
from llmframe_ray.retrieve.pipeline import Pipeline  # noqa: E402
from llmframe_ray.generate.rewriting import offline_rewrite  # noqa: E402
from llmframe_ray.retrieve.rewrite import QueryRewrite, expand, feedback_terms, fuse_hit_lists  # noqa: E402
from llmframe_ray.types import SearchMode  # noqa: E402

DEPTH = 100


def hybrid(pipeline, texts, k):
    out = []
    for start in range(0, len(texts), QUERY_BATCH):
        out.extend(pipeline.search_batch(texts[start : start + QUERY_BATCH], SearchMode.HYBRID, k, truncate=True))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--docs", default="3,5,10")
    parser.add_argument("--terms", default="5,10")
    parser.add_argument("--weights", default="0.3,0.5,1.0")
    parser.add_argument("--multi-weights", default="0.1,0.25,0.5,1.0")
    args = parser.parse_args()
    params = load_settings().params()
    embedder = load_embedder(params.embedder)
    out = Path(tempfile.mkdtemp(prefix="rewrite-sweep-"))
    k = params.service.rewrite.rrf_k
    for name, split, first in TUNE:
        dataset = load_split(name, split, first)
        root = cached_index(dataset, params.index, embedder, params.indexes_dir, stderr_progress())
        pipeline = Pipeline.open(root, embedder, params.retrieval)
        qids = list(dataset.queries)
        texts = [dataset.queries[q] for q in qids]
        first_pass = hybrid(pipeline, texts, DEPTH)

        def score(lists) -> dict[str, float]:
            run = {q: [(h.doc_id, h.score) for h in hits] for q, hits in zip(qids, lists)}
            return score_run(write_run(out / "r.trec", run, tag="sweep"), dataset.qrels)

        base = score(first_pass)
        print(f"{label(name, split, first)}: hybrid nDCG@10 {base['nDCG@10']:.4f} R@100 {base['Recall@100']:.4f}")
        for docs in map(int, args.docs.split(",")):
            for terms in map(int, args.terms.split(",")):
                expanded = [expand(t, feedback_terms(t, hits, docs, terms)) for t, hits in zip(texts, first_pass)]
                second = hybrid(pipeline, expanded, DEPTH)
                for weight in map(float, args.weights.split(",")):
                    fused = [fuse_hit_lists([a, b], [1.0, weight], k, DEPTH) for a, b in zip(first_pass, second)]
                    m = score(fused)
                    print(f"  docs {docs:>3} terms {terms:>3} weight {weight:>4.2f}  nDCG@10 {m['nDCG@10']:.4f}  R@100 {m['Recall@100']:.4f}")
        variants = [offline_rewrite(QueryRewrite.MULTI_QUERY, t, [], params.service.rewrite).queries for t in texts]
        rest = hybrid(pipeline, [v for vs in variants for v in vs[1:]], DEPTH)
        split_at = list(itertools.accumulate(len(vs) - 1 for vs in variants))
        print(f"  multi-query (offline): {sum(len(vs) > 1 for vs in variants)} of {len(texts)} questions have parts")
        for weight in map(float, args.multi_weights.split(",")):
            fused = []
            for i, (vs, own) in enumerate(zip(variants, first_pass)):
                parts = rest[(split_at[i - 1] if i else 0) : split_at[i]]
                fused.append(fuse_hit_lists([own, *parts], [1.0] + [weight] * len(parts), k, DEPTH))
            m = score(fused)
            print(f"  multi-query weight {weight:>4.2f}  nDCG@10 {m['nDCG@10']:.4f}  R@100 {m['Recall@100']:.4f}")


if __name__ == "__main__":
    main()
