"""The ingestion driver's pass over the chunk rows' metadata (batch/job.py `_dedupe`)."""

from __future__ import annotations

import numpy as np

from llmframe_ray.batch.job import META_COLUMNS, _dedupe
from llmframe_ray.batch.report import Skipped


def batch(rows: list[tuple]) -> dict[str, np.ndarray]:
    """Column batches as Ray Data's numpy format gives them (strings as object arrays)."""
    columns = list(zip(*rows))
    out = {}
    for name, values in zip(META_COLUMNS, columns):
        numeric = name in ("file_no", "line", "position")
        out[name] = np.array(values, dtype=np.int64 if numeric else object)
    return out


#        file_no, line, path, doc_id, error, doc_fp, chunk_fp, position
ROWS_A = [
    (1, 3, "b.jsonl", "dup", "", "fp-late", "c-late-0", 0),  # a later occurrence, arriving first
    (0, 2, "a.jsonl", "two", "", "fp-two", "c-two-1", 1),  # chunks out of order
    (0, 1, "a.jsonl", "", "not valid JSON", "", "", -1),
]
ROWS_B = [
    (0, 2, "a.jsonl", "two", "", "fp-two", "c-two-0", 0),
    (0, 5, "a.jsonl", "dup", "", "fp-dup", "c-dup-0", 0),
    (2, 0, "c.txt", "c.txt", "", "fp-c", "c-c-0", 0),
    (1, 0, "b.jsonl", "", "no text to index", "", "", -1),
]


def test_dedupe_keeps_the_first_occurrence_and_orders_chunks_across_batches():
    incoming, fresh, skipped, n_rows = _dedupe([batch(ROWS_A), batch(ROWS_B)])
    assert n_rows == 7
    assert incoming == {"dup": "fp-dup", "two": "fp-two", "c.txt": "fp-c"}
    assert fresh == {"dup": ["c-dup-0"], "two": ["c-two-0", "c-two-1"], "c.txt": ["c-c-0"]}
    assert skipped == [
        Skipped("a.jsonl", 1, "not valid JSON"),
        Skipped("b.jsonl", 0, "no text to index"),
        Skipped("b.jsonl", 3, "duplicate doc_id 'dup', first in a.jsonl line 5"),
    ]


def test_dedupe_of_nothing():
    assert _dedupe([]) == ({}, {}, [], 0)
