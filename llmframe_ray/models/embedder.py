"""Text embedders behind one interface: local ONNX MiniLM, and OpenAI's hosted models.

The ONNX embedder splits a call into tokenize -> run -> pool, so that a server can batch the
middle step. Vectors are float32 and L2-normalised, so inner product is cosine similarity.
"""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol, Sequence

import numpy as np

from llmframe_ray.errors import EmptyQueryError, ModelError, QueryTooLongError
from llmframe_ray.models.runtime import (
    PREPACKED_DIR,
    EncodedBatch,
    available_threads,
    create_session,
    load_tokenizer,
    pad_encodings,
)

logger = logging.getLogger(__name__)

SPECIAL_TOKENS = 2  # [CLS] and [SEP]
_CHECKED_KEPT = 256  # encodings of checked queries kept for tokenize
# Texts per ONNX Runtime call. Small batches ran fastest here (2 cores, AMD EPYC: 4 against 32
# was 1.15-1.40x as fast for 24-word and ~190-token chunks, with one thread or two; README
# "Ingestion job"): the activations of a small batch stay in the core's caches.
DEFAULT_BATCH_SIZE = 4


class Embedder(Protocol):
    name: str
    provider: str
    dim: int
    max_length: int

    def embed(self, texts: Sequence[str], *, solo: bool = False) -> np.ndarray: ...

    def check_query(self, query: str) -> str: ...

    def info(self) -> dict[str, object]: ...


def check_query_text(query: str) -> str:
    """Strip a query; reject it when nothing is left."""
    if not isinstance(query, str):
        raise TypeError(f"query must be a string, not {type(query).__name__}")
    stripped = query.strip()
    if not stripped:
        raise EmptyQueryError()
    return stripped


def embed_each(embedder: Embedder, queries: Sequence[str], *, solo: bool = False) -> list[np.ndarray | Exception]:
    """Each query's vector, or the error that query alone raises (too long for the model, text
    the tokenizer cannot take): a bad query never fails the others. The queries that pass the
    check go through the model in one call; if that call fails, each is embedded alone.
    `solo`: through the embedder's solo session, where it has one (OnnxEmbedder)."""
    out: list[np.ndarray | Exception | None] = [None] * len(queries)
    checked: list[tuple[int, str]] = []
    for i, query in enumerate(queries):
        try:
            checked.append((i, embedder.check_query(query)))
        except Exception as exc:  # noqa: BLE001 - the query's own error, returned as its answer
            out[i] = exc
    if not checked:
        return out  # type: ignore[return-value]
    try:
        vectors = np.asarray(embedder.embed([q for _, q in checked], solo=solo), dtype=np.float32)
        for (i, _), vector in zip(checked, vectors):
            out[i] = vector
    except Exception as exc:  # noqa: BLE001
        if len(checked) == 1:
            out[checked[0][0]] = exc
            return out  # type: ignore[return-value]
        for i, query in checked:
            try:
                out[i] = np.asarray(embedder.embed([query], solo=solo), dtype=np.float32)[0]
            except Exception as exc:  # noqa: BLE001
                out[i] = exc
    return out  # type: ignore[return-value]


def l2_normalize(vectors: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    np.maximum(norms, 1e-12, out=norms)
    return (vectors / norms).astype(np.float32, copy=False)


class OnnxEmbedder:
    """A BERT-style sentence encoder run with ONNX Runtime: mean pooling, then L2 norm.

    `solo_threads` (more than `threads`): a second session over the same model file with that
    many threads, spinning only while it runs, for a query that has the machine to itself
    (`embed(..., solo=True)`; serve/activity.py says when). With prepacked weights both sessions
    read one mapped copy of them. Outputs do not depend on the session: 1 and 2 threads gave the
    same bits on all 300 SciFact test queries (and in tests/unit/test_embedder.py)."""

    provider = "local"

    def __init__(
        self,
        model_dir: Path,
        *,
        name: str = "all-MiniLM-L6-v2",
        max_length: int = 256,
        batch_size: int = DEFAULT_BATCH_SIZE,
        threads: int = 1,
        spinning: bool = True,
        prepacked_dir: Path | None = None,
        solo_threads: int = 0,
    ) -> None:
        model_dir = Path(model_dir)
        for required in ("model.onnx", "tokenizer.json"):
            if not (model_dir / required).is_file():
                raise ModelError(
                    f"embedding model folder {model_dir} has no {required}; remove the folder "
                    "and run again to re-export it"
                )
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.name = name
        self.model_dir = model_dir
        self.max_length = max_length
        self.batch_size = batch_size
        self.threads = threads

        self._counter = load_tokenizer(model_dir / "tokenizer.json", None)
        self._tokenizer = load_tokenizer(model_dir / "tokenizer.json", max_length)
        # check_query's encodings, taken by tokenize: a query is tokenized once, not twice (the
        # untruncated encoding of a text within max_length is the truncating tokenizer's too)
        self._checked: dict[str, Any] = {}
        self._session = create_session(model_dir / "model.onnx", threads, spinning, prepacked_dir)
        self.solo_threads = solo_threads if solo_threads > threads else 0
        self._solo_session = self._session
        if self.solo_threads:
            self._solo_session = create_session(
                model_dir / "model.onnx", self.solo_threads, True, prepacked_dir, stop_spinning=True
            )
        self._input_names = {i.name for i in self._session.get_inputs()}
        self.dim = int(self._session.get_outputs()[0].shape[-1])

    @property
    def tokenizer(self):
        """A `tokenizers.Tokenizer` without truncation or padding (for counting and chunking)."""
        return self._counter

    def info(self) -> dict[str, object]:
        return {"name": self.name, "provider": self.provider, "dim": self.dim, "max_length": self.max_length}

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        """Tokens per text including the special tokens, without truncation."""
        return [len(e.ids) for e in self._counter.encode_batch(list(texts))]

    def check_query(self, query: str) -> str:
        stripped = check_query_text(query)
        encoding = self._counter.encode(stripped)
        if len(encoding.ids) > self.max_length:
            raise QueryTooLongError(len(encoding.ids), self.max_length)
        if len(self._checked) >= _CHECKED_KEPT:  # queries checked here but embedded elsewhere
            self._checked.clear()
        self._checked[stripped] = encoding
        return stripped

    # tokenize -> run -> pool
    def tokenize(self, texts: Sequence[str]) -> EncodedBatch:
        texts = list(texts)
        found = [self._checked.pop(text, None) for text in texts]
        missing = [text for text, encoding in zip(texts, found) if encoding is None]
        if missing:
            fresh = iter(self._tokenizer.encode_batch(missing))
            found = [next(fresh) if encoding is None else encoding for encoding in found]
        return pad_encodings(found)

    def run(self, batch: EncodedBatch, *, solo: bool = False) -> np.ndarray:
        session = self._solo_session if solo else self._session
        return session.run(None, batch.feeds(self._input_names))[0]

    @staticmethod
    def pool(hidden: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        mask = attention_mask.astype(np.float32)[:, :, None]
        summed = (hidden * mask).sum(axis=1)
        counts = np.maximum(mask.sum(axis=1), 1e-9)
        return l2_normalize(summed / counts)

    def embed(self, texts: Sequence[str], *, solo: bool = False) -> np.ndarray:
        """Embed texts in batches of similar length; rows come back in input order. `solo`:
        through the solo session (the usual one where there is none)."""
        texts = list(texts)
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        if not texts:
            return out
        lengths = np.array([len(t) for t in texts])
        order = np.argsort(-lengths, kind="stable")
        for start in range(0, len(texts), self.batch_size):
            rows = order[start : start + self.batch_size]
            batch = self.tokenize([texts[i] for i in rows])
            out[rows] = self.pool(self.run(batch, solo=solo), batch.attention_mask)
        return out


class OpenAIEmbedder:
    """OpenAI's embeddings endpoint through the official SDK; `dimensions` shortens vectors."""

    provider = "openai"

    def __init__(
        self,
        *,
        model: str,
        api_key: str,
        dimensions: int | None = None,
        base_url: str | None = None,
        timeout_s: float = 30.0,
        batch_size: int = 256,
        max_length: int = 8191,
    ) -> None:
        from openai import OpenAI

        self.name = model
        self.dimensions = dimensions
        self.max_length = max_length
        self.batch_size = batch_size
        self._client = OpenAI(api_key=api_key, base_url=base_url, timeout=timeout_s, max_retries=2)
        self.dim = dimensions if dimensions is not None else _OPENAI_DIMS.get(model, 0)

    def info(self) -> dict[str, object]:
        return {"name": self.name, "provider": self.provider, "dim": self.dim, "max_length": self.max_length}

    def check_query(self, query: str) -> str:
        return check_query_text(query)

    def embed(self, texts: Sequence[str], *, solo: bool = False) -> np.ndarray:
        """`solo` is accepted and ignored: the model runs elsewhere."""
        texts = list(texts)
        rows: list[list[float]] = []
        for start in range(0, len(texts), self.batch_size):
            kwargs: dict[str, object] = {"model": self.name, "input": texts[start : start + self.batch_size]}
            if self.dimensions is not None:
                kwargs["dimensions"] = self.dimensions
            response = self._client.embeddings.create(**kwargs)
            rows.extend(item.embedding for item in sorted(response.data, key=lambda d: d.index))
        if not rows:
            return np.empty((0, self.dim), dtype=np.float32)
        vectors = l2_normalize(np.asarray(rows, dtype=np.float32))
        self.dim = int(vectors.shape[1])
        return vectors


_OPENAI_DIMS = {"text-embedding-3-small": 1536, "text-embedding-3-large": 3072, "text-embedding-ada-002": 1536}


def local_model_dir(models_dir: Path) -> Path:
    return Path(models_dir) / "all-MiniLM-L6-v2-onnx"


def ensure_local_model(models_dir: Path) -> Path:
    """Export the bundled MiniLM to ONNX under `models_dir` once; return the folder.

    A folder exported by an earlier version the slower way (models/export.py: ENCODER_ATTENTION)
    is exported again in its place where it can be (torch installed, as the first export needs;
    a writable folder), else used as it is, with a warning: its vectors are the same model's,
    within 1.2e-7. Processes that find it at once (Serve replicas, Ray Data actors) take turns
    on a lock file beside it; the first exports, the others find its export current."""
    import fcntl

    from llmframe_ray.models.export import bundled_minilm_path, export_encoder, is_complete, is_current_export

    target = local_model_dir(models_dir)
    if is_current_export(target):
        return target
    if not is_complete(target):
        return export_encoder(bundled_minilm_path(), target)
    try:
        with open(target.parent / f".{target.name}.lock", "a+b") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if is_current_export(target):  # another process exported it while this one waited
                return target
            return export_encoder(bundled_minilm_path(), target, replace=True)
    except Exception as exc:  # noqa: BLE001 - the older export still embeds correctly
        logger.warning("%s is an older, slower export of the embedding model; it stays in use because it "
                       "cannot be exported again here (%s: %s)", target, type(exc).__name__, exc)
        return target if is_complete(target) else ensure_local_model(models_dir)


class EmbeddingProvider(str, enum.Enum):
    LOCAL = "local"
    OPENAI = "openai"


@dataclass(frozen=True)
class OpenAIEmbeddingParams:
    """A hosted OpenAI embedding model (`api_key` is never shown in a repr)."""

    model: str = "text-embedding-3-small"
    api_key: str | None = field(default=None, repr=False)
    dimensions: int | None = None
    base_url: str | None = None
    timeout_s: float = 30.0


@dataclass(frozen=True)
class EmbedderParams:
    """Which embedder to load and how. `threads` None: every core this process may use (a Serve
    replica sets it to the CPUs it was given)."""

    provider: EmbeddingProvider = EmbeddingProvider.LOCAL
    models_dir: Path = Path("models")
    max_length: int = 256
    batch_size: int = DEFAULT_BATCH_SIZE
    threads: int | None = None
    spinning: bool = True  # ONNX Runtime's idle threads spin-wait (runtime.create_session)
    openai: OpenAIEmbeddingParams | None = None
    # threads of the solo session, for a query alone on the machine (OnnxEmbedder); None: every
    # core this process may use; made only where `load_embedder(..., solo=True)` asks for it
    solo_threads: int | None = None

    def with_threads(self, threads: int) -> EmbedderParams:
        return replace(self, threads=threads)


def load_embedder(params: EmbedderParams, *, solo: bool = False) -> Embedder:
    """The embedder `params` ask for; `solo`: with a solo session of `params.solo_threads`
    when that is more than its own threads (OnnxEmbedder)."""
    if params.provider is EmbeddingProvider.OPENAI:
        hosted = params.openai or OpenAIEmbeddingParams()
        return OpenAIEmbedder(
            model=hosted.model,
            api_key=hosted.api_key,
            dimensions=hosted.dimensions,
            base_url=hosted.base_url,
            timeout_s=hosted.timeout_s,
        )
    return OnnxEmbedder(
        ensure_local_model(params.models_dir),
        max_length=params.max_length,
        batch_size=params.batch_size,
        threads=available_threads(params.threads),
        spinning=params.spinning,
        prepacked_dir=Path(params.models_dir) / PREPACKED_DIR,
        solo_threads=available_threads(params.solo_threads) if solo else 0,
    )
