"""What one ingestion run changes: routing, fingerprints, and the per-shard plan.

Pure Python (no Ray): the job computes a plan from what the previous version holds and what
the sources give, then carries out only what the plan says.

    shard of a document   = blake2b(doc_id) mod S (stable across runs, processes and machines)
    chunk fingerprint     = blake2b of every stored field of the chunk (id, text, title, offsets)
    document fingerprint  = blake2b of its chunks' fingerprints in order

A re-ingested document whose fingerprint equals the stored one is unchanged: it is neither
embedded nor does it make its shard change.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

from llmframe_ray.errors import LLMFrameError
from llmframe_ray.index.shard import shard_of  # noqa: F401  (re-exported: the routing rule)
from llmframe_ray.types import Chunk

class PlanError(LLMFrameError):
    """The run's arguments contradict each other or the existing index."""


def chunk_fingerprint(chunk: Chunk) -> str:
    return hashlib.blake2b(chunk.to_json().encode("utf-8"), digest_size=16).hexdigest()


def doc_fingerprint(chunk_fingerprints: Iterable[str]) -> str:
    return hashlib.blake2b("\n".join(chunk_fingerprints).encode("ascii"), digest_size=16).hexdigest()


def stored_fingerprints(chunks: Iterable[Chunk]) -> dict[str, str]:
    """doc_id -> document fingerprint of the chunks a shard stores (in row order)."""
    per_doc: dict[str, list[str]] = {}
    for chunk in chunks:
        per_doc.setdefault(chunk.doc_id, []).append((chunk.position, chunk_fingerprint(chunk)))
    return {doc: doc_fingerprint(fp for _, fp in sorted(parts)) for doc, parts in per_doc.items()}


@dataclass(frozen=True)
class ShardPlan:
    shard: int
    changed: bool
    keep: frozenset[str]  # documents carried over from the previous version's shard
    fresh: frozenset[str]  # documents whose chunks come from this run

    @property
    def documents(self) -> int:
        return len(self.keep) + len(self.fresh)


@dataclass(frozen=True)
class Plan:
    n_shards: int
    shards: tuple[ShardPlan, ...]
    added: tuple[str, ...]
    replaced: tuple[str, ...]
    unchanged: tuple[str, ...]
    deleted: tuple[str, ...]
    not_found: tuple[str, ...]  # --delete ids the index does not hold

    @property
    def fresh(self) -> frozenset[str]:
        return frozenset(self.added) | frozenset(self.replaced)

    @property
    def changed_shards(self) -> list[int]:
        return [s.shard for s in self.shards if s.changed]

    @property
    def changes_anything(self) -> bool:
        return bool(self.changed_shards)


def make_plan(
    n_shards: int,
    previous: Sequence[Mapping[str, str]] | None,
    incoming: Mapping[str, str],
    deletes: Iterable[str] = (),
) -> Plan:
    """The plan for one run.

    `previous[s]` maps each document of the previous version's shard s to its fingerprint
    (None: no previous version); `incoming` maps each document read this run to its
    fingerprint; `deletes` are document ids to remove.
    """
    if n_shards < 1:
        raise PlanError(f"the number of shards must be >= 1, got {n_shards}")
    deletes = list(dict.fromkeys(deletes))
    both = sorted(set(deletes) & set(incoming))
    if both:
        raise PlanError(f"document {both[0]!r} is both read from the sources and named by --delete")
    if previous is not None and len(previous) != n_shards:
        raise PlanError(
            f"the index has {len(previous)} shards; ingest into it with --shards {len(previous)}, "
            "or build a new index directory to change the shard count"
        )
    old = [dict(p) for p in previous] if previous is not None else [{} for _ in range(n_shards)]
    held = {doc: s for s, docs in enumerate(old) for doc in docs}
    added, replaced, unchanged = [], [], []
    for doc, fp in incoming.items():
        if doc not in held:
            added.append(doc)
        elif old[held[doc]][doc] != fp:
            replaced.append(doc)
        else:
            unchanged.append(doc)
    deleted = [d for d in deletes if d in held]
    not_found = [d for d in deletes if d not in held]
    fresh_by_shard: list[set[str]] = [set() for _ in range(n_shards)]
    for doc in (*added, *replaced):
        fresh_by_shard[shard_of(doc, n_shards)].add(doc)
    drop = set(deleted) | set(replaced)
    plans = []
    for s in range(n_shards):
        keep = frozenset(d for d in old[s] if d not in drop)
        fresh = frozenset(fresh_by_shard[s])
        changed = bool(fresh) or len(keep) != len(old[s])
        plans.append(ShardPlan(s, changed, keep, fresh))
    return Plan(
        n_shards, tuple(plans), tuple(sorted(added)), tuple(sorted(replaced)),
        tuple(sorted(unchanged)), tuple(sorted(deleted)), tuple(not_found),
    )
