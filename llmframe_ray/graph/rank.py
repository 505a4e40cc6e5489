"""The graph ranker: a query's entities -> spreading activation over the graph -> ranked chunks.

    seeds     the entities the query names: the extractor's own reading of it, and every known
              entity whose key is one of its word n-grams (extract.NameMatcher); with
              `name_match` set, also the titles whose embedded names are closest to the query's
              embedding; each weighs its idf, log(1 + chunks / chunks naming it), the strongest
              `max_seeds` kept
    hop 1     each seed's weight spreads over the chunks naming it, in proportion to the
              mention weights (a chunk titled by the entity takes TITLE_WEIGHT shares)
    hop 2..   each reached chunk's activation spreads over the entities it names (in proportion
              to their idf), and from them over their chunks again, times `hop_decay` per hop

A chunk's score is its activation summed over hops 1..depth: a personalised-PageRank walk
cut at `depth` steps, computed for a batch of queries as sparse matrix products. The question
"the woman who portrayed Corliss Archer in Kiss and Tell" reaches the film's chunk at hop 1, and
through the actress the film names, her own chunk at hop 2, which no word of the question names.
Chunks that no seed reaches score nothing and are left out: a query that names no known entity
gets an empty list, so fused with other rankers it changes nothing.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import scipy.sparse as sp

from llmframe_ray.graph.extract import NAME, QUOTED, TITLE, NameMatcher, OfflineExtractor
from llmframe_ray.graph.params import GraphParams
from llmframe_ray.graph.store import KnowledgeGraph


def _row_normalised(matrix: sp.csr_matrix) -> sp.csr_matrix:
    sums = np.asarray(matrix.sum(axis=1)).ravel()
    inverse = np.divide(1.0, sums, out=np.zeros_like(sums, dtype=np.float64), where=sums > 0)
    return sp.csr_matrix(sp.diags(inverse) @ matrix)


class GraphRanker:
    def __init__(self, graph: KnowledgeGraph, params: GraphParams | None = None, extractor: OfflineExtractor | None = None) -> None:
        self.graph = graph
        self.params = params or GraphParams()
        self.extractor = extractor or OfflineExtractor()
        self.df = graph.document_frequency()
        self.idf = np.log1p(graph.n_chunks / np.maximum(self.df.astype(np.float64), 1.0))
        mentions = sp.csr_matrix(graph.mentions, dtype=np.float64)
        self.to_chunks = _row_normalised(sp.csr_matrix(mentions.T))  # entities x chunks
        self.to_entities = _row_normalised(sp.csr_matrix(mentions @ sp.diags(self.idf)))  # chunks x entities
        self.ids = graph.entity_ids()
        self.multi = {key: i for key, i in self.ids.items() if " " in key}
        self.single = {key: i for key, i in self.ids.items() if " " not in key and graph.types[i] in (TITLE, NAME, QUOTED)}
        self.matcher = NameMatcher(self.multi, self.single, prefixes=False)

    def named(self, query: str) -> list[int]:
        """Every known entity the query names, in the order found."""
        named = [self.ids[m.key] for m in self.extractor.extract(query) if m.key in self.ids]
        named.extend(self.matcher.match(query))
        return list(dict.fromkeys(named))

    def meant(self, vectors: np.ndarray | None) -> list[list[int]]:
        """Per query embedding: the seedable entities whose embedded names are closest to it, at
        least `name_match` (cosine), the `name_match_top` closest."""
        threshold, graph = self.params.name_match, self.graph
        if vectors is None or threshold is None or not len(graph.name_entities):
            return [[] for _ in range(0 if vectors is None else len(vectors))]
        similar = np.asarray(vectors, dtype=np.float32) @ graph.name_vectors.astype(np.float32).T
        top = min(self.params.name_match_top, similar.shape[1])
        out = []
        for row in similar:
            best = np.argpartition(-row, top - 1)[:top]
            best = best[row[best] >= threshold]
            out.append(graph.name_entities[best[np.argsort(-row[best], kind="stable")]].tolist())
        return out

    def seeds(self, query: str, meant: Sequence[int] = ()) -> dict[int, float]:
        """The query's entities of the seed types (named in it, or `meant` by its embedding) and
        their weights (idf), the strongest `max_seeds`."""
        types, keys, shortest = self.graph.types, self.graph.keys, self.params.min_name_words
        named = {
            e for e in [*self.named(query), *meant]
            if types[e] in self.params.seed_types and (types[e] != NAME or keys[e].count(" ") + 1 >= shortest)
            and (self.params.max_seed_chunks is None or self.df[e] <= self.params.max_seed_chunks)
        }
        ranked = sorted(named, key=lambda e: (-self.idf[e], e))[: self.params.max_seeds]
        return {e: float(self.idf[e]) for e in ranked}

    def scores(self, queries: list[str], vectors: np.ndarray | None = None) -> sp.csr_matrix:
        """Queries x chunk nodes: each chunk's activation (0: not reached). `vectors`: the
        queries' embeddings, for seeds by name embedding (`meant`)."""
        rows, cols, data = [], [], []
        meant = self.meant(vectors) if vectors is not None else [[] for _ in queries]
        for q, query in enumerate(queries):
            for entity, weight in self.seeds(query, meant[q]).items():
                rows.append(q)
                cols.append(entity)
                data.append(weight)
        start = sp.csr_matrix((data, (rows, cols)), shape=(len(queries), self.graph.n_entities), dtype=np.float64)
        reached = start @ self.to_chunks
        total = reached.copy()
        factor = 1.0
        for _ in range(self.params.depth - 1):
            factor *= self.params.hop_decay
            reached = (reached @ self.to_entities) @ self.to_chunks
            total = total + factor * reached
        return sp.csr_matrix(total)

    def search(self, queries: list[str], k: int, allowed: np.ndarray | None = None,
               vectors: np.ndarray | None = None) -> list[tuple[np.ndarray, np.ndarray]]:
        """Each query's top `k` chunk nodes and scores, best first (ties: the lower node);
        `allowed` (a bool per node) keeps the others out."""
        matrix = self.scores(queries, vectors)
        out = []
        for q in range(len(queries)):
            start, end = matrix.indptr[q], matrix.indptr[q + 1]
            nodes, values = matrix.indices[start:end], matrix.data[start:end]
            keep = values > 0
            if allowed is not None:
                keep &= allowed[nodes]
            nodes, values = nodes[keep], values[keep]
            order = np.lexsort((nodes, -values))[:k]
            out.append((nodes[order].astype(np.int64), values[order]))
        return out
