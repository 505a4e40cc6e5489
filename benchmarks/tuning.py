"""The tuning queries that fusion and rewriting settings are chosen on, never test queries:
SciFact's train split and the first 100 HotpotQA questions."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from llmframe_ray.eval.beir import BeirDataset, load_beir

EVAL = Path(__file__).resolve().parents[2] / "shared" / "eval"
TUNE = [("scifact", "train", None), ("hotpotqa", "test", 100)]


def load_split(name: str, split: str, first: int | None = None) -> BeirDataset:
    """A collection's split, cut to its first `first` judged queries when given."""
    dataset = load_beir(EVAL / name, split)
    if first is None:
        return dataset
    keep = list(dataset.queries)[:first]
    return replace(dataset, queries={q: dataset.queries[q] for q in keep}, qrels={q: dataset.qrels[q] for q in keep})


def label(name: str, split: str, first: int | None) -> str:
    return f"{name} {split}" + (f" (first {first})" if first else "")
