"""`llmframe-ray train-reranker`: mine, train, export, validate, write the model card."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from functools import partial
from pathlib import Path

from llmframe_ray.errors import DatasetError
from llmframe_ray.eval.beir import BeirDataset, load_beir, load_corpus
from llmframe_ray.eval.runner import cached_index, run_mode
from llmframe_ray.eval.trec import score_run, write_run
from llmframe_ray.index import atomic
from llmframe_ray.index.domain import card_domain, centroid
from llmframe_ray.models.cross_encoder import CARD_FILE, CrossEncoder, Precision, read_card
from llmframe_ray.index.params import IndexParams
from llmframe_ray.models.embedder import EmbedderParams, load_embedder
from llmframe_ray.models.two_tower import TwoTowerScorer, has_towers
from llmframe_ray.retrieve.params import RetrievalParams
from llmframe_ray.retrieve.pipeline import Pipeline
from llmframe_ray.retrieve.rerank import RerankFusion, RerankParams
from llmframe_ray.train.distill import check_teacher_split, teacher_card, teacher_scores
from llmframe_ray.train.synthetic import (
    MAX_WORDS, MIN_TITLE_WORDS, MIN_WORDS, PseudoQueries, corpus_of_index, synthetic_dataset, untitled,
    without_sentences,
)
from llmframe_ray.train.rationales import RATIONALE_POOL_DEPTH, load_rationales, sentence_groups
from llmframe_ray.train.reranker import Log, TrainConfig, build_groups, split_queries, train
from llmframe_ray.train.warm_start import init_layers
from llmframe_ray.types import Hit, SearchMode

VALIDATION_DEPTH = 30  # fixed, so that cards compare across models and sessions; serving reranks LLMFRAME_RERANKER_DEPTH


def subset(dataset: BeirDataset, qids: list[str]) -> BeirDataset:
    from types import MappingProxyType

    keep = set(qids)
    return replace(
        dataset,
        queries=MappingProxyType({q: t for q, t in dataset.queries.items() if q in keep}),
        qrels=MappingProxyType({q: r for q, r in dataset.qrels.items() if q in keep}),
    )


def validate(
    pipeline: Pipeline, dataset: BeirDataset, model_dir: Path, rrf_k: int, threads: int, work: Path
) -> dict[str, dict[str, float]]:
    """nDCG@10 on held-out queries: hybrid, and hybrid top-30 reranked by fp32 and int8 (and the
    int8 towers where the folder has them), each by the cross-encoder alone and fused with the
    hybrid order (RRF, k = `rrf_k`; and scores, weight 1: retrieve/rerank.py)."""
    steps = RerankParams(depth=VALIDATION_DEPTH, rrf_k=rrf_k)
    hybrid = {
        qid: pipeline.search(text, SearchMode.HYBRID, top_k=100, truncate=True, rerank=False)
        for qid, text in dataset.queries.items()
    }
    figures = {"hybrid": _score(work / "hybrid.trec", hybrid, dataset)}
    scorers = {p.value: partial(CrossEncoder, model_dir, precision=p, threads=threads) for p in (Precision.FP32, Precision.INT8)}
    if has_towers(model_dir):  # what serving runs by default: the int8 towers (models/two_tower.py)
        scorers["towers-int8"] = partial(TwoTowerScorer, model_dir, precision=Precision.INT8, threads=threads, cache_size=0)
    for label, make in scorers.items():
        encoder = make()
        started = time.perf_counter()
        scores = {qid: encoder.score(dataset.queries[qid], steps.passages(hits)) for qid, hits in hybrid.items()}
        reranked = {
            qid: steps.apply(dataset.queries[qid], hits, scores[qid], RerankFusion.NONE)
            for qid, hits in hybrid.items()
        }
        seconds = time.perf_counter() - started
        figures[f"rerank-{label}"] = {
            **_score(work / f"rerank-{label}.trec", reranked, dataset),
            "pairs_per_s": round(sum(min(len(h), VALIDATION_DEPTH) for h in hybrid.values()) / seconds, 1),
        }
        for fusion in (RerankFusion.RRF, RerankFusion.SCORE):
            fused = {
                qid: steps.apply(dataset.queries[qid], hits, scores[qid], fusion) for qid, hits in hybrid.items()
            }
            name = f"rerank-{label}-{fusion.value}"
            figures[name] = _score(work / f"{name}.trec", fused, dataset)
    return figures


def _score(path: Path, results: dict[str, list[Hit]], dataset: BeirDataset) -> dict[str, float]:
    run = {qid: [(h.doc_id, h.score) for h in hits] for qid, hits in results.items()}
    metrics = score_run(write_run(path, run, tag="validation"), dataset.qrels)
    return {name: round(value, 4) for name, value in metrics.items()}


def train_reranker(
    dataset_dir: Path,
    split: str,
    out_dir: Path,
    config: TrainConfig,
    log: Log,
    *,
    embedder: EmbedderParams,
    index: IndexParams,
    indexes_dir: Path,
    retrieval: RetrievalParams,
    rerank_rrf_k: int,
    teacher: Path | None = None,
    synthetic_queries: int | None = None,
    index_dir: Path | None = None,
    rationales: bool = False,
    pseudo_queries: PseudoQueries = PseudoQueries.AUTO,
    init: Path | None = None,
) -> dict:
    """Train a reranker on `split` of a BEIR folder; return the model card written. With a
    `teacher` (a reranker folder), its scores of every training pair are soft labels too
    (train/distill.py). With `synthetic_queries`, no judgments are read: that many
    pseudo-queries made from the corpus are the training data (train/synthetic.py), and there
    is no validation (the eval harness on real queries is the measure). `index_dir` instead of
    a BEIR folder (synthetic only): the documents and the hybrid negatives of that index. With
    `rationales`, the gold rationale sentences of the split's claims are training groups too
    (train/rationales.py). `pseudo_queries`: what of a document becomes a pseudo-query. `init`:
    a reranker folder made by train-reranker to start from instead of MiniLM (train/warm_start.py;
    its layer count, which `config.layers` must not contradict)."""
    out_dir = Path(out_dir)
    positives = None
    pseudo_queries = PseudoQueries.from_str(pseudo_queries)
    if init is not None:
        layers = init_layers(init)
        if config.layers is not None and config.layers != layers:
            raise DatasetError(f"--layers {config.layers} contradicts --init {init}, a {layers}-layer reranker")
        config = replace(config, layers=layers)
    if index_dir is not None and synthetic_queries is None:
        raise DatasetError("an index has no relevance judgments: train on it with --synthetic")
    if synthetic_queries is not None:
        corpus = corpus_of_index(index_dir) if index_dir is not None else load_corpus(dataset_dir)
        pseudo_queries = pseudo_queries.resolve(corpus)
        dataset, positives = synthetic_dataset(corpus, synthetic_queries, config.seed, pseudo_queries)
        config = replace(config, validation_fraction=0.0)  # held-out pseudo-queries would be found by their own words
        log(f"{len(dataset.queries)} pseudo-queries ({pseudo_queries.value}s) from {dataset.name}'s documents "
            "(no judgments read)")
    elif split == "test":
        raise DatasetError("refusing to train on test judgments; use a training split (e.g. --split train)")
    else:
        dataset = load_beir(dataset_dir, split)
    model = load_embedder(embedder)
    where = "the index given" if index_dir is not None else "building or reusing the cache"
    log(f"index of {dataset.name} ({len(dataset.corpus)} documents): {where}")
    searched = index_dir if index_dir is not None else cached_index(dataset, index, model, indexes_dir)
    pipeline = Pipeline.open(searched, model, retrieval)
    train_ids, val_ids = split_queries(list(dataset.queries), config.validation_fraction, config.seed)
    log(f"mining hard negatives: hybrid top {config.mining_depth} for {len(train_ids)} queries")
    candidates = {
        qid: [doc for doc, _ in ranked]
        for qid, ranked in run_mode(pipeline, subset(dataset, train_ids), SearchMode.HYBRID, config.mining_depth).items()
    }
    titles_out = positives is not None and pseudo_queries is PseudoQueries.TITLE  # every passage without its title
    if titles_out:
        read = {doc for ranked in candidates.values() for doc in ranked} | {d for q in train_ids for d in dataset.qrels[q]}
        groups = build_groups(untitled(dataset, read), train_ids, candidates, config)
    else:
        groups = build_groups(dataset, train_ids, candidates, config)
    if positives is not None:
        groups = without_sentences(groups, positives)
    sentences = []
    if rationales:
        if synthetic_queries is not None:
            raise DatasetError("--rationales reads the dataset's rationale sentences; pseudo-queries have none")
        sentences = sentence_groups(load_rationales(dataset_dir, split), train_ids, candidates, config)
        log(f"rationale sentences: {len(sentences)} groups (1 gold sentence + {config.negatives} others of the "
            f"claim's top {RATIONALE_POOL_DEPTH} and cited documents)")
        groups = [*groups, *sentences]
    if teacher is not None:
        groups = teacher_scores(teacher, groups, config.threads, log)
        teacher_info = teacher_card(teacher)
        if val_ids:  # only validation figures can include what the teacher learnt from
            check_teacher_split(teacher_info, read_card(teacher), dataset.name, config, log)
    log(f"training on {len(groups)} groups (1 positive + {config.negatives} negatives each)")
    card = {
        "name": out_dir.name,
        "kind": "cross-encoder reranker (MiniLM over the pair; per-segment mean pooling; scaled cosine + interaction head; 1 logit)",
        "data": {
            "dataset": dataset.name,
            "split": dataset.split,
            "qrels_sha256": dataset.qrels_sha256,
            "corpus_sha256": dataset.corpus_sha256,
            "train_queries": len(train_ids),
            "validation_queries": len(val_ids),
            "groups": len(groups),
            **({"rationale_groups": len(sentences)} if rationales else {}),
            "negatives": f"hybrid top {config.mining_depth} minus every document judged for the query",
        },
    }
    if titles_out:
        card["data"]["pseudo_queries"] = (
            f"the title ({MIN_TITLE_WORDS}+ words; with no title field, a first sentence of {MIN_TITLE_WORDS}-{MAX_WORDS} "
            f"words) of each of {len(dataset.queries)} documents sampled with seed {config.seed}; every training "
            "passage is read without its title; no judgments used"
        )
    elif positives is not None:
        card["data"]["pseudo_queries"] = (
            f"one sentence ({MIN_WORDS}-{MAX_WORDS} words, not the title) of each of {len(dataset.queries)} documents "
            f"sampled with seed {config.seed}; the positive is its document without that sentence; no judgments used"
        )
        card["data"]["negatives"] = f"hybrid top {config.mining_depth} for the pseudo-query minus its source document"
    domain = card_domain(centroid(pipeline.shards), pipeline.shards[0].manifest.model)
    if domain is not None:  # where it is at home: its fusion weight elsewhere (retrieve/rerank.py)
        card["domain"] = domain
    if teacher is not None:
        card["teacher"] = {**teacher_info, "weight": config.distill_weight, "temperature": config.distill_temperature}
    if init is not None:  # what it had learnt comes along: the eval's leak check follows it (eval/runner.py)
        card["init"] = teacher_card(init)
        if val_ids and (teacher is None or Path(init).resolve() != Path(teacher).resolve()):
            check_teacher_split(card["init"], read_card(init), dataset.name, config, log, "the model started from")
    report = train(groups, out_dir, config, card, log, init=init)
    log(f"trained {report.steps} steps in {report.seconds:.0f}s; exported to {out_dir}")
    if val_ids:
        log(f"validating on {len(val_ids)} held-out {split} queries")
        work = out_dir.parent / f".{out_dir.name}.validation"
        figures = validate(pipeline, subset(dataset, val_ids), out_dir, rerank_rrf_k, config.threads, work)
        card = {**read_card(out_dir), "validation": {"queries": len(val_ids), "depth": VALIDATION_DEPTH, **figures}}
        atomic.write_bytes(out_dir / CARD_FILE, (json.dumps(card, indent=2) + "\n").encode("utf-8"))
        for path in work.glob("*.trec"):
            path.unlink()
        work.rmdir()
    return read_card(out_dir)
