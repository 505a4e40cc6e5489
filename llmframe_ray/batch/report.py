"""What an ingestion run did: the result object, its JSON report, and the summary printed on exit."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmframe_ray.batch.plan import Plan

REPORT_FILE = "ingest-report.json"
EXIT_OK, EXIT_SKIPPED = 0, 3


@dataclass
class Skipped:
    path: str
    line: int
    reason: str

    def describe(self) -> str:
        where = f"{self.path} line {self.line}" if self.line else self.path
        return f"{where}: {self.reason}"


@dataclass
class IngestResult:
    index_dir: Path
    version: str | None  # None: nothing changed, CURRENT left as it was
    plan: Plan | None
    skipped: list[Skipped] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    chunks_embedded: int = 0
    chunks_read: int = 0
    shard_counts: dict[int, dict[str, int]] = field(default_factory=dict)
    chunks_extracted: int = 0  # entities read (--graph)
    extraction: dict[str, Any] = field(default_factory=dict)  # an LLM extractor's usage and cost
    graph: dict[str, Any] = field(default_factory=dict)  # the new version's graph build (graph.json info)

    @property
    def exit_code(self) -> int:
        return EXIT_SKIPPED if self.skipped else EXIT_OK

    def report(self) -> dict[str, Any]:
        plan = self.plan
        return {
            "version": self.version,
            "documents": {
                "added": len(plan.added) if plan else 0,
                "replaced": len(plan.replaced) if plan else 0,
                "unchanged": len(plan.unchanged) if plan else 0,
                "deleted": list(plan.deleted) if plan else [],
                "delete_not_found": list(plan.not_found) if plan else [],
            },
            "changed_shards": plan.changed_shards if plan else [],
            "chunks_read": self.chunks_read,
            "chunks_embedded": self.chunks_embedded,
            "shards": {str(k): v for k, v in sorted(self.shard_counts.items())},
            "skipped": [{"path": s.path, "line": s.line, "reason": s.reason} for s in self.skipped],
            "seconds": {k: round(v, 3) for k, v in self.seconds.items()},
            **({"graph": {"chunks_extracted": self.chunks_extracted, "llm": self.extraction or None, "build": self.graph}}
               if self.graph else {}),
        }


def summary_lines(result: IngestResult) -> list[str]:
    lines = []
    if result.skipped:
        lines.append(f"skipped {len(result.skipped)} input(s) (see {result.index_dir / REPORT_FILE}):")
        lines.extend(f"  {s.describe()}" for s in result.skipped[:20])
        if len(result.skipped) > 20:
            lines.append(f"  ... and {len(result.skipped) - 20} more")
    return lines
