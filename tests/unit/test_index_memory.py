"""The memory guard (index/memory.py): what a served version holds in the process, the memory the
process may still use, and a load refused with the numbers instead of an out-of-memory kill."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest

from llmframe_ray.config import load_settings
from llmframe_ray.errors import IndexLoadError
from llmframe_ray.index.memory import MIB, MemoryNeed, check_fits, memory_budget, version_need
from llmframe_ray.index.versions import IndexDirectory, shard_dir_name
from llmframe_ray.ingest.build import publish_shards
from llmframe_ray.retrieve.params import RetrievalParams
from llmframe_ray.retrieve.pipeline import Pipeline
from llmframe_ray.types import Chunk

DIM = 8


def publish(root, n_docs: int, chunks_per_doc: int, shards: int = 1) -> str:
    chunks = [
        Chunk(doc_id=f"document-{d:05d}", chunk_id=f"document-{d:05d}#{c}", text=f"word{d} word{c} shared words here",
              position=c)
        for d in range(n_docs) for c in range(chunks_per_doc)
    ]
    vectors = np.random.default_rng(5).normal(size=(len(chunks), DIM)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    model = {"name": "random", "provider": "test", "dim": DIM, "max_length": 64}
    return publish_shards(IndexDirectory(root), chunks, vectors, load_settings().params().index, model, shards=shards)


def expected_documents(shard) -> int:
    """6 bytes per byte of the parsed id (and metadata) JSON, 4 per character of the id array."""
    ids = json.loads((shard / "chunks.docs.json").read_text())
    metadata = shard / "chunks.metadata.json"
    parsed = (shard / "chunks.docs.json").stat().st_size + (metadata.stat().st_size if metadata.exists() else 0)
    return 6 * parsed + 4 * len(ids) * max(len(i) for i in ids)


@pytest.mark.parametrize("n_docs, chunks_per_doc, part, per_row", [
    (40, 3, "flat vectors", 4 * DIM),  # under 2,048 rows: scanned whole, resident
    (700, 3, "int8 codes", DIM + 8),  # 2,100 rows: one byte per dimension and a bound per row
])
def test_the_estimate_counts_what_the_process_holds(tmp_path, n_docs, chunks_per_doc, part, per_row):
    version = publish(tmp_path / "index", n_docs, chunks_per_doc)
    shard = tmp_path / "index" / "versions" / version / shard_dir_name(0)
    need = dict(version_need([shard], None).parts)
    rows = n_docs * chunks_per_doc
    assert need == {
        part: rows * per_row,
        "BM25 vocabulary": 8 * (shard / "sparse" / "vocab.index.json").stat().st_size,
        "documents": expected_documents(shard),
    }


def fake_machine(root, available_kib: int, cgroup: tuple[str, int] | None = None, rss_kib: int = 0, v1: bool = False):
    (root / "proc" / "self").mkdir(parents=True)
    (root / "proc" / "meminfo").write_text(f"MemTotal:       24000000 kB\nMemAvailable:   {available_kib} kB\n")
    (root / "proc" / "self" / "status").write_text(f"Name:\tpython\nVmRSS:\t{rss_kib} kB\n")
    if cgroup is not None:
        base = root / "sys" / "fs" / "cgroup" / ("memory" if v1 else "")
        base.mkdir(parents=True)
        limit, usage = cgroup
        (base / ("memory.limit_in_bytes" if v1 else "memory.max")).write_text(limit + "\n")
        (base / ("memory.usage_in_bytes" if v1 else "memory.current")).write_text(f"{usage}\n")
    return root


@pytest.mark.parametrize("v1", [False, True])
def test_the_budget_is_the_smallest_of_machine_container_and_setting(tmp_path, v1):
    root = fake_machine(tmp_path, available_kib=8 * 1024 * 1024, cgroup=(str(3 * 2**30), 2**30), rss_kib=100 * 1024, v1=v1)
    container = memory_budget(None, root)
    assert (container.bytes, container.source) == (2 * 2**30, "2,048 MiB under the container's memory limit of 3,072 MiB")
    setting = memory_budget(1000, root)
    assert (setting.bytes, setting.source) == (900 * MIB, "900 MiB of LLMFRAME_MEMORY_LIMIT_MB=1000 (this process holds 100 MiB)")


def test_an_unlimited_container_leaves_the_machines_available_memory(tmp_path):
    root = fake_machine(tmp_path, available_kib=512 * 1024, cgroup=("max", 2**30))
    budget = memory_budget(None, root)
    assert (budget.bytes, budget.source) == (512 * MIB, "512 MiB available on this machine (MemAvailable)")
    assert memory_budget(None, tmp_path / "nowhere") is None


def test_a_load_over_the_budget_is_refused_with_the_numbers(tmp_path):
    root = fake_machine(tmp_path, available_kib=300 * 1024)
    need = MemoryNeed((("int8 codes", 250 * MIB), ("knowledge graph", 120 * MIB), ("BM25 vocabulary", 1000)))
    with pytest.raises(IndexLoadError) as refused:
        check_fits("version v1 of /data/index", need, None, root)
    assert str(refused.value) == (
        "version v1 of /data/index does not fit in this process's memory: it needs about 370 MiB (int8 codes "
        "250 MiB, knowledge graph 120 MiB), but only 300 MiB available on this machine (MemAvailable) is left; "
        "give the replica more memory, spread the shards over more replicas (shards_per_group), or set "
        "LLMFRAME_MEMORY_LIMIT_MB=0 to load it anyway"
    )
    check_fits("version v1", need, 0, root)  # 0: no check
    check_fits("version v1", MemoryNeed((("int8 codes", 250 * MIB),)), None, root)  # fits


def test_serving_refuses_an_index_over_the_memory_limit_and_loads_it_under_one(tmp_path, monkeypatch):
    from llmframe_ray.retrieve.shard_cache import ShardCache

    root = tmp_path / "index"
    version = publish(root, 40, 3, shards=2)
    monkeypatch.setenv("LLMFRAME_MEMORY_LIMIT_MB", "1")  # less than this process already holds
    tight = load_settings().params().retrieval
    assert tight.memory_limit_mb == 1
    with pytest.raises(IndexLoadError, match=rf"^version {version} of {root} does not fit in this process's memory"):
        Pipeline.open(root, None, tight)
    cache = ShardCache(str(root), [1], tight)  # a shard group: its own shards, not the graph
    with pytest.raises(IndexLoadError, match=rf"^version {version} of {root} \(shards 1\) does not fit"):
        asyncio.run(cache.version(version))
    roomy = RetrievalParams(memory_limit_mb=64 * 1024)
    assert len(Pipeline.open(root, None, roomy).shards) == 2
    assert asyncio.run(ShardCache(str(root), [0, 1], roomy).version(version))
