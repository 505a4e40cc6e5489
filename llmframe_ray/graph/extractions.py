"""Each chunk's entities, kept beside the index so that a chunk is read once, whichever versions
hold it: what makes a graph build incremental and the ingestion job's extraction resumable.

    <index>/.graph-extractions/<extractor name>/<digest>.jsonl
        one line per chunk: {"fp": chunk fingerprint (batch/plan.py),
                             "m": [[key, surface, type], ...]   the graph's mentions,
                             "x": [[entity, ...], [relation, ...]] | null   an LLM's answer}

A file holds one batch and is written whole and atomically, by the job's extraction stage
(batch/stages.py: ExtractEntities) or by a graph build that met chunks not here yet. A job killed
mid-way finds the batches already written and extracts only the rest. `compact` keeps the
chunks that a version still holds, once a newer version is published.

A chunk whose LLM answer was malformed (or never came) is read offline for this build and is
not stored, so a later build asks again (graph/llm_extract.py).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from llmframe_ray.graph.extract import Mention, OfflineExtractor
from llmframe_ray.index import atomic

STORE_DIR = ".graph-extractions"

Entry = tuple[list[Mention], Any]  # mentions, and an llm_extract.Extraction or None


class ExtractionStore:
    def __init__(self, index_dir: str | Path, extractor: str) -> None:
        self.root = Path(index_dir) / STORE_DIR / extractor

    def _files(self) -> list[Path]:
        if not self.root.is_dir():
            return []
        return [p for p in sorted(self.root.glob("*.jsonl")) if not atomic.is_temp_name(p.name)]

    def write(self, items: Sequence[tuple[str, Entry]]) -> Path | None:
        """Store one batch of (chunk fingerprint, (mentions, extraction)); returns its file."""
        if not items:
            return None
        self.root.mkdir(parents=True, exist_ok=True)
        lines = []
        for fp, (mentions, extraction) in items:
            x = None if extraction is None else [extraction.entities, extraction.relations]
            lines.append(json.dumps({"fp": fp, "m": [[m.key, m.surface, m.type] for m in mentions], "x": x}, ensure_ascii=False))
        digest = hashlib.blake2b("\n".join(fp for fp, _ in items).encode("ascii"), digest_size=12).hexdigest()
        path = self.root / f"{digest}.jsonl"
        atomic.write_bytes(path, ("\n".join(lines) + "\n").encode("utf-8"))
        return path

    def _rows(self) -> Iterable[tuple[Path, dict]]:
        for path in self._files():
            try:
                text = path.read_text(encoding="utf-8")
                rows = [json.loads(line) for line in text.splitlines() if line.strip()]
            except (OSError, ValueError):
                path.unlink(missing_ok=True)  # damaged after it was written: its chunks are read again
                continue
            for row in rows:
                yield path, row

    def fingerprints(self) -> set[str]:
        return {row["fp"] for _, row in self._rows()}

    def read(self, wanted: Iterable[str] | None = None, seen: set[str] | None = None) -> dict[str, Entry]:
        """fingerprint -> (mentions, extraction) of the `wanted` chunks that are here (all: None);
        `seen` collects every fingerprint read, wanted or not."""
        from llmframe_ray.graph.llm_extract import Extraction

        wanted = None if wanted is None else set(wanted)
        out: dict[str, Entry] = {}
        for _, row in self._rows():
            fp = row["fp"]
            if seen is not None:
                seen.add(fp)
            if (wanted is None or fp in wanted) and fp not in out:
                x = row.get("x")
                extraction = None if x is None else Extraction(tuple(map(tuple, x[0])), tuple(map(tuple, x[1])))
                out[fp] = ([Mention(*m) for m in row["m"]], extraction)
        return out

    def compact(self, live: Iterable[str]) -> int:
        """Drop the chunks not in `live` (one file for the rest); returns how many were dropped."""
        files, seen = self._files(), set()
        kept = self.read(live, seen)
        dropped = len(seen - set(kept))
        if not dropped:
            return 0
        written = self.write(sorted(kept.items()))
        for path in files:
            if path != written:
                path.unlink(missing_ok=True)
        return dropped


def extract_chunks(
    chunks: Sequence[tuple[str, str]], extractor: OfflineExtractor | None = None, llm: Any = None
) -> tuple[list[Entry], Any]:
    """(mentions, extraction) per (title, text), read by `llm` (an LlmExtractor) or offline, and
    the LLM's report (None offline)."""
    if llm is not None:
        found, extractions, report = asyncio.run(llm.extract_all(list(chunks)))
        return list(zip(found, extractions)), report
    extractor = extractor or OfflineExtractor()
    return [(extractor.extract(text, title), None) for title, text in chunks], None


def storable(entries: Sequence[tuple[str, Entry]], llm: Any) -> list[tuple[str, Entry]]:
    """The entries to keep: with an LLM, only the chunks that it answered (the rest ask again)."""
    return [item for item in entries if llm is None or item[1][1] is not None]


def extractor_name(llm: Any) -> str:
    return llm.name if llm is not None else OfflineExtractor.name


def merge_reports(reports: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """The sum of LLM extraction reports (ExtractReport.as_dict) from several workers."""
    out: dict[str, Any] = {}
    for report in reports:
        for key, value in report.items():
            if key == "problems":
                out[key] = (out.get(key, []) + list(value))[:20]
            elif key == "cost_usd":
                out[key] = None if value is None or out.get(key, 0.0) is None else round(out.get(key, 0.0) + value, 8)
            else:
                out[key] = out.get(key, 0) + value
    return out
