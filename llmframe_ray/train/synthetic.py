"""Training data for a reranker from a corpus alone: pseudo-queries, no relevance judgments.

Most users have no judgments for their own corpus. `train-reranker --synthetic` makes them a
training set from the documents themselves:

    a seeded sample of documents
      -> one sentence of each (5-40 words, not the title) is the pseudo-query
      -> the document *without that sentence* is its positive passage (with the sentence left
         in, the pair would teach copying, not relevance)
      -> hard negatives: our own hybrid top documents for the pseudo-query, minus its source
      -> optionally a teacher's scores of every pair (train/distill.py), which also tempers
         the negatives that are in fact relevant

The result is a BeirDataset whose queries are the pseudo-queries and whose judgments say only
"this query came from that document", so the rest of training (mining, groups, distillation,
export) is the judged path's own code. Deterministic for a seed (tested).
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType
from typing import Sequence

from llmframe_ray.eval.beir import BeirDataset
from llmframe_ray.index.domain import SYNTHETIC
from llmframe_ray.index.versions import IndexDirectory
from llmframe_ray.models.passage_window import sentences
from llmframe_ray.train.reranker import Group
from llmframe_ray.types import Chunk, Document, passage_text

SPLIT = SYNTHETIC
MIN_WORDS, MAX_WORDS = 5, 40


def _normal(text: str) -> str:
    return " ".join(re.findall(r"\w+", text.lower()))


def pick_sentence(document: Document, rng: random.Random) -> tuple[str, str] | None:
    """(pseudo-query, the document's text without it), or None when no sentence qualifies:
    5-40 words, not the title again, and something must remain of the text."""
    parts = sentences(document.text)
    title = _normal(document.title)
    usable = [
        i for i, s in enumerate(parts)
        if MIN_WORDS <= len(s.split()) <= MAX_WORDS and _normal(s) != title and len(parts) > 1
    ]
    if not usable:
        return None
    i = rng.choice(usable)
    return parts[i], " ".join(parts[:i] + parts[i + 1 :])


def synthetic_dataset(corpus: BeirDataset, max_queries: int, seed: int) -> tuple[BeirDataset, dict[str, str]]:
    """Pseudo-queries for up to `max_queries` documents of `corpus` (a seeded sample), as a
    dataset judged by source document, and each pseudo-query's positive passage (title and the
    text without the sentence)."""
    if max_queries < 1:
        raise ValueError(f"max_queries must be >= 1, got {max_queries}")
    rng = random.Random(seed)
    order = sorted(range(len(corpus.corpus)), key=lambda i: corpus.corpus[i].doc_id)
    rng.shuffle(order)
    queries: dict[str, str] = {}
    qrels: dict[str, dict[str, int]] = {}
    positives: dict[str, str] = {}
    for i in order:
        if len(queries) >= max_queries:
            break
        document = corpus.corpus[i]
        picked = pick_sentence(document, rng)
        if picked is None:
            continue
        qid = f"pseudo-{len(queries):05d}"
        queries[qid] = picked[0]
        positives[qid] = passage_text(document.title, picked[1])
        qrels[qid] = {document.doc_id: 1}
    if not queries:
        raise ValueError(
            f"no document of {corpus.name} has a sentence of {MIN_WORDS}-{MAX_WORDS} words besides its "
            "title: nothing to make pseudo-queries from"
        )
    digest = hashlib.sha256(json.dumps([queries, qrels], sort_keys=True).encode("utf-8")).hexdigest()
    dataset = replace(
        corpus,
        split=SPLIT,
        queries=MappingProxyType(queries),
        qrels=MappingProxyType({q: MappingProxyType(d) for q, d in qrels.items()}),
        qrels_sha256=digest,
    )
    return dataset, positives


def corpus_of_index(index_dir: Path) -> BeirDataset:
    """The documents of an index's served version, put back together from their chunks (each
    chunk knows where its text starts and ends in its document's text, so overlaps join
    exactly): a user's own corpus, for `train-reranker --index DIR --synthetic`."""
    index = IndexDirectory(index_dir)
    loaded = index.load()
    pieces: dict[str, list[Chunk]] = {}
    for shard in loaded.shards:
        for chunk in shard.store:
            pieces.setdefault(chunk.doc_id, []).append(chunk)
    documents = []
    digest = hashlib.sha256()
    for doc_id in sorted(pieces):
        chunks = sorted(pieces[doc_id], key=lambda c: c.position)
        text, end = "", None
        for chunk in chunks:
            if end is None or chunk.start >= end:  # the first, or after a gap the chunker skipped
                text += ("" if end is None or chunk.start == end else " ") + chunk.text
            else:
                text += chunk.text[end - chunk.start :]
            end = chunk.end if end is None else max(end, chunk.end)
        documents.append(Document(doc_id, text=text, title=chunks[0].title))
        digest.update(json.dumps([doc_id, chunks[0].title, text]).encode("utf-8"))
    if not documents:
        raise ValueError(f"the index {index_dir} has no documents to make pseudo-queries from")
    return BeirDataset(
        name=Path(index_dir).resolve().name, path=Path(index_dir), split="corpus", corpus=tuple(documents),
        queries=MappingProxyType({}), qrels=MappingProxyType({}), corpus_sha256=digest.hexdigest(), qrels_sha256="",
    )


def without_sentences(groups: Sequence[Group], positives: dict[str, str]) -> list[Group]:
    """Groups whose positive passage is its document without the pseudo-query's sentence."""
    return [replace(group, positive=positives[group.query_id]) for group in groups]
