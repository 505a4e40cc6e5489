"""The ingestion plan (pure Python): routing, fingerprints, what each run changes."""

import pytest

from llmframe_ray.batch.plan import (
    PlanError, chunk_fingerprint, doc_fingerprint, make_plan, shard_of,
    stored_fingerprints,
)
from llmframe_ray.types import Chunk


def test_routing_is_stable_and_spreads_documents():
    ids = [f"doc-{i}" for i in range(4000)]
    first = [shard_of(d, 4) for d in ids]
    assert first == [shard_of(d, 4) for d in ids]
    counts = [first.count(s) for s in range(4)]
    assert min(counts) > 850 and max(counts) < 1150  # 1000 expected each
    assert shard_of("anything", 1) == 0
    # the routing is blake2b-based, not Python's per-process salted hash()
    assert shard_of("doc-0", 4) == int.from_bytes(__import__("hashlib").blake2b(b"doc-0", digest_size=8).digest(), "big") % 4


def test_fingerprints_cover_every_stored_field():
    chunk = Chunk("d#0-aa", "d", 0, "text", title="T", start=0, end=4, n_tokens=1)
    assert Chunk.from_json(chunk.to_json()) == chunk
    retitled = Chunk("d#0-aa", "d", 0, "text", title="U", start=0, end=4, n_tokens=1)
    assert chunk_fingerprint(chunk) != chunk_fingerprint(retitled)
    second = Chunk("d#1-bb", "d", 1, "more", title="T", start=5, end=9, n_tokens=1)
    stored = stored_fingerprints([second, chunk])  # row order does not matter, position does
    assert stored == {"d": doc_fingerprint([chunk_fingerprint(chunk), chunk_fingerprint(second)])}


def test_plan_of_a_first_run_adds_everything():
    plan = make_plan(2, None, {"a": "1", "b": "2", "c": "3"})
    assert plan.added == ("a", "b", "c") and plan.replaced == plan.unchanged == plan.deleted == ()
    assert sorted(plan.changed_shards) == sorted({shard_of(d, 2) for d in "abc"})
    assert sum(s.documents for s in plan.shards) == 3


def test_plan_rebuilds_only_shards_whose_documents_change():
    docs = {f"d{i}": f"fp{i}" for i in range(12)}
    previous = [{} for _ in range(3)]
    for doc, fp in docs.items():
        previous[shard_of(doc, 3)][doc] = fp
    changed, removed = "d4", "d7"
    incoming = {**docs, changed: "new"}
    del incoming[removed]
    plan = make_plan(3, previous, incoming, [removed, "ghost"])
    assert plan.replaced == (changed,) and plan.deleted == (removed,) and plan.not_found == ("ghost",)
    assert len(plan.unchanged) == 10 and plan.added == ()
    assert plan.changed_shards == sorted({shard_of(changed, 3), shard_of(removed, 3)})
    target = plan.shards[shard_of(changed, 3)]
    assert changed in target.fresh and changed not in target.keep
    assert removed not in plan.shards[shard_of(removed, 3)].keep
    unchanged_run = make_plan(3, previous, docs)
    assert not unchanged_run.changes_anything


def test_plan_rejects_contradictions():
    with pytest.raises(PlanError, match="'a' is both read from the sources and named by --delete"):
        make_plan(2, None, {"a": "1"}, ["a"])
    with pytest.raises(PlanError, match="the index has 2 shards; ingest into it with --shards 2"):
        make_plan(3, [{}, {}], {"a": "1"})
    with pytest.raises(PlanError, match="must be >= 1"):
        make_plan(0, None, {})
