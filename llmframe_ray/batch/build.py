"""Building the shards of a new version from a plan (run as Ray tasks by the job).

Two passes, because BM25 needs statistics of the whole corpus (see SparseIndex.build):

1. `collect_shard` (changed shards only): the chunks the shard keeps from the previous version
   (with their stored vectors) plus this run's staged chunks -> a part folder (chunk store +
   vectors) and the shard's own BM25 statistics. `shard_stats` gives an unchanged shard's.
2. The driver adds the statistics up. `finish_shard` builds a changed shard from its part with
   those corpus-wide statistics; `IndexShard.relink` carries an unchanged one over (dense index
   and chunk store hard-linked, BM25 part rescored).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from llmframe_ray.index.metadata import namespace_of
from llmframe_ray.index.params import IndexParams
from llmframe_ray.index.shard import IndexShard
from llmframe_ray.index.sparse import CorpusStats, SparseParams, corpus_stats
from llmframe_ray.index.store import ChunkStore
from llmframe_ray.ingest.build import build_shard
from llmframe_ray.batch.plan import ShardPlan
from llmframe_ray.batch.staging import Staging

VECTORS_FILE = "vectors.npy"


def collect_shard(
    plan: ShardPlan,
    old_dir: str | None,
    staging: Staging,
    fresh_fingerprints: Sequence[str],
    part_dir: str,
    sparse: SparseParams,
) -> CorpusStats:
    """Write the changed shard's final chunks and vectors to `part_dir`; return its statistics
    (zero documents when the shard ends up empty, and then nothing is written)."""
    chunks, vectors = [], []
    if old_dir is not None and plan.keep:
        old = IndexShard.load(old_dir, mmap=True)
        codes = [i for i, doc in enumerate(old.store.doc_table) if doc in plan.keep]
        rows = np.flatnonzero(np.isin(np.asarray(old.store.doc_index), codes)).tolist()
        chunks.extend(old.chunks(rows))
        vectors.append(old.dense.vectors(rows))
    if fresh_fingerprints:
        fresh, fresh_vectors = staging.read(plan.shard, fresh_fingerprints)
        chunks.extend(fresh)
        vectors.append(fresh_vectors)
    if not chunks:
        return CorpusStats(0, 0, {})
    part = Path(part_dir)
    if part.exists():  # a retried task
        shutil.rmtree(part)
    part.mkdir(parents=True)
    ChunkStore.from_chunks(chunks).save(part)
    np.save(part / VECTORS_FILE, np.vstack(vectors), allow_pickle=False)
    return corpus_stats([c.indexed_text for c in chunks], sparse, [namespace_of(c.doc_id) for c in chunks])


def shard_stats(old_dir: str) -> CorpusStats:
    return IndexShard.load(old_dir, mmap=True).bm25_stats()


def finish_shard(
    part_dir: str, target: str, corpus: CorpusStats, params: IndexParams, model: Mapping[str, Any]
) -> dict[str, int]:
    """Build the shard from its part with corpus-wide BM25 statistics, save it at `target`."""
    part = Path(part_dir)
    _clear(target)
    chunks = list(ChunkStore.load(part, mmap=False))
    vectors = np.load(part / VECTORS_FILE)
    shard = build_shard(chunks, vectors, params, model, corpus)
    shard.save(target)
    return dict(shard.manifest.counts)


def carry_shard(old_dir: str, target: str, corpus: CorpusStats) -> dict[str, int]:
    _clear(target)
    manifest = IndexShard.relink(old_dir, target, corpus)
    return dict(manifest.counts)


def _clear(target: str) -> None:
    """A retried task (its worker died after writing) starts over: the target sits in the
    unpublished version folder, which nothing reads yet."""
    if Path(target).exists():
        shutil.rmtree(target)
