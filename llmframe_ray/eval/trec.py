"""TREC run files (`qid Q0 doc_id rank score tag`) and scoring them with ir-measures."""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

import ir_measures
from ir_measures import Qrel

from llmframe_ray.index import atomic

MEASURES = {"nDCG@10": ir_measures.nDCG @ 10, "Recall@100": ir_measures.R @ 100}


def write_run(
    path: Path, results: Mapping[str, Sequence[tuple[str, float]]], tag: str
) -> Path:
    """Write ranked (doc_id, score) lists per query, atomically; rank is 1-based.

    Scorers such as trec_eval order a query's lines by the score column and ignore the rank
    column, so equal scores would let them re-break our ties their own way. Written scores are
    therefore made strictly decreasing: a score that does not fall below the previous line's is
    lowered by a relative 1e-10, which keeps our order and changes no other digit that matters.
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
                previous = float("inf")
                for rank, (doc_id, score) in enumerate(ranked, 1):
                    if score >= previous:
                        score = previous - 1e-10 * max(1.0, abs(previous))
                    previous = score
                    fh.write(f"{qid} Q0 {doc_id} {rank} {score:.15g} {tag}\n")

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic.write_via(path, write)
    return path


def score_run(path: Path, qrels: Mapping[str, Mapping[str, int]]) -> dict[str, float]:
    """nDCG@10 and Recall@100 of a run file, averaged over the judged queries.

    A judged query with no line in the run counts as zero (it is still in the average).
    """
    judged = [Qrel(qid, doc_id, int(rel)) for qid, docs in qrels.items() for doc_id, rel in docs.items()]
    run = list(ir_measures.read_trec_run(str(path)))
    per_query: dict[str, dict[str, float]] = {name: {} for name in MEASURES}
    names = {measure: name for name, measure in MEASURES.items()}
    for metric in ir_measures.iter_calc(list(MEASURES.values()), judged, run):
        per_query[names[metric.measure]][metric.query_id] = float(metric.value)
    n = len(qrels)
    if n == 0:
        raise ValueError("no judged queries to score")
    return {name: sum(values.values()) / n for name, values in per_query.items()}
