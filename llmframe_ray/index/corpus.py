"""BM25 corpus statistics (document frequencies, counts, lengths) in a form shards add up."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping, Sequence

from llmframe_ray.index.metadata import DEFAULT_NAMESPACE


@dataclass(frozen=True)
class CorpusStats:
    """The corpus statistics BM25 depends on, in a form shards can add up.

    `doc_freqs` maps each analysed term (a stem when stemming) to the number of documents
    holding it; `n_tokens` is the total of the documents' lengths in terms. An index whose
    documents are all in the default namespace has no `parts`; one with other namespaces
    (tenants, index/metadata.py) keeps each namespace's statistics in `parts`, and each
    document is scored with its own namespace's, so no tenant's ranking depends on another's
    documents. The top-level numbers are then the totals.
    """

    n_docs: int
    n_tokens: int
    doc_freqs: Mapping[str, int] = field(default_factory=dict)
    parts: Mapping[str, CorpusStats] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "doc_freqs", MappingProxyType(dict(self.doc_freqs)))
        object.__setattr__(self, "parts", MappingProxyType(dict(self.parts)))

    def __reduce__(self):  # read-only mappings do not pickle (Ray passes these to tasks)
        parts = {ns: part for ns, part in self.parts.items()}
        return (type(self), (self.n_docs, self.n_tokens, dict(self.doc_freqs), parts))

    def of_namespace(self, namespace: str) -> CorpusStats:
        """The statistics documents of `namespace` are scored with."""
        if not self.parts:
            return self if namespace == DEFAULT_NAMESPACE else CorpusStats(0, 0, {})
        return self.parts.get(namespace, CorpusStats(0, 0, {}))

    def by_namespace(self) -> dict[str, CorpusStats]:
        if self.parts:
            return dict(self.parts)
        return {DEFAULT_NAMESPACE: self} if self.n_docs else {}

    @property
    def avg_doc_length(self) -> float:
        return self.n_tokens / self.n_docs if self.n_docs else 0.0

    @classmethod
    def merge(cls, parts: Sequence[CorpusStats]) -> CorpusStats:
        """The statistics of the union of disjoint corpora (namespace by namespace)."""
        freqs: dict[str, int] = {}
        for part in parts:
            for term, df in part.doc_freqs.items():
                freqs[term] = freqs.get(term, 0) + df
        spaces: dict[str, list[CorpusStats]] = {}
        if any(p.parts for p in parts):
            for part in parts:
                for ns, stats in part.by_namespace().items():
                    spaces.setdefault(ns, []).append(stats)
        return cls(
            n_docs=sum(p.n_docs for p in parts),
            n_tokens=sum(p.n_tokens for p in parts),
            doc_freqs=freqs,
            parts={ns: cls.merge(group) for ns, group in sorted(spaces.items())},
        )

    @classmethod
    def of_namespaces(cls, parts: Mapping[str, CorpusStats]) -> CorpusStats:
        """Totals plus `parts`; plain statistics when every document is in the default namespace."""
        parts = {ns: p for ns, p in parts.items() if p.n_docs}
        if set(parts) <= {DEFAULT_NAMESPACE}:
            return parts.get(DEFAULT_NAMESPACE, CorpusStats(0, 0, {}))
        total = cls.merge(list(parts.values()))
        return cls(total.n_docs, total.n_tokens, total.doc_freqs, parts)
