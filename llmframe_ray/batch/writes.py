"""Apply the writes queued in an index's inbox (index/inbox.py) with the ingestion job.

Every queued job is taken at once and becomes one run of `batch.job.ingest`, the same job
`llmframe-ray ingest` runs: the JSON documents of each namespace as one JSON Lines file, each
uploaded file as itself, and the deletes. The last write of a document id in the batch stands;
the earlier ones are reported `superseded`. Each job then gets its documents' report from the
run's own (a document the readers refused, a corrupt PDF or a text that is not UTF-8, is
`failed` with the reader's reason; the rest of the batch is published) and the version the run
published. A run that cannot start because another writer holds the index (a CLI ingest) leaves
the jobs queued for the next try; any other failure fails the batch's jobs with its message.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from llmframe_ray.batch.job import SourceFile
from llmframe_ray.batch.report import IngestResult
from llmframe_ray.index.metadata import DEFAULT_NAMESPACE, internal_id, split_id
from llmframe_ray.index.versions import IndexBusyError, IndexDirectory
from llmframe_ray.index.inbox import FAILED, PUBLISHED, QUEUED, RUNNING, Inbox, final_writes

# files, deletes (stored ids) -> the ingestion run's result
Runner = Callable[[Sequence[SourceFile], Sequence[str]], IngestResult]


def apply_queued(inbox: Inbox, index_dir: str | Path, run: Runner, log: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """Apply every queued job in one run; return the jobs' final records ([] when none was
    queued, or when the index was busy and they stay queued)."""
    records = list(inbox.jobs(QUEUED))
    if not records:
        return []
    records = [inbox.mark(r, RUNNING) for r in records]
    final = final_writes(inbox, records)
    run_dir = inbox.root / "runs" / records[0]["job_id"]
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    files, origin = _sources(final, run_dir)
    deletes = [stored for stored, (_, write) in final.items() if write["op"] == "delete"]
    log(f"applying {len(records)} write job(s): {len(final) - len(deletes)} upserts, {len(deletes)} deletes")
    try:
        result = run(files, deletes)
    except IndexBusyError as exc:
        log(f"the index is busy, the writes stay queued: {exc}")
        return [inbox.mark(r, QUEUED) for r in records]
    except Exception as exc:  # the run failed as a whole: nothing was published
        message = f"{type(exc).__name__}: {exc}"
        log(f"write run failed: {message}")
        return [inbox.mark(r, FAILED, error=message) for r in records]
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
    version = result.version or IndexDirectory(index_dir).current_version()
    failures = {origin[(s.path, s.line)]: s.reason for s in result.skipped if (s.path, s.line) in origin}
    plan = result.plan
    deleted = set(plan.deleted) if plan else set()
    out = []
    for record in records:
        report = [_outcome(record, entry, final, failures, deleted) for entry in record["documents"]]
        status = FAILED if report and all(r["status"] == "failed" for r in report) else PUBLISHED
        error = "every document failed" if status == FAILED else None
        out.append(inbox.mark(record, status, version=version, report=report, error=error))
    return out


def _sources(final: Mapping[str, tuple[str, dict[str, Any]]], run_dir: Path) -> tuple[list[SourceFile], dict[tuple[str, int], str]]:
    """The run's files and where each document comes from: (path, line) -> stored id (line 0
    for a file that is one document)."""
    by_namespace: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    files, origin = [], {}
    for stored, (_, write) in final.items():
        namespace, doc_id = split_id(stored)
        if write["op"] == "json":
            by_namespace.setdefault(namespace, []).append((stored, write["record"]))
        elif write["op"] == "file":
            files.append(SourceFile(write["path"], doc_id, write["metadata"], namespace, write.get("title", "")))
            origin[(write["path"], 0)] = stored
    for n, (namespace, docs) in enumerate(sorted(by_namespace.items())):
        path = run_dir / f"{n:04d}.jsonl"
        with open(path, "w", encoding="utf-8") as handle:
            for line, (stored, record) in enumerate(docs, start=1):
                handle.write(json.dumps(record, ensure_ascii=False) + "\n")
                origin[(str(path), line)] = stored
        files.insert(n, SourceFile(str(path), "", {}, namespace))
    return files, origin


def _outcome(record: Mapping[str, Any], entry: Mapping[str, Any], final, failures, deleted) -> dict[str, Any]:
    stored = internal_id(record.get("namespace", DEFAULT_NAMESPACE), entry["id"])
    out: dict[str, Any] = {"id": entry["id"], "op": entry["op"]}
    job, _ = final[stored]
    if job != record["job_id"]:
        return {**out, "status": "superseded", "by": job}
    if stored in failures:
        return {**out, "status": "failed", "error": failures[stored]}
    if entry["op"] == "delete":
        return {**out, "status": "deleted" if stored in deleted else "not_found"}
    return {**out, "status": "published"}
