"""Rationale sentences as training data, so that a reranker also learns which *sentence* of a
passage answers a query: what the contextual compression stage asks of it (retrieve/compress.py).

A collection with a `rationales/` folder (SciFact's layout) names, per claim, the sentences of
its cited abstracts that support or refute it:

    rationales/claims_<split>.jsonl      {"id", "claim", "evidence": {doc_id: [{"sentences": [i, ...]}]}}
    rationales/corpus_sentences.jsonl    {"doc_id", "title", "abstract": [sentence, ...]}

One training group per gold sentence: the claim, the sentence (with its passage's title, as the
compression stage shows a sentence to the scorer) as the positive, and negatives drawn (seeded)
from the other sentences of the documents that the stage would see for that claim: the top
`RATIONALE_POOL_DEPTH` hybrid documents and the cited ones, minus every gold sentence.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from llmframe_ray.errors import DatasetError
from llmframe_ray.retrieve.compress import scoring_text
from llmframe_ray.train.reranker import Group, TrainConfig

RATIONALE_POOL_DEPTH = 5  # the compression stage sees the top 5 documents by default (top_k)
SPLIT_FILES = {"train": "claims_train.jsonl", "dev": "claims_dev.jsonl"}


@dataclass(frozen=True)
class Rationales:
    claims: Mapping[str, tuple[str, frozenset[tuple[str, int]]]]  # query id -> (claim, {(doc_id, sentence)})
    documents: Mapping[str, tuple[str, tuple[str, ...]]]  # doc_id -> (title, sentences)

    @property
    def gold_sentences(self) -> int:
        return sum(len(gold) for _, gold in self.claims.values())


def load_rationales(dataset_dir: Path, split: str) -> Rationales:
    """The claims of `split` that have evidence, and every document's sentences."""
    folder = Path(dataset_dir) / "rationales"
    if split not in SPLIT_FILES:
        raise DatasetError(f"rationales: no claims file for split {split!r} (have: {', '.join(SPLIT_FILES)})")
    claims_file, sentences_file = folder / SPLIT_FILES[split], folder / "corpus_sentences.jsonl"
    for path in (claims_file, sentences_file):
        if not path.is_file():
            raise DatasetError(f"--rationales needs {path} (SciFact's rationales/ layout)")
    documents = {}
    for number, line in enumerate(sentences_file.read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            row = _row(line, sentences_file, number, ("doc_id", "abstract"))
            documents[str(row["doc_id"])] = (str(row.get("title") or ""), tuple(str(s) for s in row["abstract"]))
    claims = {}
    for number, line in enumerate(claims_file.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        row = _row(line, claims_file, number, ("id", "claim", "evidence"))
        gold = frozenset(
            (str(doc), int(i))
            for doc, sets in row["evidence"].items()
            for evidence in sets
            for i in evidence["sentences"]
            if str(doc) in documents and 0 <= int(i) < len(documents[str(doc)][1])
        )
        if gold:
            claims[str(row["id"])] = (str(row["claim"]), gold)
    return Rationales(claims, documents)


def _row(line: str, path: Path, number: int, required: Sequence[str]) -> dict:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as exc:
        raise DatasetError(f"{path} line {number}: not JSON ({exc.msg})") from None
    missing = [k for k in required if k not in row]
    if missing:
        raise DatasetError(f"{path} line {number}: missing {', '.join(missing)}")
    return row


def sentence_groups(
    rationales: Rationales, qids: Sequence[str], candidates: Mapping[str, Sequence[str]], config: TrainConfig
) -> list[Group]:
    """One group per gold sentence of the claims among `qids` (see the module docstring)."""
    rng = random.Random(config.seed + 1)  # not the passage groups' stream
    groups = []
    for qid in qids:
        if qid not in rationales.claims:
            continue
        claim, gold = rationales.claims[qid]
        docs = list(dict.fromkeys([
            *(d for d in candidates.get(qid, [])[:RATIONALE_POOL_DEPTH] if d in rationales.documents),
            *sorted({d for d, _ in gold}),
        ]))
        pool = [(d, i) for d in docs for i in range(len(rationales.documents[d][1])) if (d, i) not in gold]
        if len(pool) < config.negatives:
            continue
        for doc, i in sorted(gold):
            picked = rng.sample(pool, config.negatives)
            negatives = tuple(_text(rationales, d, j) for d, j in picked)
            groups.append(Group(qid, claim, _text(rationales, doc, i), negatives, kind="sentence"))
    return groups


def _text(rationales: Rationales, doc: str, i: int) -> str:
    title, sentences = rationales.documents[doc]
    return scoring_text(title, sentences[i])
