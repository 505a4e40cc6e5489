"""Independent re-scoring of TREC run files: pytrec_eval directly (not ir-measures, which the eval
command uses) on a BEIR qrels TSV. Judged queries missing from a run count as zero.

    .venv/bin/python scripts/rescore_runs.py QRELS.tsv RUN.trec [RUN.trec ...]
"""

from __future__ import annotations

import statistics
import sys

import pytrec_eval


def read_qrels(path: str) -> dict[str, dict[str, int]]:
    qrels: dict[str, dict[str, int]] = {}
    with open(path, encoding="utf-8") as fh:
        for number, line in enumerate(fh):
            parts = line.split()
            if not parts or (number == 0 and not parts[-1].lstrip("-").isdigit()):
                continue  # blank line, or the BEIR header "query-id corpus-id score"
            qrels.setdefault(parts[0], {})[parts[1]] = int(parts[-1])
    return qrels


def read_run(path: str) -> dict[str, dict[str, float]]:
    run: dict[str, dict[str, float]] = {}
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            qid, _, doc_id, _, score, _ = line.split()
            run.setdefault(qid, {})[doc_id] = float(score)
    return run


def main(argv: list[str]) -> None:
    qrels = read_qrels(argv[0])
    for path in argv[1:]:
        per_query = pytrec_eval.RelevanceEvaluator(qrels, {"ndcg_cut.10"}).evaluate(read_run(path))
        values = [per_query.get(qid, {}).get("ndcg_cut_10", 0.0) for qid in qrels]
        print(f"{path}: nDCG@10 {statistics.mean(values):.4f} over {len(values)} judged queries")


if __name__ == "__main__":
    main(sys.argv[1:])
