"""One index shard: dense index, sparse index and chunk store over the same rows, plus a manifest.

Row i is the same chunk everywhere. On disk a shard is a directory:

    manifest.json          written last; lists every other file with its size and SHA-256
    dense.faiss            the FAISS index
    sparse/                the bm25s index and the analyzer settings
    chunks.*               the chunk store

`save` writes into a temporary sibling directory and renames it into place, so a shard directory
either is complete or does not exist; a directory without manifest.json is debris of a crash.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from llmframe_ray.errors import IndexLoadError
from llmframe_ray.index import atomic
from llmframe_ray.index.dense import DenseIndex, DenseParams
from llmframe_ray.index.metadata import Filter, namespace_of
from llmframe_ray.index.manifest import MANIFEST_NAME, Manifest, describe_file
from llmframe_ray.index.sparse import CorpusStats, SparseIndex, SparseParams
from llmframe_ray.index.store import ChunkStore
from llmframe_ray.types import Chunk

DENSE_FILE = "dense.faiss"
SPARSE_DIR = "sparse"
MODEL_KEYS = ("name", "provider", "dim", "max_length")


def shard_of(doc_id: str, n_shards: int) -> int:
    """The shard a document's chunks live in: blake2b(doc_id) mod n_shards."""
    digest = hashlib.blake2b(doc_id.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % n_shards


def _check_inputs(chunks: Sequence[Chunk], embeddings: Any, model: Mapping[str, Any]) -> None:
    if len(chunks) == 0:
        raise ValueError("cannot build an index shard from zero chunks")
    if not isinstance(embeddings, np.ndarray) or embeddings.ndim != 2:
        raise ValueError("embeddings must be a 2-D numpy array (one row per chunk)")
    if embeddings.shape[0] != len(chunks):
        raise ValueError(
            f"got {len(chunks)} chunks but {embeddings.shape[0]} embeddings; "
            "embeddings row i must belong to chunks[i]"
        )
    missing = [key for key in MODEL_KEYS if key not in model]
    if missing:
        raise ValueError(f"model description is missing keys: {', '.join(missing)}")
    if model["dim"] != embeddings.shape[1]:
        raise ValueError(
            f"model {model['name']!r} has dim {model['dim']} but the embeddings have "
            f"{embeddings.shape[1]} columns"
        )
    seen: set[str] = set()
    for chunk in chunks:
        if chunk.chunk_id in seen:
            raise ValueError(f"chunk id {chunk.chunk_id!r} occurs more than once")
        seen.add(chunk.chunk_id)


def _describe_files(directory: Path) -> dict[str, dict[str, Any]]:
    """Size and SHA-256 of every file under `directory`, keyed by POSIX relative path."""
    files = sorted(p for p in directory.rglob("*") if p.is_file())
    return {p.relative_to(directory).as_posix(): describe_file(p) for p in files}


def _check_files(path: Path, files: Mapping[str, Any], verify: bool) -> None:
    if DENSE_FILE not in files:
        raise IndexLoadError(f"{path}: the manifest lists no {DENSE_FILE}")
    root = path.resolve()
    for name, expected in files.items():
        if not isinstance(expected, Mapping) or not {"bytes", "sha256"} <= set(expected):
            raise IndexLoadError(f"{path}: manifest entry for {name} needs bytes and sha256")
        file = path / name
        # a manifest names files inside its own folder only: no absolute paths, no "..", no
        # links that lead out of it
        parts = PurePosixPath(name).parts if isinstance(name, str) else ()
        if not parts or PurePosixPath(name).is_absolute() or ".." in parts or root not in file.resolve().parents:
            raise IndexLoadError(f"{path}: the manifest names {name!r}, which is not a file of this shard folder")
        if not file.is_file():
            raise IndexLoadError(f"{path}: file {name} listed in the manifest is missing")
        size = file.stat().st_size
        if size != expected["bytes"]:
            raise IndexLoadError(
                f"{path}: file {name} has {size} bytes; the manifest says {expected['bytes']}"
            )
        if verify and describe_file(file)["sha256"] != expected["sha256"]:
            raise IndexLoadError(f"{path}: file {name} does not match its SHA-256 in the manifest")


def _write_shard_dir(path: Path, fill: Callable[[Path], Manifest]) -> Manifest:
    """Create the shard folder `path` atomically: `fill(tmp)` writes every file into a temporary
    sibling and returns the manifest, which is written last; the folder is then renamed into
    place. On an error the temporary folder is removed."""
    if path.exists():
        raise FileExistsError(f"{path} already exists; a shard is written once, to a new path")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = atomic.temp_sibling(path)
    tmp.mkdir()
    try:
        manifest = fill(tmp)
        manifest.save(tmp / MANIFEST_NAME)
        atomic.fsync_dir(tmp)
        if path.exists():
            raise FileExistsError(f"{path} appeared while the shard was being written")
        os.rename(tmp, path)
    except Exception:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    atomic.fsync_dir(path.parent)
    return manifest


@dataclass(frozen=True, eq=False)
class IndexShard:
    dense: DenseIndex
    sparse: SparseIndex
    store: ChunkStore
    manifest: Manifest

    @classmethod
    def build(
        cls,
        chunks: Sequence[Chunk],
        embeddings: np.ndarray,
        *,
        dense: DenseParams,
        sparse: SparseParams,
        model: Mapping[str, Any],
        chunking: Mapping[str, Any],
        corpus: CorpusStats | None = None,
    ) -> IndexShard:
        """Index `chunks`; `embeddings[i]` is the vector of `chunks[i]`.

        `model` describes the embedder: name, provider, dim, max_length. BM25 indexes each
        chunk's `indexed_text` (title and text), with the statistics of `corpus` when the shard
        is one of several (see SparseIndex.build). Rows are stored in (doc_id, position) order
        whatever the input order, so "lower row first" breaks ties the same way in any shard
        layout, and a document's chunks sit next to each other.
        """
        _check_inputs(chunks, embeddings, model)
        order = sorted(range(len(chunks)), key=lambda i: (chunks[i].doc_id, chunks[i].position))
        if order != list(range(len(chunks))):
            chunks = [chunks[i] for i in order]
            embeddings = np.ascontiguousarray(np.asarray(embeddings)[order])
        dense_index = DenseIndex.build(embeddings, dense)
        sparse_index = SparseIndex.build(
            [c.indexed_text for c in chunks], sparse, corpus, [namespace_of(c.doc_id) for c in chunks]
        )
        store = ChunkStore.from_chunks(chunks)
        manifest = Manifest(
            model=dict(model),
            parameters={
                "chunking": dict(chunking),
                "dense": dense_index.params.to_dict(),
                "sparse": sparse_index.params.to_dict(),
            },
            counts={"documents": store.n_documents, "chunks": len(store)},
            max_chunks_per_doc=store.max_chunks_per_doc,
        )
        return cls(dense_index, sparse_index, store, manifest)

    def save(self, path: str | Path) -> Manifest:
        """Write the shard to the new directory `path`; return the manifest written.

        Everything goes into a temporary sibling directory first (fsynced, manifest last), which
        is then renamed to `path`. On an error the temporary directory is removed.
        """

        def fill(tmp: Path) -> Manifest:
            self.dense.save(tmp / DENSE_FILE)
            self.sparse.save(tmp / SPARSE_DIR)
            self.store.save(tmp)
            atomic.fsync_tree(tmp)
            return replace(self.manifest, files=_describe_files(tmp))

        return _write_shard_dir(Path(path), fill)

    @classmethod
    def relink(cls, source: str | Path, path: str | Path, corpus: CorpusStats) -> Manifest:
        """Write the shard at `source` to the new directory `path` with its BM25 part rescored
        for `corpus`: the dense index and chunk store are hard links to `source`'s files (no
        copy; `source` must be on the same file system), the sparse index is rebuilt from the
        stored texts. Returns the new manifest. Used to carry an unchanged shard into a new
        version whose corpus-wide statistics changed."""
        source = Path(source)
        old = cls.load(source, mmap=True)
        if Path(path).exists():
            raise FileExistsError(f"{path} already exists; a shard is written once, to a new path")
        sparse = SparseIndex.build(
            [c.indexed_text for c in old.store], old.sparse.params, corpus, old.row_namespaces()
        )
        linked = {
            name: entry for name, entry in old.manifest.files.items()
            if not name.startswith(f"{SPARSE_DIR}/")
        }

        def fill(tmp: Path) -> Manifest:
            for name in linked:
                (tmp / name).parent.mkdir(parents=True, exist_ok=True)
                os.link(source / name, tmp / name)
            sparse.save(tmp / SPARSE_DIR)
            atomic.fsync_tree(tmp)
            files = {**{k: dict(v) for k, v in linked.items()}, **{
                f"{SPARSE_DIR}/{k}": v for k, v in _describe_files(tmp / SPARSE_DIR).items()
            }}
            parameters = {**dict(old.manifest.parameters), "sparse": sparse.params.to_dict()}
            return replace(old.manifest, parameters=parameters, files=dict(sorted(files.items())))

        return _write_shard_dir(Path(path), fill)

    @classmethod
    def load(cls, path: str | Path, *, mmap: bool = True, verify: bool = False) -> IndexShard:
        """Open a saved shard. File sizes are always checked; `verify` also checks SHA-256."""
        path = Path(path)
        if not path.is_dir():
            raise IndexLoadError(f"{path}: index shard directory does not exist")
        if not (path / MANIFEST_NAME).is_file():
            raise IndexLoadError(
                f"{path}: incomplete index shard ({MANIFEST_NAME} is missing); rebuild it"
            )
        manifest = Manifest.load(path / MANIFEST_NAME)
        _check_files(path, manifest.files, verify)
        try:
            dense_params = DenseParams.from_dict(manifest.parameters["dense"])
            dense = DenseIndex.load(path / DENSE_FILE, dense_params, mmap=mmap)
            sparse = SparseIndex.load(path / SPARSE_DIR, mmap=mmap)
            store = ChunkStore.load(path, mmap=mmap)
        except (OSError, RuntimeError, ValueError, KeyError, TypeError) as exc:
            raise IndexLoadError(f"{path}: cannot load index shard: {exc}") from exc
        sizes = {"dense": len(dense), "sparse": len(sparse), "store": len(store)}
        expected = manifest.counts.get("chunks")
        if any(size != expected for size in sizes.values()):
            raise IndexLoadError(
                f"{path}: the manifest counts {expected} chunks but the parts hold {sizes}"
            )
        return cls(dense, sparse, store, manifest)

    def __len__(self) -> int:
        return len(self.store)

    def row_namespaces(self) -> list[str]:
        """The namespace of each row's document."""
        documents = self.store.documents
        return [documents.namespaces[c] for c in documents.namespace_codes[self.store.doc_index].tolist()]

    def bm25_stats(self) -> CorpusStats:
        """This shard's own BM25 statistics, by namespace (to be merged with the others')."""
        return self.sparse.stats(self.row_namespaces())

    def search_dense(self, query_vectors: np.ndarray, k: int) -> list[list[tuple[int, float]]]:
        """Per query, up to `k` (row, cosine) pairs, best first (ties: lower row first)."""
        return [_pairs(rows, scores) for rows, scores in self.search_dense_arrays(query_vectors, k)]

    def search_dense_arrays(
        self, query_vectors: np.ndarray, k: int, where: Filter | None = None
    ) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per query, (rows, float32 scores) of up to `k` rows, best first; with `where`, of the
        rows whose documents it selects (DenseIndex.search_within)."""
        allowed = None if where is None else self.store.row_mask(where)
        if allowed is not None:
            scores, rows = self.dense.search_within(query_vectors, k, allowed)
            return list(zip(rows, scores))
        scores, rows = self.dense.search(query_vectors, k)
        if rows.size and rows[:, -1].min() >= 0:  # every slot filled (always for an exact index)
            return list(zip(rows, scores))
        return [(r[r >= 0], s[r >= 0]) for r, s in zip(rows, scores)]

    def search_sparse(self, queries: Sequence[str], k: int) -> list[list[tuple[int, float]]]:
        """Per query, up to `k` (row, BM25 score) pairs with a positive score, best first."""
        return [_pairs(rows, scores) for rows, scores in self.sparse.search_arrays(queries, k)]

    def search_sparse_arrays(
        self, queries: Sequence[str], k: int, where: Filter | None = None
    ) -> list[tuple[np.ndarray, np.ndarray]]:
        allowed = None if where is None else self.store.row_mask(where)
        return self.sparse.search_arrays(queries, k, allowed)

    def chunk(self, row: int) -> Chunk:
        return self.store.get(row)

    def chunks(self, rows: Sequence[int]) -> list[Chunk]:
        return self.store.get_many(rows)

    def doc_id(self, row: int) -> str:
        return self.store.doc_id(row)


def _pairs(rows: np.ndarray, scores: np.ndarray) -> list[tuple[int, float]]:
    return list(zip(rows.tolist(), scores.tolist()))
