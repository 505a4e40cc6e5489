"""Documents -> chunks -> embeddings -> index shard -> published version, in one process.

The Ray Data job composes the same functions across workers; nothing here is specific to
running in one process except `build_index`, which strings them together.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Callable, Iterable, Sequence

import numpy as np

from llmframe_ray.config import Settings
from llmframe_ray.index.dense import DenseParams
from llmframe_ray.index.shard import IndexShard
from llmframe_ray.index.sparse import SparseParams
from llmframe_ray.index.versions import IndexDirectory
from llmframe_ray.ingest.chunker import Chunker, HFTokenCounter, WhitespaceTokenCounter
from llmframe_ray.models.embedder import SPECIAL_TOKENS, Embedder
from llmframe_ray.types import Chunk, Document

Progress = Callable[[str, int, int], None]


def make_chunker(settings: Settings, embedder: Embedder) -> Chunker:
    """A chunker that counts in the embedder's own tokens (whitespace words for hosted models)."""
    tokenizer = getattr(embedder, "tokenizer", None)
    if tokenizer is not None:
        return Chunker(HFTokenCounter(tokenizer), settings.chunk_size, settings.chunk_overlap, SPECIAL_TOKENS)
    return Chunker(WhitespaceTokenCounter(), settings.chunk_size, settings.chunk_overlap, 0)


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


def chunking_params(settings: Settings) -> dict[str, object]:
    return {"chunk_size": settings.chunk_size, "chunk_overlap": settings.chunk_overlap}


def build_shard(chunks: Sequence[Chunk], embeddings: np.ndarray, embedder: Embedder, settings: Settings) -> IndexShard:
    return IndexShard.build(
        chunks,
        embeddings,
        dense=DenseParams.from_settings(settings),
        sparse=SparseParams.from_settings(settings),
        model=embedder.info(),
        chunking=chunking_params(settings),
    )


def check_build_settings(settings: Settings, embedder: Embedder) -> Chunker:
    """Validate every index parameter before any expensive work; return the chunker."""
    DenseParams.from_settings(settings)
    SparseParams.from_settings(settings)
    return make_chunker(settings, embedder)


def build_index(
    documents: Iterable[Document],
    index_dir: Path,
    settings: Settings,
    embedder: Embedder,
    progress: Progress | None = None,
) -> str:
    """Chunk, embed and index `documents` as one shard; publish it as a new version.

    Leftovers of an earlier build of the same directory that crashed are removed first: one
    writer per index directory at a time.
    """
    chunker = check_build_settings(settings, embedder)
    directory = IndexDirectory(index_dir)
    directory.remove_incomplete()
    chunks = chunk_documents(documents, chunker)
    if not chunks:
        raise ValueError("no text to index: every document was empty")
    if progress is not None:
        progress("chunk", len(chunks), len(chunks))
    embeddings = embed_chunks(chunks, embedder, progress)
    shard = build_shard(chunks, embeddings, embedder, settings)
    return directory.publish([shard])


def stderr_progress() -> Progress:
    """A progress reporter that prints one updating line per stage to stderr."""
    started = time.perf_counter()

    def report(stage: str, done: int, total: int) -> None:
        elapsed = time.perf_counter() - started
        end = "\n" if done >= total else "\r"
        print(f"  {stage}: {done}/{total} ({elapsed:.0f}s)", end=end, file=sys.stderr, flush=True)

    return report
