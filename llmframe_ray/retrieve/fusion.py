"""Reciprocal Rank Fusion over any number of ranked lists.

score(key) = sum over lists L containing key of  w_L / (k + rank_L(key)),  rank 1-based.

Ties are broken by a stable rule, so the output never depends on dict or set order:
higher score first; then the better (smaller) best rank over all lists; then the key itself.
A key found by a single ranker keeps its contribution and survives fusion.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping, Sequence

from llmframe_ray.types import RankedList

DEFAULT_K = 60


@dataclass(frozen=True)
class FusedItem:
    key: str
    score: float
    ranks: Mapping[str, int] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "ranks", MappingProxyType(dict(self.ranks)))


def reciprocal_rank_fusion(
    lists: Sequence[RankedList],
    *,
    k: int = DEFAULT_K,
    weights: Sequence[float] | Mapping[str, float] | None = None,
    limit: int | None = None,
) -> list[FusedItem]:
    """Fuse ranked lists; `weights` is one number per list, or a mapping by list name."""
    if k < 0:
        raise ValueError(f"RRF k must be >= 0, got {k}")
    names = [lst.name for lst in lists]
    if len(set(names)) != len(names):
        raise ValueError(f"ranked lists must have distinct names, got {names}")
    list_weights = _resolve_weights(lists, weights)

    scores: dict[str, float] = {}
    ranks: dict[str, dict[str, int]] = {}
    for lst, weight in zip(lists, list_weights):
        for position, key in enumerate(lst.keys):
            rank = position + 1
            scores[key] = scores.get(key, 0.0) + weight / (k + rank)
            ranks.setdefault(key, {})[lst.name] = rank

    def order(key: str) -> tuple[float, int, str]:
        return (-scores[key], min(ranks[key].values()), key)

    fused = [FusedItem(key, scores[key], ranks[key]) for key in sorted(scores, key=order)]
    return fused if limit is None else fused[:limit]


def _resolve_weights(
    lists: Sequence[RankedList], weights: Sequence[float] | Mapping[str, float] | None
) -> list[float]:
    if weights is None:
        return [1.0] * len(lists)
    if isinstance(weights, Mapping):
        unknown = sorted(set(weights) - {lst.name for lst in lists})
        if unknown:
            raise ValueError(f"weights given for unknown ranked lists: {unknown}")
        resolved = [float(weights.get(lst.name, 1.0)) for lst in lists]
    else:
        resolved = [float(w) for w in weights]
        if len(resolved) != len(lists):
            raise ValueError(f"got {len(resolved)} weights for {len(lists)} ranked lists")
    negative = [w for w in resolved if w < 0]
    if negative:
        raise ValueError(f"RRF weights must be >= 0, got {negative}")
    return resolved
