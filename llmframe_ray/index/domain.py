"""What a corpus is about, as one vector: the mean direction of its chunk embeddings.

A reranker's model card keeps the centroid of the corpus it was trained on (train/run.py), and
a served index has its own; the cosine of the two tells how far the reranker is from home
(retrieve/rerank.py: domain_weight). Measured with all-MiniLM-L6-v2 on the bundled test
collections: SciFact against Medline 0.51 (both biomedical), against CISI, Cranfield and
HotpotQA -0.14 to -0.03.
"""

from __future__ import annotations

from typing import Any, Iterable, Iterator, Mapping, Sequence

import numpy as np

from llmframe_ray.index.shard import IndexShard
from llmframe_ray.index.versions import IndexDirectory

BLOCK_ROWS = 65536  # vectors read back at a time: bounded memory at any index size
SYNTHETIC = "synthetic"  # a card's data split when it was trained from pseudo-queries (train/synthetic.py)


def centroid(shards: Iterable[IndexShard | None]) -> np.ndarray | None:
    """The unit mean of every chunk vector of the shards (None: an empty shard), read back in
    blocks (any dense index kind: each keeps full vectors); None when there are none."""
    total, rows = np.zeros(0), 0
    for shard in shards:
        if shard is None:
            continue
        flat, n = shard.dense.flat_index(), len(shard.dense)
        for start in range(0, n, BLOCK_ROWS):
            count = min(BLOCK_ROWS, n - start)
            block = flat.reconstruct_n(start, count) if flat is not None else shard.dense.vectors(range(start, start + count))
            summed = block.sum(axis=0, dtype=np.float64)
            total = summed if not total.size else total + summed
            rows += count
    norm = float(np.linalg.norm(total)) if rows else 0.0
    return (total / norm).astype(np.float32) if norm > 0 else None


def card_domain(vector: np.ndarray | None, model: Mapping[str, Any]) -> dict[str, Any] | None:
    """The model card's record of a training corpus: its centroid and the embedding model."""
    if vector is None:
        return None
    return {"embedding_model": dict(model), "centroid": [round(float(x), 6) for x in vector]}


def similarity(card: Mapping[str, Any], vector: np.ndarray | None, model: Mapping[str, Any]) -> float | None:
    """Cosine of a card's training-corpus centroid and an index's; None when either is missing,
    they come from different embedding models (not comparable), or the card's model was
    trained without judgments (`--synthetic`): nothing showed it beating the first stage even
    at home (measured: below hybrid on Cranfield and CISI at any weight tried)."""
    domain = card.get("domain")
    if not isinstance(domain, Mapping) or vector is None or (card.get("data") or {}).get("split") == SYNTHETIC:
        return None
    theirs = domain.get("embedding_model") or {}
    if (theirs.get("name"), theirs.get("dim")) != (model.get("name"), model.get("dim")):
        return None
    home = np.asarray(domain.get("centroid", ()), dtype=np.float32)
    if home.shape != vector.shape or not np.linalg.norm(home):
        return None
    return float(home @ vector / np.linalg.norm(home))


def shards_similarity(card: Mapping[str, Any], shards: Sequence[IndexShard]) -> float | None:
    """`similarity` of a card and the shards held in this process (their centroid is read only
    when the card has a domain to compare it with)."""
    if not shards or not isinstance(card.get("domain"), Mapping):
        return None
    return similarity(card, centroid(shards), shards[0].manifest.model)


def version_centroid(index: IndexDirectory, version: str) -> tuple[np.ndarray | None, dict[str, Any]]:
    """A published version's centroid and embedding model, its shards read one at a time
    (memory-mapped), for a process that does not hold them all (a Serve Ingress)."""
    model: dict[str, Any] = {}

    def shards() -> Iterator[IndexShard | None]:
        for i in range(int(index.version_info(version)["shards"])):
            shard = index.load_shard(version, i)
            if shard is not None:
                model.update(shard.manifest.model)
            yield shard

    return centroid(shards()), model
