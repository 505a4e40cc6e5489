"""Writes accepted over HTTP, kept on disk until the ingestion job has applied them.

    <index>/.inbox/jobs/<job id>.json      the job: state, namespace, documents, report
    <index>/.inbox/data/<job id>/           its payload: docs.jsonl (JSON documents) and
                                            uploaded files, named by position

A write is durable before it is acknowledged: the payload is written and fsynced, then the job
record (atomically, the folder fsynced), and only then does the server answer 202; a server
that restarts finds the job queued and applies it. The writer (serve/writer.py) takes every
queued job at once, marks them running, turns them into one ingestion run (the last write of
a document id wins) and marks each published or failed with its documents' report. A job found
running at start belonged to a writer that died: it is queued again (a rerun of the ingestion
job is safe, batch/job.py).

Job ids sort by arrival. Nothing here imports Ray.
"""

from __future__ import annotations

import json
import re
import secrets
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

from llmframe_ray.index import atomic
from llmframe_ray.index.metadata import internal_id

INBOX_DIR = ".inbox"
DOCS_FILE = "docs.jsonl"
QUEUED, RUNNING, PUBLISHED, FAILED = "queued", "running", "published", "failed"
UPLOAD_SUFFIXES = (".txt", ".md", ".markdown", ".html", ".htm", ".pdf")


@dataclass(frozen=True)
class Upload:
    """A file sent with a write: its document id, original name, bytes and metadata."""

    doc_id: str
    filename: str
    data: bytes
    metadata: Mapping[str, Any]
    title: str = ""

    @property
    def suffix(self) -> str:
        return Path(self.filename).suffix.lower()


class Inbox:
    def __init__(self, index_dir: str | Path) -> None:
        self.root = Path(index_dir) / INBOX_DIR
        self.jobs_dir = self.root / "jobs"
        self.data_dir = self.root / "data"

    def _record_path(self, job_id: str) -> Path:
        if not job_id or "/" in job_id or job_id.startswith("."):
            raise KeyError(job_id)
        return self.jobs_dir / f"{job_id}.json"

    def submit(
        self,
        namespace: str,
        documents: Sequence[Mapping[str, Any]] = (),
        uploads: Sequence[Upload] = (),
        deletes: Sequence[str] = (),
    ) -> dict[str, Any]:
        """Queue one write (upserts as JSON documents {id, title, text, metadata} and/or
        uploaded files, or deletes by id) durably; return its job record."""
        job_id = f"{time.time_ns():020d}-{secrets.token_hex(4)}"
        data = self.data_dir / job_id
        data.mkdir(parents=True)
        nbytes = 0
        if documents:
            lines = [json.dumps({"id": d["id"], "title": d.get("title") or "", "text": d["text"],
                                 "metadata": dict(d.get("metadata") or {})}, ensure_ascii=False) for d in documents]
            payload = ("\n".join(lines) + "\n").encode("utf-8")
            nbytes += len(payload)
            atomic.write_bytes(data / DOCS_FILE, payload)
        files = []
        for n, upload in enumerate(uploads):
            # a folder per file, the client's base name made safe: nothing leaves this folder,
            # and a document with no title of its own is titled after its file, as on disk
            name = f"{n:06d}/{safe_name(upload.filename)}"
            (data / name).parent.mkdir()
            atomic.write_bytes(data / name, upload.data)
            nbytes += len(upload.data)
            files.append({"id": upload.doc_id, "file": name, "filename": upload.filename,
                          "metadata": dict(upload.metadata), "title": upload.title})
        atomic.fsync_dir(data)
        entries = [{"id": d["id"], "op": "upsert"} for d in documents]
        entries += [{"id": f["id"], "op": "upsert", "filename": f["filename"]} for f in files]
        entries += [{"id": doc_id, "op": "delete"} for doc_id in deletes]
        record = {
            "job_id": job_id, "status": QUEUED, "namespace": namespace, "created": time.time(),
            "bytes": nbytes, "documents": entries, "files": files, "version": None, "error": None,
        }
        self._write(record)
        return record

    def _write(self, record: Mapping[str, Any]) -> None:
        self.jobs_dir.mkdir(parents=True, exist_ok=True)
        atomic.write_json(self._record_path(record["job_id"]), dict(record))
        atomic.fsync_dir(self.jobs_dir)

    def job(self, job_id: str) -> dict[str, Any] | None:
        try:
            path = self._record_path(job_id)
        except KeyError:
            return None
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None

    def jobs(self, status: str | None = None) -> Iterator[dict[str, Any]]:
        """Job records in arrival order (only those with `status`, when given)."""
        if not self.jobs_dir.is_dir():
            return
        for path in sorted(self.jobs_dir.glob("*.json")):
            record = self.job(path.stem)
            if record is not None and (status is None or record["status"] == status):
                yield record

    def queued_bytes(self) -> int:
        return sum(int(r["bytes"]) for r in self.jobs() if r["status"] in (QUEUED, RUNNING))

    def recover(self) -> list[str]:
        """Queue again the jobs a dead writer left running; return their ids."""
        again = []
        for record in self.jobs(RUNNING):
            self._write({**record, "status": QUEUED})
            again.append(record["job_id"])
        return again

    def mark(self, record: Mapping[str, Any], status: str, **fields: Any) -> dict[str, Any]:
        updated = {**record, **fields, "status": status}
        if status in (PUBLISHED, FAILED):
            updated["finished"] = time.time()
            shutil.rmtree(self.data_dir / record["job_id"], ignore_errors=True)
        self._write(updated)
        return updated

    def payload(self, record: Mapping[str, Any]) -> Path:
        return self.data_dir / record["job_id"]

    def pending_for(self, namespace: str, doc_id: str) -> list[str]:
        """Ids of the queued or running jobs that write this document."""
        return [
            r["job_id"] for r in self.jobs() if r["status"] in (QUEUED, RUNNING) and r["namespace"] == namespace
            and any(d["id"] == doc_id for d in r["documents"])
        ]


def safe_name(filename: str) -> str:
    """`filename`'s base name with only letters, digits, '.', '_', '-' and spaces (others become
    '_'), at most 120 characters, never hidden; its suffix kept (the reader goes by it)."""
    base = re.sub(r"[^\w. -]", "_", filename.replace("\\", "/").rsplit("/", 1)[-1]).strip() or "upload"
    stem, suffix = base[: -len(Path(base).suffix) or None], Path(base).suffix.lower()
    return (stem.lstrip(".") or "upload")[:100] + suffix[:20]


def final_writes(inbox: Inbox, records: Sequence[Mapping[str, Any]]) -> dict[str, tuple[str, dict[str, Any]]]:
    """Stored document id -> (job id, the write that stands) over jobs in arrival order: the
    last write of an id wins. A write is {"op": "delete"}, {"op": "json", "record": {...}} or
    {"op": "file", "path", "metadata", "title"}."""
    final: dict[str, tuple[str, dict[str, Any]]] = {}
    for record in records:
        namespace, job_id = record["namespace"], record["job_id"]
        folder = inbox.payload(record)
        docs_file = folder / DOCS_FILE
        if docs_file.is_file():
            for line in docs_file.read_text(encoding="utf-8").splitlines():
                doc = json.loads(line)
                final[internal_id(namespace, doc["id"])] = (job_id, {"op": "json", "record": doc})
        for f in record["files"]:
            final[internal_id(namespace, f["id"])] = (job_id, {
                "op": "file", "path": str(folder / f["file"]), "metadata": f["metadata"], "title": f.get("title", ""),
            })
        for entry in record["documents"]:
            if entry["op"] == "delete":
                final[internal_id(namespace, entry["id"])] = (job_id, {"op": "delete"})
    return final
