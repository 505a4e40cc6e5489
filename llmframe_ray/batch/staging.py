"""Embeddings made by an ingestion run, kept on disk until the version that uses them is published.

    <index>/.staging/<key>/shard-0000/<batch digest>.npz
        fingerprints  (n,) str    chunk fingerprints (see plan.chunk_fingerprint)
        chunks        (n,) str    the chunks, as JSON
        vectors       (n, dim) float32

`key` covers the embedding model, the chunking parameters and the shard count, so vectors are
never reused under other settings. Each file is written atomically by the actor that embedded the batch; a run that
was killed and is started again reads which chunks already have vectors and embeds only the
rest. The folder is removed once the version is published.
"""

from __future__ import annotations

import hashlib
import io
import json
import shutil
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from llmframe_ray.index import atomic
from llmframe_ray.index.versions import shard_dir_name
from llmframe_ray.types import Chunk


STAGING_DIR = ".staging"


def staging_key(model: Mapping[str, Any], chunking: Mapping[str, Any], n_shards: int) -> str:
    text = json.dumps({"model": dict(model), "chunking": dict(chunking), "shards": n_shards}, sort_keys=True)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


class Staging:
    def __init__(self, index_dir: str | Path, key: str) -> None:
        self.root = Path(index_dir) / STAGING_DIR / key

    def write(self, shard: int, fingerprints: Sequence[str], chunks: Sequence[str], vectors: np.ndarray) -> Path:
        """Store one embedded batch of a shard; returns the file (named after its content)."""
        if not (len(fingerprints) == len(chunks) == len(vectors)):
            raise ValueError("fingerprints, chunks and vectors must have the same length")
        folder = self.root / shard_dir_name(shard)
        folder.mkdir(parents=True, exist_ok=True)
        digest = hashlib.blake2b("\n".join(fingerprints).encode("ascii"), digest_size=12).hexdigest()
        path = folder / f"{digest}.npz"
        buffer = io.BytesIO()
        np.savez(
            buffer,
            fingerprints=np.array(list(fingerprints), dtype=str),
            chunks=np.array(list(chunks), dtype=str),
            vectors=np.ascontiguousarray(vectors, dtype=np.float32),
        )
        atomic.write_bytes(path, buffer.getvalue())
        return path

    def _files(self, shard: int | None = None) -> list[Path]:
        if not self.root.is_dir():
            return []
        folders = [self.root / shard_dir_name(shard)] if shard is not None else sorted(self.root.iterdir())
        return [p for f in folders if f.is_dir() for p in sorted(f.glob("*.npz")) if not atomic.is_temp_name(p.name)]

    def fingerprints(self) -> set[str]:
        """Chunks that already have a vector here. A file that cannot be read (it was damaged
        after it was written) is deleted, so its chunks are embedded again."""
        found: set[str] = set()
        for path in self._files():
            try:
                with np.load(path, allow_pickle=False) as data:
                    found.update(data["fingerprints"].tolist())
            except (OSError, ValueError, KeyError, EOFError):
                path.unlink(missing_ok=True)
        return found

    def read(self, shard: int, wanted: Iterable[str]) -> tuple[list[Chunk], np.ndarray]:
        """The chunks of `wanted` fingerprints with their vectors, in `wanted` order; raises
        LookupError naming how many are missing."""
        wanted = list(wanted)
        index = {fp: i for i, fp in enumerate(wanted)}
        chunks: list[Chunk | None] = [None] * len(wanted)
        vectors: np.ndarray | None = None
        for path in self._files(shard):
            with np.load(path, allow_pickle=False) as data:
                fps, texts, vecs = data["fingerprints"], data["chunks"], data["vectors"]
                if vectors is None:
                    vectors = np.zeros((len(wanted), vecs.shape[1]), dtype=np.float32)
                for j, fp in enumerate(fps.tolist()):
                    i = index.get(fp)
                    if i is not None and chunks[i] is None:  # a chunk embedded twice: first copy
                        chunks[i] = Chunk.from_json(str(texts[j]))
                        vectors[i] = vecs[j]
        missing = sum(c is None for c in chunks)
        if missing:
            raise LookupError(f"{missing} of {len(wanted)} chunks of shard {shard} have no staged vector")
        return chunks, vectors if vectors is not None else np.zeros((0, 0), dtype=np.float32)  # type: ignore[return-value]

    def clear(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
        parent = self.root.parent
        if parent.is_dir() and not any(parent.iterdir()):
            parent.rmdir()
