"""The synthetic corpus of benchmarks/scale.py: real text, vectors mixed from real embeddings.

The pool is every chunk of the evaluation collections in ../shared/eval (about 19,000 chunks of
SciFact, HotpotQA, Cranfield, CISI and Medline) with its all-MiniLM-L6-v2 vector, read from the
cached evaluation indexes (built on first use, as `llmframe-ray eval` builds them; SciFact takes
about 12 minutes on 2 cores). Chunk i of a synthetic corpus is made, seeded, from three pool
chunks a, b, c:

    text   = the first `HEAD_WORDS` words of a + the first `TAIL_WORDS` words of b
    vector = normalise(v_a + r_b * v_b + r_c * v_c),  r_b, r_c uniform in [0, MIX)

so every vector lies among real MiniLM vectors (the clusters and density of real text, which an
approximate index's recall depends on), and no two chunks are the same. These are the
"precomputed vectors" of the scale benchmark: embedding 10^6 chunks on 2 cores would take
about three hours (~100 chunks/s). The queries are the collections' real questions, embedded by
the model.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from llmframe_ray.eval.beir import load_beir  # noqa: E402
from llmframe_ray.eval.runner import cached_index  # noqa: E402
from llmframe_ray.index.versions import IndexDirectory  # noqa: E402
from llmframe_ray.types import Chunk  # noqa: E402

COLLECTIONS = ("scifact", "hotpotqa", "cranfield", "cisi", "medline")
HEAD_WORDS = 80
TAIL_WORDS = 20
MIX = 0.5
CHUNKS_PER_DOC = 2  # synthetic documents of two chunks each


@dataclass
class Pool:
    texts: list[str]  # chunk texts (title and text, as BM25 indexed them)
    vectors: np.ndarray  # (n, dim) float32, L2-normalised
    queries: list[str]  # the collections' judged test questions
    query_vectors: np.ndarray


def load_pool(eval_dir: Path, settings, embedder, progress=None) -> Pool:
    """Every chunk of the collections under `eval_dir` with its vector, and their questions."""
    params = settings.params()
    texts: list[str] = []
    vectors: list[np.ndarray] = []
    queries: list[str] = []
    for name in COLLECTIONS:
        if not (eval_dir / name).is_dir():
            continue
        dataset = load_beir(eval_dir / name)
        root = cached_index(dataset, params.index, embedder, params.indexes_dir, progress)
        directory = IndexDirectory(root)
        version = directory.current_version()
        for s in range(directory.version_info(version)["shards"]):
            shard = directory.load_shard(version, s)
            if shard is None:
                continue
            vectors.append(shard.dense.vectors(np.arange(len(shard))))
            texts.extend(chunk.indexed_text for chunk in shard.store)
        queries.extend(dataset.queries.values())
    if not texts:
        raise SystemExit(f"no evaluation collection found under {eval_dir}")
    query_vectors = np.asarray(embedder.embed(queries), dtype=np.float32)
    return Pool(texts, np.concatenate(vectors).astype(np.float32), queries, query_vectors)


def synthetic_vectors(pool: Pool, n: int, seed: int = 0, block: int = 200_000) -> np.ndarray:
    """(n, dim) float32 vectors, row i mixed from the pool rows `sources(n, seed)` give it."""
    out = np.empty((n, pool.vectors.shape[1]), dtype=np.float32)
    for start, a, b, c, rb, rc in sources(len(pool.texts), n, seed, block):
        mixed = pool.vectors[a] + rb[:, None] * pool.vectors[b] + rc[:, None] * pool.vectors[c]
        mixed /= np.linalg.norm(mixed, axis=1, keepdims=True)
        out[start:start + len(a)] = mixed
    return out


def synthetic_chunks(pool: Pool, n: int, seed: int = 0) -> list[Chunk]:
    """The n chunks whose vectors `synthetic_vectors(pool, n, seed)` gives, in the same order."""
    heads = [" ".join(t.split()[:HEAD_WORDS]) for t in pool.texts]
    tails = [" ".join(t.split()[:TAIL_WORDS]) for t in pool.texts]
    chunks: list[Chunk] = []
    for start, a, b, _, _, _ in sources(len(pool.texts), n, seed):
        for offset, (i, j) in enumerate(zip(a.tolist(), b.tolist())):
            row = start + offset
            doc = f"syn-{row // CHUNKS_PER_DOC:07d}"
            position = row % CHUNKS_PER_DOC
            chunks.append(Chunk(doc_id=doc, chunk_id=f"{doc}#{position}", text=f"{heads[i]} {tails[j]}", position=position))
    return chunks


def sources(pool_size: int, n: int, seed: int, block: int = 200_000) -> Iterator[tuple]:
    """Per block of rows: (first row, a, b, c, r_b, r_c), the same for the same arguments."""
    rng = np.random.default_rng(seed)
    for start in range(0, n, block):
        size = min(block, n - start)
        a, b, c = (rng.integers(0, pool_size, size) for _ in range(3))
        rb, rc = (rng.uniform(0, MIX, size).astype(np.float32) for _ in range(2))
        yield start, a, b, c, rb, rc
