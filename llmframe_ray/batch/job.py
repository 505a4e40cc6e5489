"""`llmframe-ray ingest` / `jobs/ingest.py`: sources -> a new version of a sharded index, on Ray.

    resolve sources (a missing one is an error before any work)
    -> Ray Data: read (flat_map) -> chunk (actor pool)          [materialised]
    -> plan on the driver: dedupe ids, compare fingerprints with the served version
    -> Ray Data: embed what is new (actor pool; vectors go to staging files)
    -> with a graph: Ray Data: extract the entities of what is new (batch/graphs.py)
    -> Ray tasks: collect changed shards -> corpus-wide BM25 statistics -> finish / carry shards
       [-> the version's knowledge graph, updated from the previous one]
    -> verify every shard, write version.json, switch CURRENT; prune old versions

Uses the Ray cluster at RAY_ADDRESS when set, else starts a local one sized to this machine.
The index directory must be on storage every Ray node can reach (one machine, or a shared
file system). One run per index directory at a time (a lock file enforces it).
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from llmframe_ray.batch import graphs
from llmframe_ray.batch.graphs import check_extractor
from llmframe_ray.batch.plan import PlanError, make_plan, stored_fingerprints
from llmframe_ray.batch.report import REPORT_FILE, IngestResult, Skipped
from llmframe_ray.batch.session import ray_session
from llmframe_ray.batch.staging import Staging, staging_key
from llmframe_ray.config import Params
from llmframe_ray.index import atomic
from llmframe_ray.index.metadata import DEFAULT_NAMESPACE
from llmframe_ray.index.params import IndexParams
from llmframe_ray.index.sparse import CorpusStats, corpus_info
from llmframe_ray.index.versions import IndexDirectory, shard_dir_name
from llmframe_ray.graph.store import GRAPH_DIR
from llmframe_ray.ingest.build import make_chunker
from llmframe_ray.ingest.params import IngestParams
from llmframe_ray.ingest.readers import resolve_sources
from llmframe_ray.models.embedder import EmbedderParams, load_embedder

PARTS_DIR = "parts"

Log = Callable[[str], None]


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


@dataclass(frozen=True)
class SourceFile:
    """One file to ingest as resolved: its document id (a JSON Lines file's records keep their
    own), metadata to add to its documents' and the namespace they go to."""

    path: str
    doc_id: str
    metadata: Mapping[str, Any] = field(default_factory=dict)
    namespace: str = DEFAULT_NAMESPACE
    title: str = ""  # overrides the title the reader finds


def ingest(
    sources: Sequence[str | Path],
    index_dir: str | Path,
    params: Params,
    *,
    shards: int | None = None,
    deletes: Sequence[str] = (),
    log: Log = _stderr,
    namespace: str = DEFAULT_NAMESPACE,
    files: Sequence[SourceFile] = (),
    graph: bool | None = None,
    graph_extractor: str = "offline",
    progress: Callable[[str, int, int], None] | None = None,
    dry_run: bool = False,
) -> IngestResult:
    """Run one ingestion into `index_dir` (see the module docstring). `sources` (files, folders,
    globs) go to `namespace`; `files` are already resolved, each with its own namespace;
    `deletes` are stored ids (index/metadata.py: internal_id). `graph`: build the new version's
    knowledge graph (graph/store.py; batch/graphs.py); None: if the previous version has one.
    `graph_extractor`: offline, or llm (the provider chain of `params`). `progress(stage, done,
    total)`: the embedding and extraction stages' counts as their batches finish. `dry_run`:
    read, chunk and plan, log the plan, and stop there: nothing is embedded or written."""
    check_extractor(graph_extractor)
    files = [
        *(SourceFile(str(path), doc_id, namespace=namespace) for path, doc_id in (resolve_sources(sources) if sources else [])),
        *files,
    ]
    if not files and not deletes:
        raise PlanError("nothing to do: give at least one source or --delete DOC_ID")
    embedder = load_embedder(params.embedder)
    make_chunker(params.index, embedder)  # bad chunking parameters fail here, before any work
    model, chunking = embedder.info(), params.index.chunking.to_dict()
    directory = IndexDirectory(index_dir)
    with directory.writer_lock():
        removed = [] if dry_run else directory.remove_incomplete()
        if removed:
            log(f"removed {len(removed)} leftover(s) of an interrupted run")
        previous = directory.load() if directory.current_version() is not None else None
        n_shards = _shard_count(previous, shards)
        if previous is not None:
            problem = params.index.mismatch(previous.shards[0].manifest, model)
            if problem is not None:
                raise PlanError(f"{problem}; use a new index directory")
        staging = Staging(directory.root, staging_key(model, chunking, n_shards))
        if graph is None:
            graph = previous is not None and (previous.path / GRAPH_DIR).is_dir()
        if graph and graph_extractor == "llm":
            from llmframe_ray.graph.build import llm_extractor

            llm_extractor(directory.root, params)  # no LLM in the chain: a ValueError now, before any work
        with ray_session(params.ingest.local_cpus):
            result = _run(files, directory, previous, n_shards, list(deletes), params, model, staging, log,
                          graph_extractor if graph else None, progress, dry_run)
        if dry_run:
            return result
        if result.version is not None or not (result.plan and result.plan.changes_anything):
            staging.clear()
        atomic.write_json(directory.root / REPORT_FILE, result.report())
        retention = params.ingest.retention
        pruned = directory.prune(retention, protect=[previous.version] if previous else [])
        if pruned:
            log(f"pruned {len(pruned)} old version(s) (keeping {retention})")
    return result


def _shard_count(previous, shards: int | None) -> int:
    if previous is None:
        return shards if shards is not None else 1
    existing = int(previous.info["shards"]) if previous.info else len(previous.shards)
    if shards is not None and shards != existing:
        raise PlanError(
            f"the index has {existing} shards; ingest into it with --shards {existing}, "
            "or build a new index directory to change the shard count"
        )
    return existing


def _run(files, directory: IndexDirectory, previous, n_shards: int, deletes: list[str], params: Params,
         model: dict, staging: Staging, log: Log, graph: str | None = None, progress: Any = None,
         dry_run: bool = False) -> IngestResult:
    result = IngestResult(directory.root, None, None)
    clock = time.perf_counter()

    rows = _read_and_chunk(files, n_shards, params.embedder, params.index, params.ingest) if files else None
    incoming, fresh_chunks, skipped, n_rows = _dedupe(_meta_batches(rows) if rows is not None else [])
    result.skipped = skipped
    result.chunks_read = sum(len(v) for v in fresh_chunks.values())
    result.seconds["read+chunk"] = time.perf_counter() - clock
    log(f"read {len(incoming)} documents ({result.chunks_read} chunks) from {len(files)} files; "
        f"{len(skipped)} skipped")

    old_fps = None
    if previous is not None:
        old_fps = [{} for _ in range(n_shards)]
        for shard_id, shard in zip(previous.shard_ids, previous.shards):
            old_fps[shard_id] = stored_fingerprints(shard.store)
    plan = make_plan(n_shards, old_fps, incoming, deletes)
    result.plan = plan
    log(f"plan: {len(plan.added)} added, {len(plan.replaced)} replaced, {len(plan.unchanged)} unchanged, "
        f"{len(plan.deleted)} deleted; shards to rebuild: {plan.changed_shards or 'none'}")
    for doc in plan.not_found:
        log(f"--delete {doc}: not in the index")
    if not plan.changes_anything or dry_run:
        log(("dry run: nothing embedded or written" if dry_run else "nothing changed") + "; CURRENT stays "
            + str(previous.version if previous else None))
        return result

    clock = time.perf_counter()
    wanted_fps = {fp for doc in plan.fresh for fp in fresh_chunks[doc]}
    needed = frozenset(wanted_fps - staging.fingerprints())
    if needed:
        result.chunks_embedded = _embed(rows, n_rows, needed, params, directory, staging, progress)
    result.seconds["embed"] = time.perf_counter() - clock
    log(f"embedded {result.chunks_embedded} chunks ({len(wanted_fps) - len(needed)} already staged)")
    if graph is not None:
        clock = time.perf_counter()
        needed = graphs.pending(directory.root, graph, wanted_fps)
        if needed:
            result.chunks_extracted, result.extraction = graphs.extract(rows, needed, directory.root, params, graph, progress)
        result.seconds["extract"] = time.perf_counter() - clock
        log(f"extracted the entities of {result.chunks_extracted} chunks ({len(wanted_fps) - len(needed)} already extracted)")
        if result.extraction:
            log("llm extraction: " + ", ".join(f"{k} {v}" for k, v in result.extraction.items() if k != "problems"))

    clock = time.perf_counter()
    version, tmp = directory.stage()
    try:
        return _build_and_commit(result, plan, directory, previous, version, tmp, fresh_chunks, staging,
                                 params, model, n_shards, clock, log, graph)
    except BaseException:
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)  # a kill -9 skips this: the next run removes it
        result.version = None
        raise


def _build_and_commit(result, plan, directory, previous, version, tmp, fresh_chunks, staging,
                      params: Params, model, n_shards, clock, log, graph: str | None = None) -> IngestResult:
    import ray

    index, scale = params.index, params.ingest.cpu_scale
    old_dirs = {}
    if previous is not None:
        old_dirs = {i: str(previous.path / shard_dir_name(i)) for i in previous.shard_ids}
    collect = ray.remote(num_cpus=scale)(_collect_task)
    stats_of = ray.remote(num_cpus=scale)(_stats_task)
    pending = {}
    for sp in plan.shards:
        if sp.changed:
            fps = [fp for doc in sorted(sp.fresh) for fp in fresh_chunks[doc]]
            pending[sp.shard] = collect.remote(sp, old_dirs.get(sp.shard), staging, fps,
                                               str(tmp / PARTS_DIR / shard_dir_name(sp.shard)), index.sparse)
        elif sp.shard in old_dirs:
            pending[sp.shard] = stats_of.remote(old_dirs[sp.shard])
    stats = dict(zip(pending, ray.get(list(pending.values()))))
    corpus = CorpusStats.merge([s for s in stats.values() if s.n_docs])
    finish = ray.remote(num_cpus=scale)(_finish_task)
    carry = ray.remote(num_cpus=scale)(_carry_task)
    built = {}
    for sp in plan.shards:
        if stats.get(sp.shard) is None or stats[sp.shard].n_docs == 0:
            continue  # an empty shard: no folder
        target = str(tmp / shard_dir_name(sp.shard))
        if sp.changed:
            built[sp.shard] = finish.remote(str(tmp / PARTS_DIR / shard_dir_name(sp.shard)), target, corpus, index, model)
        else:
            built[sp.shard] = carry.remote(old_dirs[sp.shard], target, corpus)
    result.shard_counts = dict(zip(built, ray.get(list(built.values()))))
    result.seconds["build"] = time.perf_counter() - clock
    if graph is not None:  # over the new version's shards, before it is published: part of the version
        clock = time.perf_counter()
        task = ray.remote(num_cpus=scale)(graphs.graph_task)
        built_graph = ray.get(task.remote(str(tmp), version, sorted(built), str(directory.root),
                                          str(previous.path) if previous else None, params, graph == "llm"))
        result.seconds["graph"] = time.perf_counter() - clock
        result.graph = built_graph["info"]
        log("knowledge graph: " + ", ".join(f"{v} {k}" for k, v in built_graph["sizes"].items()) + graphs.describe_build(built_graph["info"]))

    clock = time.perf_counter()
    import shutil

    shutil.rmtree(tmp / PARTS_DIR, ignore_errors=True)
    result.version = version
    atomic.write_json(tmp / REPORT_FILE, result.report())
    info = {
        "documents": sum(c["documents"] for c in result.shard_counts.values()),
        "chunks": sum(c["chunks"] for c in result.shard_counts.values()),
        "bm25_corpus": corpus_info(corpus),
        "skipped": len(result.skipped),
        "previous": previous.version if previous else None,
    }
    for shard_id, counts in result.shard_counts.items():
        want = plan.shards[shard_id].documents
        if counts["documents"] != want:
            raise RuntimeError(f"shard {shard_id} holds {counts['documents']} documents; the plan says {want}")
    directory.commit(version, tmp, n_shards, info, verify=True, expected=set(built), base=previous.version if previous else None)
    result.seconds["publish"] = time.perf_counter() - clock
    log(f"published version {version}: {info['documents']} documents, {info['chunks']} chunks in {n_shards} shards")
    return result


def _read_and_chunk(files, n_shards: int, embedder: EmbedderParams, index: IndexParams, knobs: IngestParams):
    import ray

    from llmframe_ray.batch.stages import ChunkDocuments, read_file

    cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
    items = [
        {"file_no": i, "path": f.path, "doc_id": f.doc_id, "metadata": json.dumps(dict(f.metadata)),
         "namespace": f.namespace, "title": f.title}
        for i, f in enumerate(files)
    ]
    ds = ray.data.from_items(items, override_num_blocks=min(len(items), 4 * cpus))
    # half a CPU each, so that read tasks can run beside the chunking actors even on one CPU
    ds = ds.flat_map(read_file, fn_kwargs={"max_bytes": knobs.max_file_bytes}, num_cpus=0.5 * knobs.cpu_scale)
    ds = ds.map_batches(
        ChunkDocuments, fn_constructor_args=(replace(embedder, threads=1), index, n_shards), batch_size=64,
        batch_format="numpy", num_cpus=0.5 * knobs.cpu_scale,
        compute=ray.data.ActorPoolStrategy(min_size=1, max_size=max(1, cpus - 1)),
    )
    return ds.materialize()


META_COLUMNS = ("file_no", "line", "path", "doc_id", "error", "doc_fp", "chunk_fp", "position")


def _meta_batches(rows):
    """The chunk rows' metadata (no texts), a column batch at a time."""
    return rows.select_columns(list(META_COLUMNS)).iter_batches(batch_format="numpy", batch_size=4096)


def _dedupe(batches) -> tuple[dict[str, str], dict[str, list[str]], list[Skipped], int]:
    """incoming doc fingerprints, each document's chunk fingerprints in order, skipped inputs,
    and the number of rows read.

    Streams the rows' metadata batch by batch and keeps per document its id, fingerprint and
    chunks' (position, fingerprint) pairs, never a record per row, so the driver's memory
    follows the documents and chunk fingerprints read (README, "Ingestion job"). A document id seen
    twice keeps its first occurrence (file order, then line)."""
    paths: dict[int, str] = {}
    errors: dict[tuple[int, int], str] = {}
    docs: dict[tuple[int, int], tuple[str, str, list[tuple[int, str]]]] = {}  # (file_no, line) ->
    first: dict[str, tuple[int, int]] = {}
    n_rows = 0
    for batch in batches:
        for file_no, line, path, doc, error, doc_fp, chunk_fp, position in zip(*(batch[c].tolist() for c in META_COLUMNS)):
            n_rows += 1
            where = (int(file_no), int(line))
            paths.setdefault(where[0], str(path))
            if error:
                errors[where] = str(error)
                continue
            entry = docs.get(where)
            if entry is None:
                entry = docs[where] = (str(doc), str(doc_fp), [])
                seen = first.get(entry[0])
                if seen is None or seen > where:  # rows arrive in any order: the earliest occurrence wins
                    first[entry[0]] = where
            entry[2].append((int(position), str(chunk_fp)))
    skipped = {w: Skipped(paths[w[0]], w[1], e) for w, e in errors.items()}
    incoming, fresh = {}, {}
    for doc, where in first.items():
        _, incoming[doc], parts = docs[where]
        fresh[doc] = [fp for _, fp in sorted(parts)]
    for where, (doc, _, _) in docs.items():
        orig = first[doc]
        if orig != where:
            at = f"{paths[orig[0]]} line {orig[1]}" if orig[1] else paths[orig[0]]
            path = paths[where[0]]
            skipped[where] = Skipped(path, where[1], f"duplicate doc_id {doc!r}, first in {at}")
    return incoming, fresh, sorted(skipped.values(), key=lambda s: (s.path, s.line)), n_rows


def _embed(rows, n_rows: int, needed: frozenset[str], params: Params, directory: IndexDirectory,
           staging: Staging, progress: Any = None) -> int:
    import math

    import ray

    from llmframe_ray.batch.stages import EmbedChunks

    cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
    knobs = params.ingest
    per_actor = min(knobs.cpus_per_actor, cpus)
    actors = knobs.embed_actors or max(1, cpus // per_actor)
    key = staging.root.name
    # One block per embedding batch: work spreads over the actors, and blocks keep moving (a
    # corpus read from one JSONL file is otherwise one block, and Ray Data stops a dataset that
    # shows no progress for 30 minutes).
    # Materialised first: an actor pool that already holds every CPU would starve the split.
    blocks = max(actors, math.ceil(n_rows / knobs.batch_size))
    rows = rows.repartition(blocks).materialize()
    out = rows.map_batches(
        EmbedChunks,
        fn_constructor_args=(replace(params.embedder, threads=per_actor), str(directory.root), key, needed),
        batch_size=knobs.batch_size, batch_format="numpy",
        compute=ray.data.ActorPoolStrategy(size=actors), num_cpus=per_actor * knobs.cpu_scale,
    )
    done = 0
    for batch in out.iter_batches(batch_format="numpy", batch_size=None):  # each block as it is done
        done += sum(int(n) for n in batch["embedded"])
        if progress is not None:
            progress("embed chunks", done, len(needed))
    return done


def _collect_task(plan, old_dir, staging, fps, part_dir, sparse):
    from llmframe_ray.batch.build import collect_shard

    return collect_shard(plan, old_dir, staging, fps, part_dir, sparse)


def _stats_task(old_dir):
    from llmframe_ray.batch.build import shard_stats

    return shard_stats(old_dir)


def _finish_task(part_dir, target, corpus, index, model):
    from llmframe_ray.batch.build import finish_shard

    return finish_shard(part_dir, target, corpus, index, model)


def _carry_task(old_dir, target, corpus):
    from llmframe_ray.batch.build import carry_shard

    return carry_shard(old_dir, target, corpus)
