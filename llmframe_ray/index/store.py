"""The chunk store of a shard: row i -> Chunk, readable without loading the whole store.

Files (all written atomically):
    chunks.bin            one UTF-8 JSON object per chunk (every Chunk field), concatenated
    chunks.offsets.npy    int64, n + 1 byte offsets; record i is bin[offsets[i]:offsets[i + 1]]
    chunks.docs.json      the distinct doc ids, in order of first appearance
    chunks.doc_index.npy  int32, n: row -> position of its doc id in chunks.docs.json
    chunks.metadata.json  each document's metadata, in chunks.docs.json's order (written only
                          when some document has metadata; absent: none has)

With `mmap`, chunks.bin and the two arrays are memory-mapped; only chunks.docs.json is read.
"""

from __future__ import annotations

import copy as copy_module
import json
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import numpy as np

from llmframe_ray.index import atomic
from llmframe_ray.index.metadata import DocumentMetadata, Filter
from llmframe_ray.types import Chunk

BIN_FILE = "chunks.bin"
OFFSETS_FILE = "chunks.offsets.npy"
DOCS_FILE = "chunks.docs.json"
DOC_INDEX_FILE = "chunks.doc_index.npy"
METADATA_FILE = "chunks.metadata.json"
MASKS_KEPT = 64  # filters whose row masks a store keeps

class ChunkStore:
    """Chunks by row. Build one with `from_chunks`, persist with `save`, reopen with `load`."""

    def __init__(
        self,
        data: np.ndarray,
        offsets: np.ndarray,
        doc_table: Sequence[str],
        doc_index: np.ndarray,
        doc_metadata: Sequence[Mapping[str, Any]] | None = None,
    ) -> None:
        if len(offsets) != len(doc_index) + 1:
            raise ValueError(
                f"chunk store has {len(offsets)} offsets for {len(doc_index)} rows; "
                "expected one more offset than rows"
            )
        # Plain ndarray views of memory-mapped files: np.memmap's own indexing costs several
        # times more per call, and a search reads a few rows many times a second.
        self._data = _plain(data)
        self._offsets = _plain(offsets)
        self.doc_table = tuple(doc_table)
        self.doc_index = _plain(doc_index)
        if doc_metadata is not None and len(doc_metadata) != len(self.doc_table):
            raise ValueError(f"chunk store has {len(self.doc_table)} documents but {len(doc_metadata)} metadata objects")
        self.doc_metadata: Sequence[Mapping[str, Any]] = (
            doc_metadata if doc_metadata is not None else [{}] * len(self.doc_table)
        )
        self._documents: DocumentMetadata | None = None
        self._masks: OrderedDict[Filter, np.ndarray | None] = OrderedDict()
        self._lock = threading.Lock()
        self._doc_ids: list[str] | None = None
        self._doc_strings: np.ndarray | None = None
        self._doc_keys: np.ndarray | None = None  # see share_document_keys

    @classmethod
    def from_chunks(cls, chunks: Sequence[Chunk]) -> ChunkStore:
        records = [c.to_json().encode("utf-8") for c in chunks]
        offsets = np.zeros(len(records) + 1, dtype=np.int64)
        np.cumsum([len(r) for r in records], out=offsets[1:])
        positions: dict[str, int] = {}
        metadata: list[Mapping[str, Any]] = []
        codes = []
        for c in chunks:
            if c.doc_id not in positions:
                positions[c.doc_id] = len(positions)
                metadata.append(dict(c.metadata))
            codes.append(positions[c.doc_id])
        data = np.frombuffer(b"".join(records), dtype=np.uint8)
        return cls(data, offsets, list(positions), np.array(codes, dtype=np.int32), metadata)

    def __len__(self) -> int:
        return len(self.doc_index)

    def _check_row(self, row: int) -> int:
        row = int(row)
        if not 0 <= row < len(self):
            raise IndexError(f"row {row} is out of range for a store of {len(self)} chunks")
        return row

    def get(self, row: int) -> Chunk:
        row = self._check_row(row)
        start, end = int(self._offsets[row]), int(self._offsets[row + 1])
        return Chunk.from_json(self._data[start:end].tobytes().decode("utf-8"))

    def get_many(self, rows: Sequence[int]) -> list[Chunk]:
        """The chunks of `rows`, in order: their records decoded as one JSON array (a response's
        ten chunks: one parse instead of ten)."""
        rows = [self._check_row(row) for row in rows]
        if len(rows) < 2:
            return [self.get(row) for row in rows]
        data, offsets = self._data, self._offsets
        starts, ends = offsets[rows].tolist(), offsets[np.add(rows, 1)].tolist()
        records = b",".join([data[start:end].tobytes() for start, end in zip(starts, ends)])
        try:
            parsed = json.loads((b"[" + records + b"]").decode("utf-8"))
        except ValueError:
            parsed = None
        if not isinstance(parsed, list) or len(parsed) != len(rows) or not all(isinstance(r, dict) for r in parsed):
            # a damaged record (it may even parse, merged with its neighbours): read them one
            # by one, so that the error names what a single read names
            return [self.get(row) for row in rows]
        return [Chunk(**record) for record in parsed]

    def __iter__(self) -> Iterator[Chunk]:
        return (self.get(row) for row in range(len(self)))

    def doc_id(self, row: int) -> str:
        return self.doc_table[int(self.doc_index[self._check_row(row)])]

    def doc_ids_of(self, rows: np.ndarray) -> np.ndarray:
        """The document ids of in-range `rows` as a str array (no per-row range check)."""
        if self._doc_strings is None:
            self._doc_strings = np.array(self.doc_table, dtype=np.str_)
        return self._doc_strings[self.doc_index[rows]]

    def doc_keys_of(self, rows: np.ndarray) -> np.ndarray:
        """Keys of the rows' documents that sort like their ids: int64 keys shared with the
        stores searched together with this one (`share_document_keys`), else the ids."""
        if self._doc_keys is None:
            return self.doc_ids_of(rows)
        return self._doc_keys[self.doc_index[rows]]

    @property
    def doc_ids(self) -> list[str]:
        """The doc id of every row (built once, on first use). For grouping rows by
        document, `doc_index` (int codes into `doc_table`) is cheaper."""
        if self._doc_ids is None:
            table = self.doc_table
            self._doc_ids = [table[i] for i in self.doc_index.tolist()]
        return self._doc_ids

    @property
    def documents(self) -> DocumentMetadata:
        """The documents' metadata and namespaces, as filter columns (built on first use)."""
        if self._documents is None:
            self._documents = DocumentMetadata(self.doc_table, self.doc_metadata)
        return self._documents

    def row_mask(self, where: Filter) -> np.ndarray | None:
        """The rows whose documents `where` selects (None: every row); the masks of the last
        MASKS_KEPT filters are kept."""
        if where.empty:
            return None
        with self._lock:
            if where in self._masks:
                self._masks.move_to_end(where)
                return self._masks[where]
        docs = self.documents.mask(where)
        rows = None if docs is None or docs.all() else docs[self.doc_index]  # all: the unfiltered path
        with self._lock:
            self._masks[where] = rows
            while len(self._masks) > MASKS_KEPT:
                self._masks.popitem(last=False)
        return rows

    @property
    def n_documents(self) -> int:
        return len(self.doc_table)

    @property
    def max_chunks_per_doc(self) -> int:
        if len(self) == 0:
            return 0
        return int(np.bincount(self.doc_index, minlength=len(self.doc_table)).max())

    def save(self, directory: str | Path) -> None:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        atomic.write_via(directory / BIN_FILE, self._write_data)
        atomic.write_array(directory / OFFSETS_FILE, np.asarray(self._offsets, dtype=np.int64))
        atomic.write_json(directory / DOCS_FILE, list(self.doc_table))
        atomic.write_array(directory / DOC_INDEX_FILE, np.asarray(self.doc_index, dtype=np.int32))
        if any(self.doc_metadata):
            atomic.write_json(directory / METADATA_FILE, [dict(m) for m in self.doc_metadata])

    def _write_data(self, path: Path, block: int = 1 << 24) -> None:
        with open(path, "wb") as f:
            for start in range(0, len(self._data), block):
                f.write(self._data[start : start + block].tobytes())

    @classmethod
    def load(cls, directory: str | Path, *, mmap: bool = True) -> ChunkStore:
        directory = Path(directory)
        mode = "r" if mmap else None
        offsets = np.load(directory / OFFSETS_FILE, mmap_mode=mode)
        doc_index = np.load(directory / DOC_INDEX_FILE, mmap_mode=mode)
        doc_table = json.loads((directory / DOCS_FILE).read_text(encoding="utf-8"))
        bin_path = directory / BIN_FILE
        if mmap and bin_path.stat().st_size > 0:
            data = np.memmap(bin_path, dtype=np.uint8, mode="r")
        else:  # an empty file cannot be memory-mapped
            data = np.fromfile(bin_path, dtype=np.uint8)
        if int(offsets[-1]) != len(data):
            raise ValueError(
                f"{bin_path} has {len(data)} bytes but its offsets end at {int(offsets[-1])}"
            )
        meta_path = directory / METADATA_FILE
        metadata = json.loads(meta_path.read_text(encoding="utf-8")) if meta_path.is_file() else None
        return cls(data, offsets, doc_table, doc_index, metadata)


def _plain(array: np.ndarray) -> np.ndarray:
    """`array` as a plain ndarray over the same memory (a memmap's buffer stays mapped)."""
    return array.view(np.ndarray) if isinstance(array, np.memmap) else array



def share_document_keys(stores: Sequence[ChunkStore]) -> list[ChunkStore]:
    """Copies of the stores (sharing their data) whose `doc_keys_of` gives int64 document keys
    ordered like the document ids over all of them together (equal ids, equal keys). Ranking
    compares document ids to break ties; on integers that costs a fraction of comparing
    strings. Only stores whose results are merged with each other's alone may share keys (one
    process searching every shard); the stores given keep answering the ids."""
    tables = [np.array(store.doc_table, dtype=np.str_) for store in stores]
    keys = np.unique(np.concatenate(tables), return_inverse=True)[1] if tables else None
    shared, start = [], 0
    for store, table in zip(stores, tables):
        copy = copy_module.copy(store)
        copy._doc_keys = keys[start : start + len(table)].astype(np.int64)
        shared.append(copy)
        start += len(table)
    return shared
