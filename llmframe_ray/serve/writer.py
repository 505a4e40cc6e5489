"""Writer: the one replica that applies an index's queued HTTP writes (batch/writes.py).

It waits for a write (a `poke` from an Ingress, or its own poll of the inbox every
POLL_S), then `batch_wait_s` more from the oldest queued write so that many small requests
become one run, and runs the ingestion job as a Ray task on the same cluster. The job's CPU
requests are scaled down (`IngestParams.cpu_scale`): the serving replicas hold the cluster's
CPUs, and a job that waited for whole CPUs would never start. The new version is served by the
Retriever's index watcher, like one that `llmframe-ray ingest` publishes. At start it queues
again what a writer that died left running.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any, Sequence

import ray
from ray import serve

from llmframe_ray.batch.job import SourceFile, ingest
from llmframe_ray.batch.writes import apply_queued
from llmframe_ray.index.params import IndexParams
from llmframe_ray.index.inbox import QUEUED, Inbox
from llmframe_ray.ingest.params import IngestParams
from llmframe_ray.models.embedder import EmbedderParams

logger = logging.getLogger("ray.serve")
POLL_S = 2.0


@dataclass(frozen=True)
class JobParams:
    """What the ingestion job reads of the settings (no secret but an embedding API key)."""

    embedder: EmbedderParams
    index: IndexParams
    ingest: IngestParams


def _run_ingest(index_dir: str, params: JobParams, files: Sequence[SourceFile], deletes: Sequence[str]) -> Any:
    return ingest([], index_dir, params, files=files, deletes=deletes, log=logger.info)  # type: ignore[arg-type]


@serve.deployment(num_replicas=1, ray_actor_options={"num_cpus": 0.01}, max_ongoing_requests=256)
class Writer:
    async def __init__(self, index_dir: str, params: JobParams, batch_wait_s: float) -> None:
        self.index_dir, self.params, self.batch_wait_s = index_dir, params, batch_wait_s
        self.inbox = Inbox(index_dir)
        again = await asyncio.to_thread(self.inbox.recover)
        if again:
            logger.warning("queued again %d write job(s) that a stopped writer left running", len(again))
        self._wake = asyncio.Event()
        self._runs = 0
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def poke(self) -> None:
        """A write was queued: apply it soon."""
        self._wake.set()

    async def status(self) -> dict[str, Any]:
        queued = await asyncio.to_thread(lambda: len(list(self.inbox.jobs(QUEUED))))
        return {"runs": self._runs, "queued_jobs": queued, "running": not self._task.done()}

    def ready(self) -> str:
        return "ready"

    def __del__(self) -> None:  # Serve calls it when the replica stops
        task = getattr(self, "_task", None)
        if task is not None:
            task.cancel()

    async def _loop(self) -> None:
        while True:
            try:
                await asyncio.wait_for(self._wake.wait(), POLL_S)
            except TimeoutError:
                pass
            self._wake.clear()
            try:
                queued = await asyncio.to_thread(lambda: next(self.inbox.jobs(QUEUED), None))
                if queued is None:
                    continue
                wait = self.batch_wait_s - (time.time() - float(queued["created"]))
                if wait > 0:
                    await asyncio.sleep(wait)
                await asyncio.to_thread(apply_queued, self.inbox, self.index_dir, self._run, logger.info)
                self._runs += 1
            except Exception:  # keep the loop alive; the jobs say what failed
                logger.exception("the writer loop failed; retrying in %.0f s", POLL_S)
                await asyncio.sleep(POLL_S)

    def _run(self, files: Sequence[SourceFile], deletes: Sequence[str]) -> Any:
        task = ray.remote(_run_ingest).options(num_cpus=self.params.ingest.cpu_scale, max_retries=0)
        return ray.get(task.remote(self.index_dir, self.params, list(files), list(deletes)))
