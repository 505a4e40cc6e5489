"""The knowledge graph's part of the ingestion job (`ingest --graph`, graph/store.py).

    extract: a Ray Data stage over the run's new chunks (batch/stages.py: ExtractEntities),
             after embedding; what it reads is stored per chunk (graph/extractions.py), so a
             killed run extracts only the rest, and a chunk that stays is never read again
    build:   one Ray task over the new version's shards, before it is published: mentions
             and relations from the stored extractions, communities started from the previous
             version's graph (only what changed is partitioned and summarised again)

Offline by default; `extractor="llm"` reads the chunks through the provider chain (one actor,
its requests concurrent) and has the model write the community summaries; the job's report
carries the model's usage and cost.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from llmframe_ray.config import Params
from llmframe_ray.graph.extractions import ExtractionStore, merge_reports
from llmframe_ray.graph.llm_extract import VERSION as LLM_EXTRACTOR
from llmframe_ray.graph.extract import OfflineExtractor
from llmframe_ray.graph.store import GRAPH_DIR
from llmframe_ray.index.versions import shard_dir_name

EXTRACTORS = {"offline": OfflineExtractor.name, "llm": LLM_EXTRACTOR}


def check_extractor(extractor: str) -> None:
    if extractor not in EXTRACTORS:
        raise ValueError(f"graph extractor must be one of {', '.join(EXTRACTORS)}, got {extractor!r}")


def pending(index_dir: Path, extractor: str, fingerprints: set[str]) -> frozenset[str]:
    """The chunks of `fingerprints` that the extraction store does not hold yet."""
    return frozenset(fingerprints - ExtractionStore(index_dir, EXTRACTORS[extractor]).fingerprints())


def extract(rows: Any, needed: frozenset[str], index_dir: Path, params: Params, extractor: str,
            progress: Any = None) -> tuple[int, dict]:
    """Run the extraction stage over `rows` (the job's chunk dataset) for the `needed` chunks:
    (chunks read, the LLM's summed report or {})."""
    import ray

    from llmframe_ray.batch.stages import ExtractEntities

    cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
    llm = extractor == "llm"
    out = rows.map_batches(
        ExtractEntities, fn_constructor_args=(str(index_dir), needed, params if llm else None),
        batch_size=64 if llm else 256, batch_format="numpy", num_cpus=params.ingest.cpu_scale * (0.5 if llm else 1),
        compute=ray.data.ActorPoolStrategy(size=1) if llm else ray.data.ActorPoolStrategy(min_size=1, max_size=cpus),
    )
    count, reports = 0, []
    for batch in out.iter_batches(batch_format="numpy", batch_size=None):  # each block as it is done
        count += sum(int(n) for n in batch["extracted"])
        reports.extend(json.loads(str(r)) for r in batch["report"])
        if progress is not None:
            progress("extract entities", count, len(needed))
    return count, merge_reports(r for r in reports if r)


def graph_task(version_dir: str, version: str, shard_ids: list[int], index_dir: str, previous_dir: str | None,
               params: Params, llm: bool = False) -> dict:
    """Build and store the graph of a staged version (a Ray task), the entity names embedded by
    the index's model; `llm`: the LLM extractor reads the chunks the stage did not read, and
    writes the community summaries. Returns the graph's sizes and build info."""
    from llmframe_ray.graph.build import llm_extractor, llm_summarizer
    from llmframe_ray.graph.extractions import extractor_name
    from llmframe_ray.graph.store import KnowledgeGraph, build_graph, index_chunks
    from llmframe_ray.index.shard import IndexShard
    from llmframe_ray.models.embedder import load_embedder

    summarizer = llm_summarizer(index_dir, params) if llm else None
    llm = llm_extractor(index_dir, params) if llm else None
    store = ExtractionStore(index_dir, extractor_name(llm))
    previous = None
    if previous_dir is not None and (Path(previous_dir) / GRAPH_DIR).is_dir():
        previous = KnowledgeGraph.load(Path(previous_dir) / GRAPH_DIR)
        if previous.info.get("extractor") != extractor_name(llm):
            previous = None  # another extractor's graph: nothing to start from
    shards = [(i, IndexShard.load(Path(version_dir) / shard_dir_name(i))) for i in shard_ids]
    embedder = load_embedder(replace(params.embedder, threads=1))  # the task holds one CPU
    graph = build_graph(index_chunks(shards), llm=llm, store=store, previous=previous, summarizer=summarizer,
                        embed=embedder.embed)
    graph.info["version"] = version
    graph.save(Path(version_dir) / GRAPH_DIR)
    dropped = store.compact(graph.chunk_fps)  # chunks no longer in the index
    return {"sizes": graph.sizes(), "info": {**graph.info, "store_dropped": dropped}}


def describe_build(info: dict) -> str:
    """The log's account of a graph build: what it reused from the store and the previous graph."""
    text = f" ({info.get('extractions_reused', 0)} chunks' entities from the store"
    if info.get("updated"):
        text += (f"; updated from {info['updated']}: {info.get('communities_kept', 0)} sub-communities and "
                 f"{info.get('summaries_kept', 0)} summaries kept")
    return text + f"; {info.get('build_seconds')} s)"
