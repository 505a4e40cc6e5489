"""Retrieval strategies and `alpha`, the dense/sparse weight: the vocabulary of the API's
`retrieval_strategy` field and of the `retrieve_context` tool.

    hybrid      BM25 and dense retrieval fused by RRF
    dense       the embedding ranker alone
    sparse      BM25 alone
    compressed  hybrid, then contextual compression of the passages (retrieve/compress.py)
    graph       the knowledge graph's ranker alone (graph/rank.py)
    hybrid-graph  BM25, dense and the graph ranker fused by RRF (the graph weighs
                LLMFRAME_GRAPH_WEIGHT)
The graph strategies need a knowledge graph in the served index version (`llmframe-ray graph
build`); without one they are refused with GRAPH_MISSING.

`alpha` in [0, 1] sets the two rankers' RRF weights: dense 2 * alpha, BM25 2 * (1 - alpha). So
0.5 is the equal weighting (1, 1), 1 ranks by dense retrieval with BM25 only breaking ties among
what dense retrieval did not find, and 0 the other way round. RRF stays the fusion: `alpha` moves
each ranker's contribution 1 / (k + rank), never the scores themselves.
"""

from __future__ import annotations

from dataclasses import dataclass

from llmframe_ray.errors import QueryError
from llmframe_ray.types import Choice, SearchMode

BM25, DENSE = SearchMode.BM25.value, SearchMode.DENSE.value


class Strategy(Choice):
    HYBRID = "hybrid"
    DENSE = "dense"
    SPARSE = "sparse"
    GRAPH = "graph"
    HYBRID_GRAPH = "hybrid-graph"
    COMPRESSED = "compressed"

    @classmethod
    def label(cls) -> str:
        return "retrieval strategy"


_MODES = {
    Strategy.HYBRID: SearchMode.HYBRID,
    Strategy.DENSE: SearchMode.DENSE,
    Strategy.SPARSE: SearchMode.BM25,
    Strategy.COMPRESSED: SearchMode.HYBRID,
    Strategy.GRAPH: SearchMode.GRAPH,
    Strategy.HYBRID_GRAPH: SearchMode.HYBRID_GRAPH,
}

GRAPH_MISSING = (
    "'graph' and 'hybrid-graph' need a knowledge graph (entities, relations, communities) in the "
    "served index version, and it has none (build one with `llmframe-ray graph build`); use "
    "hybrid, dense, sparse or compressed"
)


class StrategyError(QueryError):
    """A strategy, mode or alpha that cannot be used as asked; `field` names the request field."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(message)

    def __reduce__(self):  # crosses process boundaries (a Serve replica's error) whole
        return (type(self), (self.field, str(self)))


@dataclass(frozen=True)
class Plan:
    """What a request's strategy comes to: the first-stage mode and whether passages are
    compressed before they are returned or answered from."""

    strategy: Strategy
    mode: SearchMode
    compress: bool


def resolve(strategy: str | None, mode: str | SearchMode | None, default_mode: SearchMode) -> Plan:
    """The plan for a request's `retrieval_strategy` and `mode` (either may be absent; both
    given must agree). Without either: the default mode."""
    if strategy is None:
        chosen = default_mode if mode is None else SearchMode.from_str(mode)
        return Plan(_strategy_of(chosen), chosen, False)
    try:
        named = Strategy.from_str(strategy)
    except ValueError as exc:
        raise StrategyError("retrieval_strategy", str(exc)) from None
    search_mode = _MODES[named]
    if mode is not None and SearchMode.from_str(mode) is not search_mode:
        raise StrategyError(
            "mode", f"mode {SearchMode.from_str(mode).value!r} contradicts retrieval_strategy {named.value!r} "
            f"(which searches with {search_mode.value!r}); send one of them"
        )
    return Plan(named, search_mode, named is Strategy.COMPRESSED)


def _strategy_of(mode: SearchMode) -> Strategy:
    return Strategy.SPARSE if mode is SearchMode.BM25 else Strategy(mode.value)


def alpha_weights(alpha: float) -> dict[str, float]:
    """RRF weights by ranker name for a dense/sparse weight `alpha` in [0, 1]."""
    if isinstance(alpha, bool) or not 0.0 <= float(alpha) <= 1.0:
        raise StrategyError("alpha", f"must be a number from 0 (BM25 only) to 1 (dense only), got {alpha!r}")
    return {DENSE: 2.0 * float(alpha), BM25: 2.0 * (1.0 - float(alpha))}
