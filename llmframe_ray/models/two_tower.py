"""Two-tower reranking: a trained reranker's query and passage sides, each read alone.

The rerankers `train-reranker` makes (train/reranker.py: mean_pool_classifier) read a (query,
passage) pair in one pass, with attention across the two segments behind learned gates that
start almost shut. Training hardly opens them (after the default SciFact training every gate
lies between -7.0 and -5.2, from -6.0), and shutting them moves no ranking measurably (README
"Reranking", two towers). With the gates shut each segment is encoded as if it were alone, and
the model's logit is a weighted dot product of the two pooled vectors:

    logit = sum_i weights_i * q_i * p_i + bias     (weights_i = scale + w_i, from the head)

So a passage's vector does not depend on the query: it is computed once and kept, by a digest
of its text, and a request costs one short query encoding and a dot product per passage instead
of `depth` pair encodings. A model folder's `tower.onnx` / `tower.int8.onnx` (the encoder, one
text per row, mean-pooled, unit length: output `vector`) and `tower.json` (the head, the text
length, and the sha256 of the model.onnx they were made from) are written by `train-reranker`,
or added to a folder trained before with `python -m llmframe_ray.train.towers M`.

int8 encodes one text per call, for the reason models/cross_encoder.py gives (dynamic
quantisation scales a MatMul's input by the whole batch's range): a passage's vector is the
same whatever else is encoded with it, so a kept vector is the one the model would give.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Sequence

import numpy as np

from llmframe_ray.errors import ModelError
from llmframe_ray.index.manifest import describe_file
from llmframe_ray.models.cross_encoder import INT8_SKIPPED_FUSIONS, DigestCache, Precision, read_card
from llmframe_ray.models.runtime import create_session, load_tokenizer, pad_encodings

logger = logging.getLogger(__name__)

TOWER_FILES = {"fp32": "tower.onnx", "int8": "tower.int8.onnx"}
TOWER_CARD = "tower.json"
TOWER_FORMAT = 1
TOWER_OUTPUT = "vector"
DEFAULT_VECTOR_CACHE = 50_000  # passages kept: 50,000 x 384 float32 = 77 MB
TOWER_VECTORS_DIR = "tower-vectors"  # under a models folder: passages' vectors computed ahead (`llmframe-ray rerank-vectors`), by tower file


def has_towers(model_dir: Path) -> bool:
    """Whether the folder holds a reranker's two towers (its `tower.json`)."""
    return (Path(model_dir) / TOWER_CARD).is_file()


def file_sha256(path: Path) -> str:
    return describe_file(path)["sha256"]


def read_tower_card(model_dir: Path) -> dict:
    """`tower.json`, checked: its head is usable and it was made from the folder's model.onnx."""
    path = Path(model_dir) / TOWER_CARD
    try:
        card = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ModelError(f"cannot read the two-tower card {path}: {exc}") from exc
    if not isinstance(card, dict) or card.get("format") != TOWER_FORMAT:
        raise ModelError(f"{path} is not a two-tower card of format {TOWER_FORMAT}")
    weights = card.get("weights")
    if not isinstance(weights, list) or not weights or not all(isinstance(w, (int, float)) for w in weights):
        raise ModelError(f"{path}: `weights` must be a non-empty list of numbers")
    if not isinstance(card.get("bias"), (int, float)) or not isinstance(card.get("max_length"), int):
        raise ModelError(f"{path}: `bias` must be a number and `max_length` an integer")
    source = Path(model_dir) / "model.onnx"
    if source.is_file() and card.get("made_from_sha256") != file_sha256(source):
        raise ModelError(
            f"the towers in {model_dir} were made from another model.onnx than the one there now; "
            f"make them again: python -m llmframe_ray.train.towers {model_dir}"
        )
    return card


def text_key(text: str) -> bytes:
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()


class VectorCache(DigestCache):
    """Passage vectors by a 128-bit digest of the exact text (DigestCache)."""

    what, unit = "vector cache", "passage"

    def stats(self) -> dict[str, int]:
        return {"vector_hits": self.hits, "vector_misses": self.misses, "vector_passages": len(self)}

    def save(self, path: Path) -> int:
        """Write every kept vector to `path` (.npz, replaced whole once written); returns how many."""
        with self._lock:
            keys = np.frombuffer(b"".join(self._values), dtype=np.uint8).reshape(-1, 16)
            vectors = np.stack(list(self._values.values())) if self._values else np.empty((0, 0), np.float32)
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        staging = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        with open(staging, "wb") as f:
            np.savez(f, keys=keys, vectors=vectors)
        os.replace(staging, path)
        return len(keys)

    def load(self, path: Path, dim: int) -> int:
        """Keep the vectors a `save` wrote to `path` (the last `capacity` of them); returns how many."""
        try:
            with np.load(path) as data:
                keys, vectors = data["keys"], data["vectors"]
        except (OSError, ValueError, KeyError) as exc:
            raise ModelError(f"cannot read the kept passage vectors {path}: {exc}") from exc
        if len(keys) and (keys.shape[1:] != (16,) or vectors.shape != (len(keys), dim)):
            raise ModelError(f"{path} holds vectors of shape {vectors.shape} for {len(keys)} passages; this tower's have {dim} numbers")
        start = max(0, len(keys) - self.capacity)
        self.put_many([bytes(k) for k in keys[start:]], vectors[start:].astype(np.float32))
        return len(keys) - start


class TwoTowerScorer:
    """The reranker's scores of (query, passage) pairs from its two towers: the same interface
    as CrossEncoder (`score_pairs`, `score`, `card`), passages' vectors kept in `cache`."""

    form_note = " two towers"

    def __init__(
        self,
        model_dir: Path,
        *,
        precision: str | Precision = Precision.AUTO,
        max_length: int | None = None,
        batch_size: int = 32,
        threads: int = 1,
        spinning: bool = True,
        prepacked_dir: Path | None = None,
        cache_size: int = DEFAULT_VECTOR_CACHE,
        store_dir: Path | None = None,
    ) -> None:
        self.model_dir = Path(model_dir)
        head = read_tower_card(self.model_dir)
        precision = Precision.from_str(precision)
        if precision is Precision.AUTO:
            has_int8 = (self.model_dir / TOWER_FILES["int8"]).is_file()
            precision = Precision.INT8 if has_int8 else Precision.FP32
        self.precision = precision
        onnx_path = self.model_dir / TOWER_FILES[precision.value]
        missing = [p.name for p in (onnx_path, self.model_dir / "tokenizer.json") if not p.is_file()]
        if missing:
            raise ModelError(f"the two-tower reranker {self.model_dir} has no {', '.join(missing)}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.card = read_card(self.model_dir)
        self.name = str(self.card.get("name") or self.model_dir.name)
        self.weights = np.asarray(head["weights"], dtype=np.float32)
        self.bias = float(head["bias"])
        self.max_length = int(max_length or head["max_length"])
        self.batch_size = batch_size
        self.threads = threads
        self._tokenizer = load_tokenizer(self.model_dir / "tokenizer.json", self.max_length)
        self.one_by_one = precision is Precision.INT8
        skipped = INT8_SKIPPED_FUSIONS if self.one_by_one else ()
        session_threads = 1 if self.one_by_one else threads
        self._session = create_session(onnx_path, session_threads, spinning, prepacked_dir, skipped_fusions=skipped)
        self._input_names = {i.name for i in self._session.get_inputs()}
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="tower") if self.one_by_one and threads > 1 else None
        self.cache = VectorCache(cache_size) if cache_size > 0 else None
        # passages' vectors computed ahead (`warm`), by the tower file and the length they were read at
        store_name = f"{file_sha256(onnx_path)[:16]}-{self.max_length}.npz"
        self.store_path = None if store_dir is None else Path(store_dir) / store_name
        if self.cache is not None and self.store_path is not None and self.store_path.is_file():
            try:
                self.cache.load(self.store_path, self.weights.shape[0])
            except ModelError as exc:  # the vectors are only ahead of time: serve, computing them again
                logger.warning("%s; the passages' vectors will be computed as they are asked for", exc)

    def _run(self, texts: Sequence[str]) -> np.ndarray:
        batch = pad_encodings(self._tokenizer.encode_batch(list(texts)))
        vectors = self._session.run([TOWER_OUTPUT], batch.feeds(self._input_names))[0]
        if vectors.ndim != 2 or vectors.shape[1] != self.weights.shape[0]:
            raise ModelError(f"{self.model_dir}: the tower gave vectors of shape {vectors.shape}, "
                             f"its head has {self.weights.shape[0]} weights")
        return np.asarray(vectors, dtype=np.float32)

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """Each text's vector (unit length), in order; int8: one text per call."""
        out = np.empty((len(texts), self.weights.shape[0]), dtype=np.float32)
        if not texts:
            return out
        if self.one_by_one:
            def one(text: str) -> np.ndarray:
                return self._run([text])[0]

            rows = list(self._pool.map(one, texts)) if self._pool is not None else [one(t) for t in texts]
            out[:] = np.stack(rows)
            return out
        order = np.argsort(-np.array([len(t) for t in texts]), kind="stable")
        for start in range(0, len(texts), self.batch_size):
            rows = order[start : start + self.batch_size]
            out[rows] = self._run([texts[i] for i in rows])
        return out

    def passage_vectors(self, passages: Sequence[str]) -> np.ndarray:
        """The passages' vectors, those the cache holds not encoded again."""
        if self.cache is None:
            return self.encode(passages)
        keys = [text_key(p) for p in passages]
        known = self.cache.get_many(keys)
        missing = [i for i, vector in enumerate(known) if vector is None]
        fresh = self.encode([passages[i] for i in missing])
        if missing:
            self.cache.put_many([keys[i] for i in missing], fresh)
        out = np.empty((len(passages), self.weights.shape[0]), dtype=np.float32)
        for i, vector in enumerate(known):
            if vector is not None:
                out[i] = vector
        out[missing] = fresh
        return out

    def warm(self, passages: Sequence[str], chunk: int = 512, progress=None) -> int:
        """Compute the vectors of `passages` not kept yet and save every kept vector to the store
        (`store_dir`), where the next scorer of this tower on this host starts from them; returns
        how many were computed. `progress(done, total)` after each block of `chunk`."""
        if self.cache is None or self.store_path is None:
            raise ModelError("warming needs a vector cache (LLMFRAME_RERANKER_VECTOR_CACHE > 0) and a store folder")
        distinct = {text_key(p): p for p in passages}
        if len(distinct) > self.cache.capacity:
            raise ModelError(f"{len(distinct)} distinct passages do not fit a vector cache of {self.cache.capacity}: "
                             "raise LLMFRAME_RERANKER_VECTOR_CACHE")
        keys = list(distinct)
        todo = [k for k, v in zip(keys, self.cache.get_many(keys)) if v is None]
        for start in range(0, len(todo), chunk):
            block = todo[start : start + chunk]
            self.cache.put_many(block, self.encode([distinct[k] for k in block]))
            if progress is not None:
                progress(start + len(block), len(todo))
        self.cache.save(self.store_path)
        return len(todo)

    def score_pairs(self, pairs: Sequence[tuple[str, str]]) -> np.ndarray:
        """Scores in input order: each distinct query encoded once, each distinct passage once
        (or not at all where the cache holds it)."""
        if not pairs:
            return np.empty(0, dtype=np.float32)
        queries = list(dict.fromkeys(q for q, _ in pairs))
        passages = list(dict.fromkeys(p for _, p in pairs))
        q_vectors = self.encode(queries) * self.weights
        p_vectors = self.passage_vectors(passages)
        q_row = {q: i for i, q in enumerate(queries)}
        p_row = {p: i for i, p in enumerate(passages)}
        q_index = np.fromiter((q_row[q] for q, _ in pairs), dtype=np.int64, count=len(pairs))
        p_index = np.fromiter((p_row[p] for _, p in pairs), dtype=np.int64, count=len(pairs))
        scores = np.einsum("ij,ij->i", q_vectors[q_index], p_vectors[p_index]) + self.bias
        return scores.astype(np.float32)

    def score(self, query: str, passages: Sequence[str]) -> np.ndarray:
        return self.score_pairs([(query, p) for p in passages])

