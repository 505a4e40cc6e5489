"""Contextual compression against SciFact's gold rationale sentences.

    .venv/bin/python benchmarks/compression.py --dataset ../shared/eval/scifact [--split train|dev]
        [--scorer cross-encoder --reranker MODEL_DIR [--precision int8]]

For every claim, hybrid retrieval (the pipeline's defaults) returns the top 5 documents (`--top N`); each is
compressed with the stage's own functions (retrieve/compress.py) from the release's sentence
split of its abstract, scored by the query encoder (the offline scorer) or, with `--scorer
cross-encoder`, by a trained reranker (what `auto` uses where one is deployed). Reported per token
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

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.serve import cpu_description  # noqa: E402
from llmframe_ray.config import load_settings  # noqa: E402
from llmframe_ray.eval.beir import load_beir  # noqa: E402
from llmframe_ray.eval.runner import cached_index  # noqa: E402
from llmframe_ray.ingest.build import stderr_progress  # noqa: E402
from llmframe_ray.models.embedder import load_embedder  # noqa: E402
from llmframe_ray.retrieve import compress, evidence  # noqa: E402
from llmframe_ray.retrieve.pipeline import Pipeline  # noqa: E402
from llmframe_ray.retrieve.rerank import RerankFusion  # noqa: E402

TOP = 5
BUDGETS = (150, 250, 350, 450, 550, 700, 900)


def load_claims(folder: Path, split: str) -> list[dict]:
    name = {"train": "claims_train.jsonl", "dev": "claims_dev.jsonl", "test": "claims_dev.jsonl"}[split]
    return [json.loads(line) for line in (folder / name).read_text().splitlines() if line.strip()]


def gather(pipeline, embedder, claims, abstracts, titled_sentences: bool = True, reranker=None,
           sentences_by_reranker: bool = False, rerank: bool = False, sentence_model=None, top: int = TOP) -> list[dict]:
    """Per claim: the top documents' sentences, each sentence's model score and lexical
    overlap, and which sentences are gold rationales. A document's sentence vectors do not
    depend on the claim: each retrieved document is embedded once. With `reranker` (a
    CrossEncoder), each retrieved passage's cross-encoder score too (what the served stage
    reads from a deployed reranker), and with `sentences_by_reranker` the sentences' model score
    is the cross-encoder's score of (claim, title + sentence) instead of the cosine. With
    `rerank`, the top documents are the reranked ones (the pipeline's reranker), as a deployed
    Reranker hands them to the stage by default. `sentence_model` (a CrossEncoder) scores the
    sentences instead of the reranker."""
    texts = [c["claim"] for c in claims]
    found = pipeline.search_batch(texts, "hybrid", top, truncate=True, rerank=rerank)
    kept_hits = [[h for h in hits if h.doc_id in abstracts] for hits in found]
    docs_of = [[h.doc_id for h in hits] for hits in kept_hits]
    title = (lambda d: abstracts[d]["title"]) if titled_sentences else (lambda d: "")
    if sentences_by_reranker:
        models = [
            (sentence_model or reranker).score(claim["claim"], [compress.scoring_text(title(d), s) for d in docs for s in abstracts[d]["abstract"]]).tolist()
            for claim, docs in zip(claims, docs_of)
        ]
    else:
        needed = sorted({d for docs in docs_of for d in docs})
        titled = [compress.scoring_text(title(d), s) for d in needed for s in abstracts[d]["abstract"]]
        print(f"embedding {len(titled)} sentences of {len(needed)} retrieved documents and {len(texts)} claims", file=sys.stderr)
        flat = list(embedder.embed(titled)) if titled else []
        vectors, at = {}, 0
        for d in needed:
            n = len(abstracts[d]["abstract"])
            vectors[d], at = flat[at : at + n], at + n
        queries = embedder.embed(texts)
        models = [compress.cosines(query, [v for d in docs for v in vectors[d]]) for query, docs in zip(queries, docs_of)]
    cases = [_case(claim, docs, abstracts, model) for claim, docs, model in zip(claims, docs_of, models)]
    if reranker is not None:
        for case, claim, hits in zip(cases, claims, kept_hits):
            case["passages"] = reranker.score(claim["claim"], [h.passage for h in hits]).tolist()
    return cases


def _case(claim: dict, docs: list[str], abstracts: dict, model: list[float]) -> dict:
    """One claim's sentences (of its retrieved documents), their model scores and lexical overlap,
    and which are gold rationales."""
    split = compress.Split.of([abstracts[d]["abstract"] for d in docs])
    gold = {(d, i) for d, ev in claim["evidence"].items() for e in ev for i in e["sentences"]}
    flags = [(d, i) in gold for d in docs for i in range(len(abstracts[d]["abstract"]))]
    return {"split": split, "gold": flags, "model": model, "overlap": compress.lexical_overlap(claim["claim"], split.sentences)}


def kept_of(case: dict, params) -> list[bool]:
    """The stage's own choice for one claim (retrieve/compress.py), passages kept whole by the
    cross-encoder's passage scores where the case has them."""
    split = case["split"]
    passages = case.get("passages")
    whole = compress.whole_passages(passages, params.passage_margin)
    ce = bool(case.get("cross_encoder"))
    scores, evidence = compress.sentence_scores(case["model"], case["overlap"], params, split.owner, ce, passages)
    return compress.select(split, scores, params, whole, relative=ce and bool(passages), evidence=evidence)


def fit_evidence(cases, folds: int = 5, seed: int = 0) -> None:
    """Fit the evidence model (retrieve/evidence.py) on these claims and choose its threshold:
    the most rationale kept with at most 40% of the tokens (then the fewest tokens), from out-of-fold probabilities
    (`folds` folds of claims, seeded), then the weights refitted on every claim. Prints both."""
    rows = [evidence.features(c["model"], c["overlap"], c["split"].owner) for c in cases]
    labels = [np.asarray(c["gold"], dtype=np.float64) for c in cases]
    fold = np.random.default_rng(seed).permutation(len(cases)) % folds
    probs: list[list[float]] = [[] for _ in cases]
    for f in range(folds):
        train = [i for i in range(len(cases)) if fold[i] != f]
        model = evidence.fit(np.vstack([rows[i] for i in train]), np.concatenate([labels[i] for i in train]))
        for i in np.flatnonzero(fold == f):
            c = cases[i]
            probs[i] = evidence.probabilities(c["model"], c["overlap"], c["split"].owner, model)
    best = None
    print(f"out of fold ({folds} folds, seed {seed}): {'threshold':>9} {'rationale kept':>15} {'tokens kept':>12}")
    for threshold in np.round(np.geomspace(0.002, 0.5, 60), 4):
        kept, tokens = measure([dict(c, model=p) for c, p in zip(cases, probs)], compress.CompressionParams(evidence=float(threshold)),
                               chosen=lambda case, params: compress.select(case["split"], case["model"], params, evidence=True))
        print(f"{'':>31} {threshold:>9.4f} {kept:>15.4f} {tokens:>12.4f}")
        if tokens <= 0.40 and (best is None or kept > best[1] or (kept == best[1] and tokens < best[2])):
            best = (float(threshold), kept, tokens)
    model = evidence.fit(np.vstack(rows), np.concatenate(labels))
    print(f"fitted on {len(cases)} claims ({sum(len(r) for r in rows)} sentences, {int(sum(l.sum() for l in labels))} gold):")
    print(f"Model(({', '.join(f'{w:.4f}' for w in model.weights)}), {model.bias:.4f})  # {', '.join(evidence.FEATURES)}, bias")
    if best is not None:
        print(f"threshold (the most rationale kept with at most 40% of the tokens, out of fold): {best[0]} "
              f"({best[1]:.4f} at {best[2]:.4f})")


def measure(cases, params, chosen=kept_of) -> tuple[float, float]:
    kept_gold = all_gold = kept_tokens = all_tokens = 0
    for case in cases:
        split = case["split"]
        keep = chosen(case, params)
        kept_gold += sum(k and g for k, g in zip(keep, case["gold"]))
        all_gold += sum(case["gold"])
        kept_tokens += sum(t for t, k in zip(split.tokens, keep) if k)
        all_tokens += sum(split.tokens)
    return kept_gold / max(all_gold, 1), kept_tokens / max(all_tokens, 1)


def held_out_ids(reranker, dataset: str) -> set[str]:
    """The SciFact train queries that this reranker held out from its training (its card's seed
    and validation share, drawn as train/reranker.py draws them)."""
    from llmframe_ray.train.reranker import split_queries

    config = reranker.card.get("config", {})
    if reranker.card.get("data", {}).get("dataset") != Path(dataset).name or "seed" not in config:
        raise SystemExit(f"--held-out: the reranker's card does not say it was trained on {Path(dataset).name} with a seed")
    train = load_beir(dataset, "train")
    return set(split_queries(list(train.queries), config.get("validation_fraction", 0.1), config["seed"])[1])


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
    parser.add_argument("--top", type=int, default=TOP, help=f"documents compressed per claim (default {TOP})")
    parser.add_argument("--no-title", action="store_true", help="embed sentences without their passage title (a variant)")
    parser.add_argument("--fresh", action="store_true", help="score the sentences again instead of reading the cache")
    parser.add_argument("--scorer", default="embedder", choices=["embedder", "cross-encoder"],
                        help="the model score of a sentence: the query encoder's cosine, or the reranker's score")
    parser.add_argument("--reranker", default=None,
                        help="a trained reranker folder: its passage scores keep passages whole (--margin), as a deployed one does")
    parser.add_argument("--precision", default=None, choices=["fp32", "int8"], help="the reranker's precision (default: the settings')")
    parser.add_argument("--rerank", action="store_true",
                        help="with --reranker: compress the reranked top documents (the default where a Reranker is deployed), not hybrid's")
    parser.add_argument("--margin", default=None, help="comma-separated passage margins to sweep ('none': no passage kept whole)")
    parser.add_argument("--relative", default=None,
                        help="comma-separated relative thresholds to sweep ('none': fill the budget instead), with --reranker")
    parser.add_argument("--prior", default=None, help="comma-separated passage priors to sweep, with --reranker")
    parser.add_argument("--drop", default=None,
                        help="comma-separated passage drops to sweep under the relative rule ('none': every passage keeps its best sentence)")
    parser.add_argument("--floor", default=None,
                        help="comma-separated floor shares to sweep under the relative rule ('none': no floor)")
    parser.add_argument("--sentence-model", default=None,
                        help="with --scorer cross-encoder: a cross-encoder folder that scores the sentences (default: the reranker)")
    parser.add_argument("--evidence", default=None,
                        help="comma-separated evidence thresholds to sweep with the offline scorer ('none': fill the budget instead)")
    parser.add_argument("--fit", action="store_true",
                        help="with --split train: fit the evidence model of the scorer's scores and choose its threshold (printed)")
    parser.add_argument("--held-out", action="store_true",
                        help="with --split train: only the claims the reranker held out from its training")
    args = parser.parse_args()

    settings = load_settings()
    params = settings.params()
    embedder = load_embedder(params.embedder)
    dataset = load_beir(args.dataset, "test")
    root = cached_index(dataset, params.index, embedder, params.indexes_dir, stderr_progress())
    folder = Path(args.dataset) / "rationales"
    abstracts = {str(json.loads(line)["doc_id"]): json.loads(line) for line in (folder / "corpus_sentences.jsonl").read_text().splitlines()}
    claims = load_claims(folder, args.split)
    started = time.perf_counter()
    variant = ("-notitle" if args.no_title else "") + (f"-top{args.top}" if args.top != TOP else "")
    reranker = None
    if args.scorer == "cross-encoder" and not args.reranker:
        parser.error("--scorer cross-encoder needs --reranker DIR")
    if args.held_out and (not args.reranker or args.split != "train"):
        parser.error("--held-out needs --split train and --reranker DIR")
    if args.fit and (args.split != "train" or (args.scorer == "cross-encoder" and not args.held_out)):
        parser.error("--fit needs --split train (and, with --scorer cross-encoder, --held-out: claims the reranker did not train on)")
    if args.rerank and not args.reranker:
        parser.error("--rerank needs --reranker DIR")
    if args.reranker:
        from llmframe_ray.models.sources import load_reranker

        reranker = load_reranker(load_settings(reranker_model=args.reranker).params().reranker_model, precision=args.precision)
        towers = "-towers" if reranker.form_note else ""  # two towers score passages (and sentences) their own way
        variant += f"-{args.scorer}+passages-{Path(args.reranker).name}-{reranker.precision.value}{towers}"
        if args.held_out:
            held = held_out_ids(reranker, args.dataset)
            claims = [c for c in claims if str(c["id"]) in held]
            if not claims:
                raise SystemExit("--held-out: the reranker held out no claims_train claims (trained with --held-out 0)")
            variant += "-heldout"
        if args.rerank:  # the reranked top 5 depend on the depth reranked, the fusion and a weight set
            weight = "" if params.rerank.weight is None else f"-w{params.rerank.weight:g}"
            k = f"{params.rerank.rrf_k}" if params.rerank.fusion is RerankFusion.RRF else ""
            variant += f"-reranked-d{params.rerank.depth}-{params.rerank.fusion.value}{k}{weight}"
    sentence_model = None
    if args.sentence_model:
        if args.scorer != "cross-encoder":
            parser.error("--sentence-model needs --scorer cross-encoder")
        sentence_model = load_reranker(load_settings(reranker_model=args.sentence_model).params().reranker_model,
                                       precision=args.precision)
        variant += f"-sentences-{Path(args.sentence_model).name}"
    pipeline = Pipeline.open(root, embedder, params.retrieval, reranker if args.rerank else None, params.rerank)
    claims = claims[: args.limit]
    cache = settings.home / "bench" / f"compression-{args.split}{args.limit or ''}{variant}-{root.name}.pkl"
    if cache.is_file() and not args.fresh:  # scores depend on the index and model only, not on the settings swept
        cases = pickle.loads(cache.read_bytes())
    else:
        cases = gather(pipeline, embedder, claims, abstracts, titled_sentences=not args.no_title, reranker=reranker,
                       sentences_by_reranker=args.scorer == "cross-encoder", rerank=args.rerank,
                       sentence_model=sentence_model, top=args.top)
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_bytes(pickle.dumps(cases))
    for case in cases:
        case["cross_encoder"] = args.scorer == "cross-encoder"
    seconds = time.perf_counter() - started
    base = compress.CompressionParams()
    if reranker is not None and args.scorer == "cross-encoder":  # as the stage does with a deployed reranker
        base = base.for_reranker(reranker.card)
        if base.evidence is not None:
            print(f"the reranker was trained on rationale sentences: its evidence model ({base.evidence}) by default")
    gold = sum(sum(c["gold"]) for c in cases)
    print(f"machine: {cpu_description()}, {len(claims)} claims ({args.split}), top {args.top} documents, "
          f"{gold} gold rationale sentences retrieved, {sum(len(c['split'].sentences) for c in cases)} sentences; "
          f"retrieval + sentence scoring {seconds:.1f} s (cached: {cache.name})")
    if args.fit:
        fit_evidence(cases)
        return
    budgets = [int(b) for b in args.budgets.split(",")]
    swept: dict[str, list] = {name: [float(x) for x in getattr(args, name).split(",")] if getattr(args, name) else [getattr(base, name)]
                              for name in ("lexical", "quota", "passage", "neighbour")}
    for name, arg in (("passage_margin", args.margin), ("relative", args.relative), ("passage_drop", args.drop),
                      ("floor_share", args.floor)):
        swept[name] = [None if x.strip() == "none" else float(x) for x in arg.split(",")] if arg else [getattr(base, name)]
    swept["passage_prior"] = [float(x) for x in args.prior.split(",")] if args.prior else [base.passage_prior]
    # the offline scorer: its evidence rule and (none) the budget rule by default; a rationale reranker:
    # its evidence rule (`--relative 6.25 --evidence none,...` adds the relative rule it replaced)
    swept["evidence"] = ([None if x.strip() == "none" else float(x) for x in args.evidence.split(",")] if args.evidence
                         else [None, base.evidence] if base.evidence is not None and args.scorer == "embedder"
                         else [base.evidence])
    print(f"{'lexical':>8} {'quota':>6} {'passage':>8} {'neighbour':>9} {'margin':>7} {'relative':>8} {'prior':>6} "
          f"{'drop':>6} {'floor':>6} {'evidence':>8} {'budget':>7} {'rationale kept':>15} {'tokens kept':>12}")
    curve, seen = [], set()
    for values in itertools.product(*swept.values()):
        setting = dict(zip(swept, values))
        margin = "none" if setting["passage_margin"] is None or reranker is None else f"{setting['passage_margin']:.2f}"
        relative = "none" if setting["relative"] is None or reranker is None else f"{setting['relative']:.2f}"
        drop = "none" if setting["passage_drop"] is None or relative == "none" else f"{setting['passage_drop']:.2f}"
        floor = "none" if not setting["floor_share"] or relative == "none" else f"{setting['floor_share']:.2f}"
        ev = "none" if setting["evidence"] is None else f"{setting['evidence']:.4f}"
        if ev != "none":  # the evidence rule replaces the relative one: one row each
            setting["relative"], relative = None, "none"
            key = tuple(setting.items())
            if key in seen:
                continue
            seen.add(key)
        by_budget = relative == "none" and ev == "none"  # a relative or evidence threshold fills no budget
        for budget in budgets if by_budget else budgets[:1]:
            kept, tokens = measure(cases, replace(base.with_budget(budget), **setting))
            print(f"{setting['lexical']:>8.2f} {setting['quota']:>6.2f} {setting['passage']:>8.2f} {setting['neighbour']:>9.2f} "
                  f"{margin:>7} {relative:>8} {setting['passage_prior']:>6.2f} {drop:>6} {floor:>6} {ev:>8} "
                  f"{budget if by_budget else '-':>7} {kept:>15.4f} {tokens:>12.4f}")
            if all(getattr(base, k) == v for k, v in setting.items() if k not in ("relative", "evidence")):  # the default's curves
                curve.append((budget if by_budget else f"rel {relative}" if relative != "none" else f"ev {ev}", kept, tokens))
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
        keep = kept_of(case, params)
        shares.append(sum(t for t, k in zip(split.tokens, keep) if k) / sum(split.tokens))
    return shares


def plot(curve, path: str, split: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    kinds = (("token budget", lambda c: isinstance(c[0], int)),
             ("relative threshold (reranker trained on rationale sentences)", lambda c: str(c[0]).startswith("rel ")),
             ("evidence threshold (the scorer's evidence model)", lambda c: str(c[0]).startswith("ev ")))
    drawn = 0
    for name, member in kinds:
        series = sorted((c for c in curve if member(c)), key=lambda c: c[2])
        if series:
            ax.plot([t for _, _, t in series], [k for _, k, _ in series], marker="o", label=name)
            drawn += 1
    if drawn > 1:
        ax.legend(fontsize=8, loc="lower right")
    for budget, kept, tokens in curve:
        label = str(budget).removeprefix("rel ").removeprefix("ev ")
        ax.annotate(label, (tokens, kept), textcoords="offset points", xytext=(4, -10), fontsize=8)
    ax.axhline(0.95, linestyle=":", color="grey")
    ax.axvline(0.40, linestyle=":", color="grey")
    ax.set_xlabel("share of tokens kept (top-5 documents)")
    ax.set_ylabel("share of gold rationale sentences kept")
    ax.set_title(f"SciFact claims_{split}: point labels are token budgets or thresholds", fontsize=10)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
