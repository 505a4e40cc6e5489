"""What the ingestion job is told beyond the index's own parameters."""

from __future__ import annotations

from dataclasses import dataclass

from llmframe_ray.ingest.readers import DEFAULT_MAX_FILE_BYTES


@dataclass(frozen=True)
class IngestParams:
    """The ingestion job's own knobs (Ray Data batch size and actors, versions kept)."""

    batch_size: int = 256
    cpus_per_actor: int = 1
    embed_actors: int | None = None
    retention: int = 3
    local_cpus: int = 1  # CPUs of the local Ray started when RAY_ADDRESS is not set
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES  # a document file over this is refused unread
    # every logical CPU request of the job's tasks and actors is multiplied by this: below 1
    # inside a serving cluster, whose replicas hold the CPUs (the HTTP writer)
    cpu_scale: float = 1.0
