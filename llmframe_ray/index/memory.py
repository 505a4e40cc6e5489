"""Whether an index version fits the memory of the process about to serve it.

A served version is mostly memory-mapped (the vectors, the BM25 matrices, the chunk texts): the
kernel pages those in and out as searches read them, so they cost page cache, not the process's
own memory. What the process does hold is what this module estimates, from the files and the
manifests, before it loads anything:

    int8 codes        one byte per dimension per row of a flat shard of 2,048 rows or more
                      (index/prefilter.py), with an 8-byte error bound per row
    flat vectors      a smaller flat shard is scanned whole by every query: its vectors stay
                      resident
    ANN structure     an HNSW or IVF file beyond its mapped vectors / lists (graph, centroids)
    BM25 vocabulary   the vocabulary JSON, parsed into a dict (about 8 bytes of memory per byte)
    documents         the document ids and metadata JSON, parsed (about 6 bytes per byte), and
                      the ids as a fixed-width string array (4 bytes per character)
    knowledge graph   its arrays and JSON files, read whole, when this process holds every shard

Measured with a scratch script reading RssAnon around loading and a first hybrid search, the
compiled code warmed up beforehand: SciFact (9,981 chunks) with its knowledge graph, the shard
about 9 MiB and the graph 115.7 MiB (estimates 8 and 116 MiB); synthetic indexes of SciFact
sentences with random vectors, 10^5 chunks in 2 shards 54.7 MiB (estimate 50.8) and 10^6 chunks
in 4 shards 472.7 MiB (estimate 457.0, of which int8 codes 374 MiB).

The estimate is compared with the memory the process may still use: the smallest of what the
machine has available (MemAvailable), what the container's memory limit leaves (cgroup v2 or
v1), and `LLMFRAME_MEMORY_LIMIT_MB` minus this process's resident memory. Over it, the load is
refused with an IndexLoadError that names the numbers, instead of the process being killed by the
kernel halfway through serving. `LLMFRAME_MEMORY_LIMIT_MB=0` turns the check off.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from llmframe_ray.errors import IndexLoadError

MIB = 2**20
PREFILTER_ROWS = 2048  # index/prefilter.py: MIN_ROWS
JSON_DICT_FACTOR = 8
JSON_TABLE_FACTOR = 6
GRAPH_JSON_FACTOR = 6
_FAISS_KIND = {b"IxFI": "flat", b"IHNf": "hnsw", b"IwFl": "ivf"}


@dataclass(frozen=True)
class MemoryNeed:
    """What loading some shards of a version holds in the process, by part (bytes)."""

    parts: tuple[tuple[str, int], ...]

    @property
    def total(self) -> int:
        return sum(n for _, n in self.parts)

    def describe(self) -> str:
        shown = [f"{name} {_mib(n)}" for name, n in sorted(self.parts, key=lambda p: -p[1]) if n >= MIB]
        return ", ".join(shown) or "all parts under 1 MiB"


@dataclass(frozen=True)
class MemoryBudget:
    """The memory this process may still use, and what set it."""

    bytes: int
    source: str


def version_need(shard_dirs: Sequence[Path], graph_dir: Path | None) -> MemoryNeed:
    """The estimate for loading these shard folders of a version, and its knowledge graph
    folder when given (the process that holds every shard loads it)."""
    parts: dict[str, int] = {}

    def add(name: str, n: int) -> None:
        parts[name] = parts.get(name, 0) + max(0, int(n))

    for shard in shard_dirs:
        manifest_file = shard / "manifest.json"
        if not manifest_file.is_file():
            continue  # an empty shard, or one the load itself will report
        manifest = json.loads(manifest_file.read_text())
        rows = int(manifest.get("counts", {}).get("chunks", 0))
        dim = int(manifest.get("model", {}).get("dim") or 0)
        dense = shard / "dense.faiss"
        if dense.is_file() and rows:
            kind = _faiss_kind(dense)
            vectors = rows * dim * 4
            if kind == "flat" and rows >= PREFILTER_ROWS:
                add("int8 codes", rows * dim + rows * 8)
            elif kind == "flat":
                add("flat vectors", vectors)
            else:
                add("ANN structure", dense.stat().st_size - vectors)
        add("BM25 vocabulary", JSON_DICT_FACTOR * _size(shard / "sparse" / "vocab.index.json"))
        docs = shard / "chunks.docs.json"
        add("documents", JSON_TABLE_FACTOR * (_size(docs) + _size(shard / "chunks.metadata.json")))
        add("documents", 4 * int(manifest.get("counts", {}).get("documents", 0)) * _longest_id(docs))
    if graph_dir is not None and graph_dir.is_dir():
        for path in graph_dir.iterdir():
            if path.suffix == ".npz":
                add("knowledge graph", _size(path))
            elif path.suffix == ".json":
                add("knowledge graph", GRAPH_JSON_FACTOR * _size(path))
    return MemoryNeed(tuple(parts.items()))


def memory_budget(limit_mb: int | None = None, root: Path = Path("/")) -> MemoryBudget | None:
    """The smallest of: MemAvailable, the cgroup limit minus its usage, and `limit_mb` minus
    this process's resident memory (None: not set). None when none of them can be read."""
    found: list[MemoryBudget] = []
    available = _meminfo(root / "proc" / "meminfo").get("MemAvailable")
    if available is not None:
        found.append(MemoryBudget(available, f"{_mib(available)} available on this machine (MemAvailable)"))
    cgroup = _cgroup_headroom(root / "sys" / "fs" / "cgroup")
    if cgroup is not None:
        found.append(cgroup)
    if limit_mb:
        resident = _resident(root / "proc" / "self" / "status")
        left = limit_mb * MIB - resident
        found.append(MemoryBudget(left, f"{_mib(left)} of LLMFRAME_MEMORY_LIMIT_MB={limit_mb} (this process holds {_mib(resident)})"))
    return min(found, key=lambda b: b.bytes) if found else None


def check_fits(what: str, need: MemoryNeed, limit_mb: int | None, root: Path = Path("/")) -> None:
    """Refuse (IndexLoadError) to load `what` when its estimate is over the budget.
    `limit_mb` 0: no check."""
    if limit_mb == 0:
        return
    budget = memory_budget(limit_mb, root)
    if budget is None or need.total <= budget.bytes:
        return
    raise IndexLoadError(
        f"{what} does not fit in this process's memory: it needs about {_mib(need.total)} "
        f"({need.describe()}), but only {budget.source} is left; give the replica more memory, spread the "
        "shards over more replicas (shards_per_group), or set LLMFRAME_MEMORY_LIMIT_MB=0 to load it anyway"
    )


def _mib(n: int) -> str:
    return f"{n / MIB:,.0f} MiB"


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _faiss_kind(path: Path) -> str:
    with open(path, "rb") as handle:
        return _FAISS_KIND.get(handle.read(4), "other")


def _longest_id(docs: Path) -> int:
    """The longest document id of a shard's document table (chunks.docs.json: a list of ids)."""
    try:
        table = json.loads(docs.read_text())
    except (OSError, ValueError):
        return 0
    return max((len(doc) for doc in table if isinstance(doc, str)), default=0) if isinstance(table, list) else 0


def _meminfo(path: Path) -> dict[str, int]:
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return {}
    out = {}
    for line in lines:
        name, _, rest = line.partition(":")
        fields = rest.split()
        if fields and fields[0].isdigit():
            out[name] = int(fields[0]) * (1024 if fields[1:2] == ["kB"] else 1)
    return out


def _cgroup_headroom(base: Path) -> MemoryBudget | None:
    """The container's memory limit less its usage: cgroup v2 (memory.max) or v1
    (memory/memory.limit_in_bytes); None when unlimited or not readable."""
    for limit_file, usage_file in ((base / "memory.max", base / "memory.current"),
                                   (base / "memory" / "memory.limit_in_bytes", base / "memory" / "memory.usage_in_bytes")):
        try:
            limit_text, usage = limit_file.read_text().strip(), int(usage_file.read_text().strip())
        except (OSError, ValueError):
            continue
        if limit_text == "max" or not limit_text.isdigit() or int(limit_text) >= 2**60:
            return None
        limit = int(limit_text)
        return MemoryBudget(limit - usage, f"{_mib(limit - usage)} under the container's memory limit of {_mib(limit)}")
    return None


def _resident(status: Path) -> int:
    return _meminfo(status).get("VmRSS", 0)
