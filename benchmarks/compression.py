"""Contextual compression against SciFact's gold rationale sentences.

    .venv/bin/python benchmarks/compression.py --dataset ../shared/eval/scifact [--split train|dev]

For every claim, hybrid retrieval (the pipeline's defaults) returns the top 5 documents; each is
compressed with the stage's own functions (retrieve/compress.py) from the release's sentence
split of its abstract, scored by the query encoder (the offline scorer). Reported per token
budget: the share of the gold rationale sentences *in the retrieved documents* that are kept,
and the share of those documents' tokens that are kept. Tune on `--split train`
(claims_train.jsonl); report on `dev` (claims_dev.jsonl: the 300 BEIR test claims). The last
line is `rationale_kept=<share> tokens_kept=<share>` at the default budget (CompressionParams).
"""

from __future__ import annotations

import argparse
import itertools
import json
import pickle
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.serve import cpu_description  # noqa: E402
from llmframe_ray.config import load_settings  # noqa: E402
from llmframe_ray.eval.beir import load_beir  # noqa: E402
from llmframe_ray.eval.runner import cached_index  # noqa: E402
from llmframe_ray.ingest.build import stderr_progress  # noqa: E402
from llmframe_ray.models.embedder import load_embedder  # noqa: E402
from llmframe_ray.retrieve import compress  # noqa: E402
from llmframe_ray.retrieve.pipeline import Pipeline  # noqa: E402

TOP = 5
BUDGETS = (150, 250, 350, 450, 550, 700, 900)


def load_claims(folder: Path, split: str) -> list[dict]:
    name = {"train": "claims_train.jsonl", "dev": "claims_dev.jsonl", "test": "claims_dev.jsonl"}[split]
    return [json.loads(line) for line in (folder / name).read_text().splitlines() if line.strip()]


def gather(pipeline, embedder, claims, abstracts, titled_sentences: bool = True) -> list[dict]:
    """Per claim: the top documents' sentences, each sentence's model score and lexical
    overlap, and which sentences are gold rationales. A document's sentence vectors do not
    depend on the claim: each retrieved document is embedded once."""
    texts = [c["claim"] for c in claims]
    found = pipeline.search_batch(texts, "hybrid", TOP, truncate=True)
    docs_of = [[h.doc_id for h in hits if h.doc_id in abstracts] for hits in found]
    needed = sorted({d for docs in docs_of for d in docs})
    title = (lambda d: abstracts[d]["title"]) if titled_sentences else (lambda d: "")
    titled = [compress.scoring_text(title(d), s) for d in needed for s in abstracts[d]["abstract"]]
    print(f"embedding {len(titled)} sentences of {len(needed)} retrieved documents and {len(texts)} claims", file=sys.stderr)
    flat = list(embedder.embed(titled)) if titled else []
    vectors, at = {}, 0
    for d in needed:
        n = len(abstracts[d]["abstract"])
        vectors[d], at = flat[at : at + n], at + n
    queries = embedder.embed(texts)
    cases = []
    for claim, query, docs in zip(claims, queries, docs_of):
        split = compress.Split.of([abstracts[d]["abstract"] for d in docs])
        gold = {(d, i) for d, ev in claim["evidence"].items() for e in ev for i in e["sentences"]}
        flags = [(d, i) in gold for d in docs for i in range(len(abstracts[d]["abstract"]))]
        cases.append({
            "split": split, "gold": flags,
            "model": compress.cosines(query, [v for d in docs for v in vectors[d]]),
            "overlap": compress.lexical_overlap(claim["claim"], split.sentences),
        })
    return cases


def measure(cases, params) -> tuple[float, float]:
    kept_gold = all_gold = kept_tokens = all_tokens = 0
    for case in cases:
        split = case["split"]
        keep = compress.select(split, compress.combined(case["model"], case["overlap"], params, case["split"].owner), params)
        kept_gold += sum(k and g for k, g in zip(keep, case["gold"]))
        all_gold += sum(case["gold"])
        kept_tokens += sum(t for t, k in zip(split.tokens, keep) if k)
        all_tokens += sum(split.tokens)
    return kept_gold / max(all_gold, 1), kept_tokens / max(all_tokens, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", required=True)
    parser.add_argument("--split", default="dev", choices=["train", "dev"])
    parser.add_argument("--budgets", default=",".join(map(str, BUDGETS)))
    parser.add_argument("--lexical", default=None, help="comma-separated lexical weights to sweep (train)")
    parser.add_argument("--quota", default=None, help="comma-separated quotas to sweep (train)")
    parser.add_argument("--passage", default=None, help="comma-separated passage weights to sweep (train)")
    parser.add_argument("--neighbour", default=None, help="comma-separated neighbour weights to sweep (train)")
    parser.add_argument("--plot", default=None, help="write a PNG of rationale kept against tokens kept")
    parser.add_argument("--limit", type=int, default=None, help="only the first N claims of the split")
    parser.add_argument("--no-title", action="store_true", help="embed sentences without their passage title (a variant)")
    parser.add_argument("--fresh", action="store_true", help="score the sentences again instead of reading the cache")
    args = parser.parse_args()

    settings = load_settings()
    params = settings.params()
    embedder = load_embedder(params.embedder)
    dataset = load_beir(args.dataset, "test")
    root = cached_index(dataset, params.index, embedder, params.indexes_dir, stderr_progress())
    pipeline = Pipeline.open(root, embedder, params.retrieval)
    folder = Path(args.dataset) / "rationales"
    abstracts = {str(json.loads(line)["doc_id"]): json.loads(line) for line in (folder / "corpus_sentences.jsonl").read_text().splitlines()}
    claims = load_claims(folder, args.split)[: args.limit]
    started = time.perf_counter()
    variant = "-notitle" if args.no_title else ""
    cache = settings.home / "bench" / f"compression-{args.split}{args.limit or ''}{variant}-{root.name}.pkl"
    if cache.is_file() and not args.fresh:  # scores depend on the index and model only, not on the settings swept
        cases = pickle.loads(cache.read_bytes())
    else:
        cases = gather(pipeline, embedder, claims, abstracts, titled_sentences=not args.no_title)
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_bytes(pickle.dumps(cases))
    seconds = time.perf_counter() - started
    base = compress.CompressionParams()
    gold = sum(sum(c["gold"]) for c in cases)
    print(f"machine: {cpu_description()}, {len(claims)} claims ({args.split}), top {TOP} documents, "
          f"{gold} gold rationale sentences retrieved, {sum(len(c['split'].sentences) for c in cases)} sentences; "
          f"retrieval + sentence scoring {seconds:.1f} s (cached: {cache.name})")
    budgets = [int(b) for b in args.budgets.split(",")]
    swept = {name: [float(x) for x in getattr(args, name).split(",")] if getattr(args, name) else [getattr(base, name)]
             for name in ("lexical", "quota", "passage", "neighbour")}
    print(f"{'lexical':>8} {'quota':>6} {'passage':>8} {'neighbour':>9} {'budget':>7} {'rationale kept':>15} {'tokens kept':>12}")
    curve = []
    for values in itertools.product(*swept.values()):
        setting = dict(zip(swept, values))
        for budget in budgets:
            kept, tokens = measure(cases, replace(base, budget_tokens=budget, **setting))
            print(f"{setting['lexical']:>8.2f} {setting['quota']:>6.2f} {setting['passage']:>8.2f} {setting['neighbour']:>9.2f} "
                  f"{budget:>7} {kept:>15.4f} {tokens:>12.4f}")
            if all(getattr(base, k) == v for k, v in setting.items()):
                curve.append((budget, kept, tokens))
    if args.plot and curve:
        plot(curve, args.plot, args.split)
    kept, tokens = measure(cases, base)
    print(f"per-claim tokens kept at the default budget: median {statistics.median(_per_claim(cases, base)):.3f}")
    print(f"rationale_kept={kept:.4f} tokens_kept={tokens:.4f}")


def _per_claim(cases, params) -> list[float]:
    shares = []
    for case in cases:
        split = case["split"]
        if not split.tokens:
            continue
        keep = compress.select(split, compress.combined(case["model"], case["overlap"], params, case["split"].owner), params)
        shares.append(sum(t for t, k in zip(split.tokens, keep) if k) / sum(split.tokens))
    return shares


def plot(curve, path: str, split: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot([t for _, _, t in curve], [k for _, k, _ in curve], marker="o")
    for budget, kept, tokens in curve:
        ax.annotate(str(budget), (tokens, kept), textcoords="offset points", xytext=(4, -10), fontsize=8)
    ax.axhline(0.95, linestyle=":", color="grey")
    ax.axvline(0.40, linestyle=":", color="grey")
    ax.set_xlabel("share of tokens kept (top-5 documents)")
    ax.set_ylabel("share of gold rationale sentences kept")
    ax.set_title(f"SciFact claims_{split}: point labels are token budgets", fontsize=10)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
