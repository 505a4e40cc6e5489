"""TREC run files (`qid Q0 doc_id rank score tag`) and scoring them with ir-measures."""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

import ir_measures
import numpy as np
from ir_measures import Qrel

from llmframe_ray.index import atomic

MEASURES = {"nDCG@10": ir_measures.nDCG @ 10, "Recall@100": ir_measures.R @ 100}


def write_run(
    path: Path, results: Mapping[str, Sequence[tuple[str, float]]], tag: str
) -> Path:
    """Write ranked (doc_id, score) lists per query, atomically; rank is 1-based.

    Scorers (trec_eval, pytrec_eval, ir-measures) order a query's lines by the score column,
    some of them read in single precision, and ignore the rank column: scores that are equal,
    or that differ by less than a float32 step (fused RRF scores broken by a 1e-10 tie-break),
    would let them re-break our ties their own way, by document id. Written scores are
    therefore float32 values, strictly decreasing in rank order: a score that does not fall
    below the previous line's (at float32 precision) is written one float32 step below it.
    Each is printed as the shortest decimal that reads back to that float32 (and, read as a
    double, keeps the same order), so every scorer sees exactly the ranking we returned.
    """
    if any(ch.isspace() for ch in tag) or not tag:
        raise ValueError(f"run tag must be one word, got {tag!r}")
    for qid, ranked in results.items():
        for doc_id, _ in ranked:
            if any(ch.isspace() for ch in doc_id) or any(ch.isspace() for ch in qid):
                raise ValueError(f"ids in a TREC run cannot hold whitespace: {qid!r} {doc_id!r}")

    def write(tmp: Path) -> None:
        with open(tmp, "w", encoding="utf-8") as fh:
            for qid, ranked in results.items():
                for rank, ((doc_id, _), score) in enumerate(zip(ranked, decreasing_float32(ranked)), 1):
                    text = np.format_float_positional(score, unique=True, trim="-")
                    fh.write(f"{qid} Q0 {doc_id} {rank} {text} {tag}\n")

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic.write_via(path, write)
    return path


def decreasing_float32(ranked: Sequence[tuple[str, float]]) -> list[np.float32]:
    """The scores of a ranked list as float32 values, each strictly below the one before."""
    out: list[np.float32] = []
    previous = np.float32(np.inf)
    for _, score in ranked:
        value = np.float32(score)
        if not value < previous:
            value = np.nextafter(previous, np.float32(-np.inf), dtype=np.float32)
        out.append(value)
        previous = value
    return out


def score_per_query(path: Path, qrels: Mapping[str, Mapping[str, int]]) -> dict[str, dict[str, float]]:
    """nDCG@10 and Recall@100 of a run file for every judged query (0 for one with no line in
    the run), by measure name, then query id in the order of `qrels`."""
    if not qrels:
        raise ValueError("no judged queries to score")
    judged = [Qrel(qid, doc_id, int(rel)) for qid, docs in qrels.items() for doc_id, rel in docs.items()]
    run = list(ir_measures.read_trec_run(str(path)))
    found: dict[str, dict[str, float]] = {name: {} for name in MEASURES}
    names = {measure: name for name, measure in MEASURES.items()}
    for metric in ir_measures.iter_calc(list(MEASURES.values()), judged, run):
        found[names[metric.measure]][metric.query_id] = float(metric.value)
    return {name: {qid: values.get(qid, 0.0) for qid in qrels} for name, values in found.items()}


def score_run(path: Path, qrels: Mapping[str, Mapping[str, int]]) -> dict[str, float]:
    """nDCG@10 and Recall@100 of a run file, averaged over the judged queries.

    A judged query with no line in the run counts as zero (it is still in the average).
    """
    return {name: sum(values.values()) / len(qrels) for name, values in score_per_query(path, qrels).items()}


def within_one_error(tried: Mapping[tuple, np.ndarray]) -> tuple[tuple, float, list[tuple]]:
    """The one-standard-error rule over settings tried on the same queries: `tried` maps a
    setting (a tuple; on equal means the smaller last element counts as better) to its
    per-query scores, in one query order. Returns the best setting by mean, the largest
    standard error of a query's paired difference from it, and every setting whose mean is
    within its own such error of the best's (the best included)."""
    best = max(tried, key=lambda key: (tried[key].mean(), -key[-1]))
    errors = {
        key: (tried[best] - values).std(ddof=1) / np.sqrt(len(values)) if len(values) > 1 else 0.0
        for key, values in tried.items()
    }
    error = max(errors.values())
    return best, error, [key for key, values in tried.items() if key == best or tried[best].mean() - values.mean() <= errors[key]]


ALL_FOUND_CUTOFFS = (2, 5, 10)


def score_all_found(path: Path, qrels: Mapping[str, Mapping[str, int]], cutoffs: Sequence[int] = ALL_FOUND_CUTOFFS) -> dict[str, float]:
    """`R_all@k`: the share of judged queries whose relevant documents are *all* in the run's
    top k (multi-hop collections: both gold paragraphs found), for each cutoff k."""
    judged = [Qrel(qid, doc_id, int(rel)) for qid, docs in qrels.items() for doc_id, rel in docs.items()]
    run = list(ir_measures.read_trec_run(str(path)))
    measures = {ir_measures.R @ k: f"R_all@{k}" for k in cutoffs}
    found = {name: 0 for name in measures.values()}
    for metric in ir_measures.iter_calc(list(measures), judged, run):
        found[measures[metric.measure]] += metric.value >= 1.0 - 1e-9
    n = len(qrels)
    if n == 0:
        raise ValueError("no judged queries to score")
    return {name: count / n for name, count in found.items()}
