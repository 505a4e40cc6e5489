"""BEIR-layout test collections: corpus.jsonl, queries.jsonl, qrels/<split>.tsv."""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Mapping

from llmframe_ray.errors import DatasetError, DocumentReadError
from llmframe_ray.index.manifest import describe_file
from llmframe_ray.ingest.readers import read_jsonl
from llmframe_ray.types import Document

REQUIRED = ("corpus.jsonl", "queries.jsonl")


@dataclass(frozen=True)
class BeirDataset:
    name: str
    path: Path
    split: str
    corpus: tuple[Document, ...]
    queries: Mapping[str, str]  # judged queries of the split only, in file order
    qrels: Mapping[str, Mapping[str, int]]
    corpus_sha256: str
    qrels_sha256: str


def _check_files(root: Path, split: str) -> Path:
    if not root.is_dir():
        raise DatasetError(f"dataset folder {root} does not exist")
    qrels_path = root / "qrels" / f"{split}.tsv"
    missing = [str(root / name) for name in REQUIRED if not (root / name).is_file()]
    if not qrels_path.is_file():
        missing.append(str(qrels_path))
    if missing:
        raise DatasetError(
            f"dataset folder {root} is missing {', '.join(missing)} "
            "(a BEIR folder holds corpus.jsonl, queries.jsonl and qrels/<split>.tsv)"
        )
    return qrels_path


def _read_records(path: Path) -> list[Document]:
    try:
        return list(read_jsonl(path))
    except DocumentReadError as exc:
        raise DatasetError(str(exc)) from None


def read_qrels(path: Path) -> dict[str, dict[str, int]]:
    qrels: dict[str, dict[str, int]] = {}
    with open(path, encoding="utf-8", newline="") as fh:
        reader = csv.reader(fh, delimiter="\t")
        for lineno, row in enumerate(reader, 1):
            if not row or (lineno == 1 and row[0] == "query-id"):
                continue
            if len(row) != 3:
                raise DatasetError(f"{path} line {lineno}: expected 3 tab-separated fields, got {len(row)}")
            qid, doc_id, grade = row
            try:
                qrels.setdefault(qid, {})[doc_id] = int(grade)
            except ValueError:
                raise DatasetError(f"{path} line {lineno}: relevance {grade!r} is not an integer") from None
    return qrels


def load_beir(path: str | Path, split: str = "test") -> BeirDataset:
    """Load a BEIR folder; queries are those of `split` that have at least one judgment."""
    root = Path(path)
    qrels_path = _check_files(root, split)
    corpus = tuple(_read_records(root / "corpus.jsonl"))
    qrels = read_qrels(qrels_path)
    if not qrels:
        raise DatasetError(f"{qrels_path} holds no judgments")
    all_queries = {q.doc_id: q.text for q in _read_records(root / "queries.jsonl")}
    unknown = sorted(set(qrels) - set(all_queries))
    if unknown:
        raise DatasetError(f"{qrels_path} judges queries missing from queries.jsonl: {unknown[:5]}")
    queries = {qid: text for qid, text in all_queries.items() if qid in qrels}
    return BeirDataset(
        name=root.resolve().name,
        path=root,
        split=split,
        corpus=corpus,
        queries=MappingProxyType(queries),
        qrels=MappingProxyType({q: MappingProxyType(d) for q, d in qrels.items()}),
        corpus_sha256=describe_file(root / "corpus.jsonl")["sha256"],
        qrels_sha256=describe_file(qrels_path)["sha256"],
    )


def load_corpus(path: str | Path) -> BeirDataset:
    """A BEIR folder's corpus alone (no queries, no judgments needed): for training from
    pseudo-queries (train/synthetic.py)."""
    root = Path(path)
    if not root.is_dir():
        raise DatasetError(f"dataset folder {root} does not exist")
    if not (root / "corpus.jsonl").is_file():
        raise DatasetError(f"dataset folder {root} has no corpus.jsonl")
    return BeirDataset(
        name=root.resolve().name,
        path=root,
        split="corpus",
        corpus=tuple(_read_records(root / "corpus.jsonl")),
        queries=MappingProxyType({}),
        qrels=MappingProxyType({}),
        corpus_sha256=describe_file(root / "corpus.jsonl")["sha256"],
        qrels_sha256="",
    )
