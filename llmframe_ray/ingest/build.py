"""Documents -> chunks -> embeddings -> index shard -> published version, in one process.

The Ray Data job composes the same functions across workers; nothing here is specific to
running in one process except `build_index`, which strings them together.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from llmframe_ray.index.metadata import namespace_of
from llmframe_ray.index.params import IndexParams
from llmframe_ray.index.shard import IndexShard, shard_of
from llmframe_ray.index.sparse import CorpusStats, corpus_stats
from llmframe_ray.index.versions import IndexDirectory, shard_dir_name
from llmframe_ray.ingest.chunker import Chunker, HFTokenCounter, WhitespaceTokenCounter
from llmframe_ray.models.embedder import SPECIAL_TOKENS, Embedder
from llmframe_ray.types import Chunk, Document

Progress = Callable[[str, int, int], None]


def make_chunker(params: IndexParams, embedder: Embedder) -> Chunker:
    """A chunker that counts in the embedder's own tokens (whitespace words for hosted models)."""
    size, overlap = params.chunking.chunk_size, params.chunking.chunk_overlap
    tokenizer = getattr(embedder, "tokenizer", None)
    if tokenizer is not None:
        return Chunker(HFTokenCounter(tokenizer), size, overlap, SPECIAL_TOKENS)
    return Chunker(WhitespaceTokenCounter(), size, overlap, 0)


def chunk_documents(documents: Iterable[Document], chunker: Chunker) -> list[Chunk]:
    """Chunk every document (one tokenizer pass for all); document ids must be unique."""
    documents = list(documents)
    seen: set[str] = set()
    for doc in documents:
        if doc.doc_id in seen:
            raise ValueError(f"duplicate document id {doc.doc_id!r}")
        seen.add(doc.doc_id)
    return [chunk for chunks in chunker.chunk_many(documents) for chunk in chunks]


def embed_chunks(
    chunks: Sequence[Chunk], embedder: Embedder, progress: Progress | None = None, step: int = 2048
) -> np.ndarray:
    """Embed the chunks' indexed text (title + text), reporting progress every `step` chunks."""
    texts = [c.indexed_text for c in chunks]
    parts = []
    for start in range(0, len(texts), step):
        parts.append(embedder.embed(texts[start : start + step]))
        if progress is not None:
            progress("embed", min(start + step, len(texts)), len(texts))
    if not parts:
        return np.empty((0, embedder.dim), dtype=np.float32)
    return np.vstack(parts)


def build_shard(
    chunks: Sequence[Chunk],
    embeddings: np.ndarray,
    params: IndexParams,
    model: Mapping[str, Any],
    corpus: CorpusStats | None = None,
) -> IndexShard:
    """One shard of `chunks` with these parameters (BM25 with `corpus`-wide statistics, when
    the shard is one of several): the same for the in-process build and the ingestion job."""
    return IndexShard.build(
        chunks,
        embeddings,
        dense=params.dense,
        sparse=params.sparse,
        model=model,
        chunking=params.chunking.to_dict(),
        corpus=corpus,
    )


def build_index(
    documents: Iterable[Document],
    index_dir: Path,
    params: IndexParams,
    embedder: Embedder,
    progress: Progress | None = None,
    shards: int = 1,
) -> str:
    """Chunk, embed and index `documents` into `shards` shards (routed by `shard_of`, BM25
    scored with corpus-wide statistics, as the ingestion job does); publish a new version.

    One writer per index directory at a time: the build holds the directory's writer lock (as
    the ingestion job does; a second writer fails at once with IndexBusyError), removes what a
    crashed earlier write left behind, and publishes only if CURRENT still names the version it
    started from.
    """
    chunker = make_chunker(params, embedder)
    directory = IndexDirectory(index_dir)
    with directory.writer_lock():
        directory.remove_incomplete()
        base = directory.current_version()
        chunks = chunk_documents(documents, chunker)
        if not chunks:
            raise ValueError("no text to index: every document was empty")
        if progress is not None:
            progress("chunk", len(chunks), len(chunks))
        embeddings = embed_chunks(chunks, embedder, progress)
        return publish_shards(directory, chunks, embeddings, params, embedder.info(), shards, base=base)


def publish_shards(
    directory: IndexDirectory,
    chunks: Sequence[Chunk],
    embeddings: np.ndarray,
    params: IndexParams,
    model: Mapping[str, Any],
    shards: int = 1,
    base: str | None | object = ...,
) -> str:
    """Index embedded chunks into `shards` shards (routed by `shard_of`, BM25 scored with
    corpus-wide statistics, as the ingestion job does) and publish them as a new version
    (`base`: see IndexDirectory.commit)."""
    if shards == 1:
        return directory.publish([build_shard(chunks, embeddings, params, model)], base=base)
    if shards < 1:
        raise ValueError(f"shards must be >= 1, got {shards}")
    rows = [[i for i, c in enumerate(chunks) if shard_of(c.doc_id, shards) == s] for s in range(shards)]
    corpus = CorpusStats.merge(
        [
            corpus_stats([chunks[i].indexed_text for i in part], params.sparse, [namespace_of(chunks[i].doc_id) for i in part])
            for part in rows if part
        ]
    )
    version, tmp = directory.stage()
    try:
        for s, part in enumerate(rows):
            if part:
                shard = build_shard([chunks[i] for i in part], embeddings[part], params, model, corpus)
                shard.save(tmp / shard_dir_name(s))
    except Exception:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return directory.commit(version, tmp, shards, base=base)


def stderr_progress() -> Progress:
    """A bar with rate and ETA on a terminal, plain lines every 10 s otherwise (progress.py)."""
    from llmframe_ray.progress import ProgressReporter

    return ProgressReporter()
