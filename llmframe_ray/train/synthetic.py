"""Training data for a reranker from a corpus alone: pseudo-queries, no relevance judgments.

Most users have no judgments for their own corpus. `train-reranker --synthetic` makes them a
training set from the documents themselves, in one of two ways (`PseudoQueries`: `title`;
`sentence`; or `auto`, the default: titles where most documents have one):

    title
      a seeded sample of documents whose title has 3 or more words (a document with no title
      field lends its first sentence of 3-40 words, as MEDLINE abstracts carry theirs)
      -> the title is the pseudo-query
      -> every training passage, the positive and the negatives alike, is read without its
         title (and without a first sentence or line that repeats it): with the title left in, the
         pair would teach copying, and with it left in the negatives only, "no title" would
         mark the positive
    sentence
      -> one sentence of each sampled document (5-40 words, not the title) is the pseudo-query
      -> the document *without that sentence* is its positive passage

    then, either way:
      -> hard negatives: our own hybrid top documents for the pseudo-query, minus its source
      -> optionally a teacher's scores of every pair (train/distill.py), which also tempers
         the negatives that are in fact relevant

A title says what its document is about, as a searcher's query does; a sentence taken out of a
document mostly says what its neighbours say. Measured: README "Reranking out of its domain".

The result is a BeirDataset whose queries are the pseudo-queries and whose judgments say only
"this query came from that document", so the rest of training (mining, groups, distillation,
export) is the judged path's own code. Deterministic for a seed (tested).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import random
import re
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType
from typing import Any, Sequence

from llmframe_ray.errors import ModelError
from llmframe_ray.eval.beir import BeirDataset
from llmframe_ray.index.domain import SYNTHETIC
from llmframe_ray.index.versions import IndexDirectory
from llmframe_ray.models.passage_window import sentences
from llmframe_ray.train.reranker import Group
from llmframe_ray.train.warm_start import init_layers
from llmframe_ray.types import Choice, Chunk, Document, passage_text

SPLIT = SYNTHETIC
MIN_WORDS, MAX_WORDS = 5, 40
MIN_TITLE_WORDS = 3  # a shorter title ("Aspirin", a person's name) names its document rather than asks
MIN_BODY_WORDS = 20  # what must remain of a document read without its title


TITLED_SHARE = 0.5  # auto: titles when at least this share of the documents can give one
AUTO_SAMPLE = 2000  # documents (a seeded sample) that auto looks at in a larger corpus
SYNTHETIC_QUERIES = 1500  # the default: every titled document of Cranfield, CISI and Medline
SYNTHETIC_EPOCHS = 1  # the default with pseudo-queries (2 with judgments)


class PseudoQueries(Choice):
    """What of a document becomes its pseudo-query (module docstring); `auto` takes titles when
    at least TITLED_SHARE of the corpus's documents (of a seeded sample of AUTO_SAMPLE in a
    larger corpus) have a usable one (files ingested under one-word names do not), sentences
    otherwise."""

    @classmethod
    def label(cls) -> str:
        return "pseudo-query source"

    AUTO = "auto"
    TITLE = "title"
    SENTENCE = "sentence"

    def resolve(self, corpus: BeirDataset) -> PseudoQueries:
        """TITLE or SENTENCE for this corpus."""
        if self is not PseudoQueries.AUTO:
            return self
        documents = corpus.corpus
        if len(documents) > AUTO_SAMPLE:
            documents = random.Random(0).sample(documents, AUTO_SAMPLE)
        titled = sum(pick_title(document) is not None for document in documents)
        return PseudoQueries.TITLE if titled >= TITLED_SHARE * len(documents) else PseudoQueries.SENTENCE


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


def split_title(document: Document) -> tuple[str, str]:
    """(title, the text without it): the title field, the text less a first sentence that
    repeats it, or less a first line that does (a Markdown or HTML heading has no full stop);
    with no title field, a first sentence of MIN_TITLE_WORDS-MAX_WORDS words and the rest;
    else ("", the text)."""
    parts = sentences(document.text)
    title = document.title.strip()
    if title:
        if parts and _normal(parts[0]) == _normal(title):
            return title, " ".join(parts[1:])
        return title, _without_heading(document.text, title)
    if len(parts) > 1 and MIN_TITLE_WORDS <= len(parts[0].split()) <= MAX_WORDS:
        return parts[0], " ".join(parts[1:])
    return "", document.text


def _without_heading(text: str, title: str) -> str:
    """`text` less a leading run of the title's words (any case, any punctuation or markup
    before and between them) that ends its line or sentence; `text` as it is otherwise."""
    words = re.findall(r"\w+", title.lower())
    found = list(itertools.islice(re.finditer(r"\w+", text), len(words)))
    if not words or [m.group().lower() for m in found] != words:
        return text
    rest = text[found[-1].end():]
    boundary = re.match(r"[ \t\r]*(?:[.!?]+|\n|$)", rest)
    return rest[boundary.end():].strip() if boundary else text


def pick_title(document: Document, rng: random.Random | None = None) -> tuple[str, str] | None:
    """(the title as pseudo-query, the document's text without it), or None when the title is
    shorter than MIN_TITLE_WORDS or too little text remains without it. `rng` is not drawn
    from (one title per document), but taken for the same signature as `pick_sentence`."""
    title, body = split_title(document)
    if len(title.split()) < MIN_TITLE_WORDS or len(body.split()) < MIN_BODY_WORDS:
        return None
    return title, body


def untitled(corpus: BeirDataset, keep: set[str] | None = None) -> BeirDataset:
    """`corpus` with every document (of the ids in `keep`, when given: the others are left
    out) read without its title (split_title): what title pseudo-queries train on, positives
    and negatives alike."""
    documents = []
    for document in corpus.corpus:
        if keep is not None and document.doc_id not in keep:
            continue
        body = split_title(document)[1]
        documents.append(replace(document, title="", text=body if body.strip() else document.text))
    return replace(corpus, corpus=tuple(documents))


def synthetic_dataset(
    corpus: BeirDataset, max_queries: int, seed: int, source: PseudoQueries = PseudoQueries.AUTO
) -> tuple[BeirDataset, dict[str, str]]:
    """Pseudo-queries for up to `max_queries` documents of `corpus` (a seeded sample), as a
    dataset judged by source document, and each pseudo-query's positive passage (for a
    sentence, the title and the text without the sentence; for a title, the text without it,
    and then the negatives must be read without theirs too: `untitled`)."""
    if max_queries < 1:
        raise ValueError(f"max_queries must be >= 1, got {max_queries}")
    source = PseudoQueries.from_str(source).resolve(corpus)
    pick = pick_title if source is PseudoQueries.TITLE else pick_sentence
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
        picked = pick(document, rng)
        if picked is None:
            continue
        qid = f"pseudo-{len(queries):05d}"
        queries[qid] = picked[0]
        positives[qid] = picked[1] if source is PseudoQueries.TITLE else passage_text(document.title, picked[1])
        qrels[qid] = {document.doc_id: 1}
    if not queries:
        wanted = (
            f"a title of {MIN_TITLE_WORDS} or more words (or a first sentence of {MIN_TITLE_WORDS}-{MAX_WORDS}) "
            f"and {MIN_BODY_WORDS} words besides; try --pseudo-queries sentence"
            if source is PseudoQueries.TITLE
            else f"a sentence of {MIN_WORDS}-{MAX_WORDS} words besides its title"
        )
        raise ValueError(f"no document of {corpus.name} has {wanted}: nothing to make pseudo-queries from")
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


def adaptation(teacher: Path | None, layers: int | None) -> dict[str, Any]:
    """train-reranker's settings for `ingest --adapt-reranker` (README "Reranking out of its
    domain"): pseudo-queries as `train-reranker --synthetic` makes them by default (titles where
    most documents have one, up to SYNTHETIC_QUERIES, SYNTHETIC_EPOCHS). Given a teacher and no
    layer count, the teacher itself is adapted (training starts from its weights): the recipe
    that put the SciFact model above hybrid on all four other collections. With a layer count, a
    student of that many MiniLM layers is distilled from it instead. Checked here, before the
    ingestion runs: a teacher to adapt must be a folder that train-reranker made."""
    if teacher is not None and layers is None:
        try:
            init_layers(teacher)
        except ModelError as exc:
            raise ModelError(
                f"--adapt-teacher {teacher} cannot be adapted: it is not a reranker made by train-reranker (it needs "
                "model.onnx and a card with its layers); give --adapt-layers N to distil an N-layer MiniLM student from it"
            ) from exc
    return {
        "init": teacher if layers is None else None, "layers": layers, "pseudo_queries": PseudoQueries.AUTO,
        "synthetic_queries": SYNTHETIC_QUERIES, "epochs": SYNTHETIC_EPOCHS,
    }
