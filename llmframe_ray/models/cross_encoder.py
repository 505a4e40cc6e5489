"""ONNX cross-encoder runtime: scores (query, passage) pairs read together.

A model directory holds `model.onnx` (fp32), optionally `model.int8.onnx` (dynamically
quantised), `tokenizer.json`, and optionally `config.json` / `reranker.json` (our model card,
which records the maximum length the model was trained with). Calls split into
tokenize -> run -> postprocess so that a server can batch the middle step across requests.

int8 runs one pair at a time. Dynamic quantisation scales each MatMul's input by the range of
the whole tensor, so in a batch a pair's score depends on the other pairs (and their padding):
the same pair moved by up to 0.5 (score spread 1.8) between batches of 1, 8 and 32 on SciFact
pairs. Alone, a pair always gets the same score; `threads` pairs run at once, one thread each,
which was also faster here (3-layer model, 128 tokens, 2 cores: 194 pairs/s against 174 for
batches of 32 on 2 threads and 111 for one pair on 2 threads).

With `cache_size` > 0 the scores of the last pairs scored are kept (ScoreCache): a repeated
query's passages are not run again. A pair alone (int8) always scores the same, so a kept score
is the one the model would give; fp32 batches can differ from it in the last bits. With
`window`, a passage too long for the pair reads its best-matching sentences (passage_window.py).
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Sequence

import numpy as np

from llmframe_ray.errors import ModelError
from llmframe_ray.models.passage_window import PassageWindow
from llmframe_ray.models.runtime import EncodedBatch, create_session, load_tokenizer, pad_encodings
from llmframe_ray.types import Choice

CARD_FILE = "reranker.json"
ONNX_FILES = {"fp32": "model.onnx", "int8": "model.int8.onnx"}
# ONNX Runtime's SkipLayerNormalization fusion over a quantised graph ran at about 420 us per
# (190 tokens x 384) node here, against a few tens for the Add and LayerNormalization it
# replaces: int8 pairs ran 1.1-1.2x faster without it (README "Reranking", pair costs)
INT8_SKIPPED_FUSIONS = ("SkipLayerNormFusion",)
DEFAULT_MAX_LENGTH = 512


class Precision(Choice):
    FP32 = "fp32"
    INT8 = "int8"
    AUTO = "auto"  # int8 where the folder has its quantised file (a trained model), else fp32

    def resolved(self, model_dir: Path, onnx_file: str | None) -> Precision:
        if self is not Precision.AUTO:
            return self
        has_int8 = onnx_file is None and (Path(model_dir) / ONNX_FILES["int8"]).is_file()
        return Precision.INT8 if has_int8 else Precision.FP32


def read_card(model_dir: Path) -> dict:
    """The model card written by `train-reranker` ({} for models made elsewhere)."""
    path = Path(model_dir) / CARD_FILE
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ModelError(f"cannot read the model card {path}: {exc}") from exc


class DigestCache:
    """Values by a 128-bit digest of their texts, at most `capacity`, the least recently used
    dropped first; safe to share between threads. `what` and `unit` name the cache and its entries."""

    what, unit = "digest cache", "entry"

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"a {self.what} holds at least 1 {self.unit}, got capacity {capacity}")
        self.capacity = capacity
        self.hits = 0
        self.misses = 0
        self._values: OrderedDict[bytes, object] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._values)

    def get_many(self, keys: Sequence[bytes]) -> list:
        """The value kept for each key, None where there is none (counted as hits and misses)."""
        with self._lock:
            found = [self._values.get(k) for k in keys]
            for k, value in zip(keys, found):
                if value is not None:
                    self._values.move_to_end(k)
            hits = sum(value is not None for value in found)
            self.hits += hits
            self.misses += len(keys) - hits
        return found

    def put_many(self, keys: Sequence[bytes], values: Sequence) -> None:
        with self._lock:
            for k, value in zip(keys, values):
                self._values[k] = self.stored(value)
                self._values.move_to_end(k)
            while len(self._values) > self.capacity:
                self._values.popitem(last=False)

    @staticmethod
    def stored(value):
        return value


class ScoreCache(DigestCache):
    """Scores of (query, passage) pairs (DigestCache)."""

    what, unit = "score cache", "pair"
    stored = staticmethod(float)

    @staticmethod
    def key(query: str, passage: str) -> bytes:
        q = query.encode("utf-8", "surrogatepass")
        digest = hashlib.blake2b(len(q).to_bytes(8, "little"), digest_size=16)
        digest.update(q)
        digest.update(passage.encode("utf-8", "surrogatepass"))
        return digest.digest()

    def stats(self) -> dict[str, int]:
        return {"cache_hits": self.hits, "cache_misses": self.misses, "cache_pairs": len(self)}


class CrossEncoder:
    """Relevance scores for (query, passage) pairs from an ONNX sequence classifier."""

    form_note = ""  # how the scores are made, beside the precision in reports (two_tower.py: " two towers")

    def __init__(
        self,
        model_dir: Path,
        *,
        precision: str | Precision = Precision.FP32,
        onnx_file: str | None = None,
        max_length: int | None = None,
        batch_size: int = 32,
        threads: int = 1,
        spinning: bool = True,
        prepacked_dir: Path | None = None,
        cache_size: int = 0,
        window: bool = False,
    ) -> None:
        self.model_dir = Path(model_dir)
        self.precision = Precision.from_str(precision).resolved(self.model_dir, onnx_file)
        onnx_path = self.model_dir / (onnx_file or ONNX_FILES[self.precision.value])
        missing = [p for p in (onnx_path, self.model_dir / "tokenizer.json") if not p.is_file()]
        if missing:
            names = ", ".join(p.name if p.parent == self.model_dir else str(p) for p in missing)
            raise ModelError(
                f"reranker model folder {self.model_dir} has no {names}; a model folder needs "
                "an ONNX file (model.onnx, or model.int8.onnx for int8) and tokenizer.json: "
                "download one with LLMFRAME_RERANKER_MODEL=<hub repo id>, or train one with "
                "`llmframe-ray train-reranker`"
            )
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.card = read_card(self.model_dir)
        if max_length is None:
            max_length = int(self.card.get("max_length", DEFAULT_MAX_LENGTH))
        self.max_length = max_length
        self.batch_size = batch_size
        self.threads = threads
        self._tokenizer = load_tokenizer(self.model_dir / "tokenizer.json", max_length)
        self.pair_by_pair = self.precision is Precision.INT8
        session_threads = 1 if self.pair_by_pair else threads
        skipped = INT8_SKIPPED_FUSIONS if self.pair_by_pair else ()
        self._session = create_session(onnx_path, session_threads, spinning, prepacked_dir, skipped_fusions=skipped)
        self._input_names = {i.name for i in self._session.get_inputs()}
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="rerank") if self.pair_by_pair and threads > 1 else None
        self.name = str(self.card.get("name") or self.model_dir.name)
        self.cache = ScoreCache(cache_size) if cache_size > 0 else None
        self.window = PassageWindow(self._tokenizer, max_length) if window else None

    def tokenize(self, query: str, passages: Sequence[str]) -> EncodedBatch:
        """Pairs truncated together (longest first) to `max_length` tokens."""
        return pad_encodings(self._tokenizer.encode_batch([(query, p) for p in passages]))

    def tokenize_pairs(self, pairs: Sequence[tuple[str, str]]) -> EncodedBatch:
        return pad_encodings(self._tokenizer.encode_batch([tuple(p) for p in pairs]))

    def run(self, batch: EncodedBatch) -> np.ndarray:
        return self._session.run(None, batch.feeds(self._input_names))[0]

    @staticmethod
    def postprocess(logits: np.ndarray) -> np.ndarray:
        """One score per pair: the single logit, or the log-odds of 'relevant' for a 2-class head."""
        logits = np.asarray(logits, dtype=np.float32)
        if logits.ndim == 1:
            return logits
        if logits.shape[1] == 1:
            return logits[:, 0]
        if logits.shape[1] == 2:
            return logits[:, 1] - logits[:, 0]
        raise ModelError(f"a reranker must output 1 or 2 logits per pair, this one gives {logits.shape[1]}")

    def score_pairs(self, pairs: Sequence[tuple[str, str]]) -> np.ndarray:
        """Scores in input order; pairs are run in batches of similar length (int8: one by one,
        `threads` at a time), those the cache holds not at all."""
        if self.cache is None or not pairs:
            return self._run_pairs(pairs)
        keys = [ScoreCache.key(q, p) for q, p in pairs]
        known = self.cache.get_many(keys)
        missing = [i for i, score in enumerate(known) if score is None]
        out = np.array([0.0 if score is None else score for score in known], dtype=np.float32)
        if missing:
            fresh = self._run_pairs([pairs[i] for i in missing])
            out[missing] = fresh
            self.cache.put_many([keys[i] for i in missing], fresh.tolist())
        return out

    def _run_pairs(self, pairs: Sequence[tuple[str, str]]) -> np.ndarray:
        if self.window is not None:  # long passages: their best-matching sentences, not their head
            pairs = [(query, self.window.fit(query, passage)) for query, passage in pairs]
        out = np.empty(len(pairs), dtype=np.float32)
        if not pairs:
            return out
        if self.pair_by_pair:
            def one(pair: tuple[str, str]) -> float:
                return float(self.postprocess(self.run(self.tokenize_pairs([pair])))[0])

            out[:] = list(self._pool.map(one, pairs)) if self._pool is not None else [one(p) for p in pairs]
            return out
        order = np.argsort(-np.array([len(q) + len(p) for q, p in pairs]), kind="stable")
        for start in range(0, len(pairs), self.batch_size):
            rows = order[start : start + self.batch_size]
            batch = self.tokenize_pairs([pairs[i] for i in rows])
            out[rows] = self.postprocess(self.run(batch))
        return out

    def score(self, query: str, passages: Sequence[str]) -> np.ndarray:
        return self.score_pairs([(query, p) for p in passages])


def rerank_order(scores: Sequence[float]) -> list[int]:
    """Positions sorted by score, highest first; equal scores keep their incoming order."""
    return sorted(range(len(scores)), key=lambda i: (-float(scores[i]), i))
