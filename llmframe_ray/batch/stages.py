"""The per-row and per-batch functions of the ingestion job's Ray Data stages.

    files -> read (flat_map: one row per document, or one error row) -> chunk (actor pool)
          -> [plan on the driver] -> embed (actor pool, batched ONNX, writes staging files)
          -> with --graph: extract entities (actor pool; graph/extractions.py files)

They wrap the core (readers, chunker, embedder); nothing here chunks or embeds by itself.
Every row of a stage has the same columns; failures are rows with `error` set, never exceptions.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from llmframe_ray.index.metadata import DEFAULT_NAMESPACE, internal_id
from llmframe_ray.index.params import IndexParams
from llmframe_ray.models.embedder import EmbedderParams, load_embedder
from llmframe_ray.errors import DocumentReadError
from llmframe_ray.ingest.readers import DEFAULT_MAX_FILE_BYTES, read_file_records
from llmframe_ray.batch.plan import (
    chunk_fingerprint, doc_fingerprint, shard_of,
)
from llmframe_ray.batch.staging import Staging
from llmframe_ray.types import Chunk, Document

DOC_COLUMNS = ("file_no", "line", "path", "doc_id", "title", "text", "metadata", "error")
CHUNK_COLUMNS = (
    "file_no", "line", "path", "doc_id", "error", "shard", "doc_fp", "chunk_fp", "position", "chunk",
)


def read_file(row: Mapping[str, Any], max_bytes: int = DEFAULT_MAX_FILE_BYTES) -> list[dict[str, Any]]:
    """One source file -> its documents (or the reason it cannot be read), one row each."""
    path, file_no = Path(row["path"]), int(row["file_no"])
    out = []
    try:
        for _, line, item in read_file_records(path, row["doc_id"], max_bytes):
            if isinstance(item, DocumentReadError):
                out.append(_doc_row(file_no, line, path, "", "", "", {}, item.reason))
            else:
                metadata = {**item.metadata, **json.loads(row.get("metadata") or "{}")}
                doc_id = internal_id(row.get("namespace") or DEFAULT_NAMESPACE, item.doc_id)
                title = row.get("title") or item.title
                out.append(_doc_row(file_no, line, path, doc_id, title, item.text, metadata, ""))
    except Exception as exc:  # a reader bug must not take the whole job down: report the file
        out.append(_doc_row(file_no, 0, path, "", "", "", {}, f"unexpected {type(exc).__name__}: {exc}"))
    return out


def _doc_row(file_no: int, line: int, path: Path, doc_id: str, title: str, text: str,
             metadata: Mapping[str, Any], error: str) -> dict[str, Any]:
    return {"file_no": file_no, "line": line, "path": str(path), "doc_id": doc_id,
            "title": title, "text": text, "metadata": json.dumps(dict(metadata), ensure_ascii=False), "error": error}


class ChunkDocuments:
    """Documents -> chunks with routing and fingerprints (error rows pass through)."""

    def __init__(self, embedder: EmbedderParams, index: IndexParams, n_shards: int) -> None:
        from llmframe_ray.ingest.build import make_chunker

        self.n_shards = n_shards
        self.chunker = make_chunker(index, load_embedder(embedder))

    def __call__(self, batch: Mapping[str, np.ndarray]) -> dict[str, list[Any]]:
        out: dict[str, list[Any]] = {name: [] for name in CHUNK_COLUMNS}
        rows = [dict(zip(DOC_COLUMNS, values)) for values in zip(*(batch[c] for c in DOC_COLUMNS))]
        docs = [r for r in rows if not r["error"]]
        as_docs = [
            Document(str(r["doc_id"]), str(r["text"]), title=str(r["title"]), metadata=json.loads(str(r["metadata"])))
            for r in docs
        ]
        try:
            chunked = self.chunker.chunk_many(as_docs)
        except Exception:  # find the document that fails; the others go on
            chunked = []
            for row, doc in zip(docs, as_docs):
                try:
                    chunked.append(self.chunker.chunk(doc))
                except Exception as exc:
                    row["error"] = f"cannot be chunked: {type(exc).__name__}: {exc}"
                    chunked.append([])
        by_row = {id(r): chunks for r, chunks in zip(docs, chunked)}
        for row in rows:
            base = {"file_no": int(row["file_no"]), "line": int(row["line"]), "path": str(row["path"]),
                    "doc_id": str(row["doc_id"])}
            chunks = by_row.get(id(row), [])
            if row["error"] or not chunks:
                error = str(row["error"]) or "no text to index"
                _append(out, {**base, "error": error, "shard": -1, "doc_fp": "", "chunk_fp": "",
                              "position": -1, "chunk": ""})
                continue
            fps = [chunk_fingerprint(c) for c in chunks]
            doc_fp = doc_fingerprint(fps)
            shard = shard_of(base["doc_id"], self.n_shards)
            for chunk, fp in zip(chunks, fps):
                _append(out, {**base, "error": "", "shard": shard, "doc_fp": doc_fp, "chunk_fp": fp,
                              "position": chunk.position, "chunk": chunk.to_json()})
        return out


def _append(out: dict[str, list[Any]], row: Mapping[str, Any]) -> None:
    for name in CHUNK_COLUMNS:
        out[name].append(row[name])


class EmbedChunks:
    """Embeds the chunks whose fingerprints were asked for and writes them to staging, one file
    per shard per batch. ONNX Runtime runs with as many threads as CPUs the actor was given."""

    def __init__(self, embedder: EmbedderParams, index_dir: str, key: str, wanted: frozenset[str]) -> None:
        self.embedder = load_embedder(embedder)
        self.staging = Staging(Path(index_dir), key)
        self.wanted = wanted

    def __call__(self, batch: Mapping[str, np.ndarray]) -> dict[str, list[int]]:
        rows = [
            (int(shard), str(fp), str(chunk))
            for shard, fp, chunk in zip(batch["shard"], batch["chunk_fp"], batch["chunk"])
            if fp in self.wanted
        ]
        seen: set[str] = set()
        rows = [r for r in rows if not (r[1] in seen or seen.add(r[1]))]
        if not rows:
            return {"embedded": []}
        vectors = self.embedder.embed([Chunk.from_json(chunk).indexed_text for _, _, chunk in rows])
        for shard in sorted({r[0] for r in rows}):
            picked = [i for i, r in enumerate(rows) if r[0] == shard]
            self.staging.write(shard, [rows[i][1] for i in picked], [rows[i][2] for i in picked], vectors[picked])
        return {"embedded": [len(rows)]}


class ExtractEntities:
    """Reads the entities of the chunks asked for, offline or by an LLM (`params` given: its
    provider chain), and stores them one file per batch (graph/extractions.py). Returns per
    batch how many it read and, for an LLM, the usage report as JSON."""

    def __init__(self, index_dir: str, wanted: frozenset[str], params: Any = None) -> None:
        from llmframe_ray.graph.build import llm_extractor
        from llmframe_ray.graph.extractions import ExtractionStore, extractor_name

        self.llm = llm_extractor(index_dir, params) if params is not None else None
        self.store = ExtractionStore(index_dir, extractor_name(self.llm))
        self.wanted = wanted

    def __call__(self, batch: Mapping[str, np.ndarray]) -> dict[str, list[Any]]:
        from llmframe_ray.graph.extractions import extract_chunks, storable

        seen: set[str] = set()
        rows = [(str(fp), Chunk.from_json(str(chunk))) for fp, chunk in zip(batch["chunk_fp"], batch["chunk"])
                if fp in self.wanted and not (fp in seen or seen.add(fp))]
        if not rows:
            return {"extracted": [], "report": []}
        entries, report = extract_chunks([(c.title, c.text) for _, c in rows], llm=self.llm)
        self.store.write(storable([(fp, entry) for (fp, _), entry in zip(rows, entries)], self.llm))
        return {"extracted": [len(rows)], "report": [json.dumps(report.as_dict()) if report is not None else "{}"]}
