"""TREC run files (`qid Q0 doc_id rank score tag`) and scoring them with ir-measures."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Mapping, Sequence

import ir_measures
from ir_measures import Qrel

MEASURES = {"nDCG@10": ir_measures.nDCG @ 10, "Recall@100": ir_measures.R @ 100}


def write_run(
    path: Path, results: Mapping[str, Sequence[tuple[str, float]]], tag: str
) -> Path:
    """Write ranked (doc_id, score) lists per query, atomically; rank is 1-based."""
    if any(ch.isspace() for ch in tag) or not tag:
        raise ValueError(f"run tag must be one word, got {tag!r}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            for qid, ranked in results.items():
                for rank, (doc_id, score) in enumerate(ranked, 1):
                    if any(ch.isspace() for ch in doc_id) or any(ch.isspace() for ch in qid):
                        raise ValueError(f"ids in a TREC run cannot hold whitespace: {qid!r} {doc_id!r}")
                    fh.write(f"{qid} Q0 {doc_id} {rank} {score:.6f} {tag}\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
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
    return {name: sum(values.values()) / n for name, values in per_query.items()}
