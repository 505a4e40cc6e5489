"""Sparse retrieval over one shard: BM25 (Lucene variant) scored by bm25s.

Text is analysed here, not by bm25s's tokenizer, so that queries never change any state: lower
case, split on the bm25s default pattern (runs of two or more word characters), drop stopwords,
then stem with PyStemmer. This gives the same terms as `bm25s.tokenize` with the same options.
The analyzer's settings, the resolved stopword list included, are saved with the index so that
queries are analysed exactly as the corpus was, whatever bm25s version reads the index later.

bm25s's "lucene" scores are idf * tf / (tf + k1 * (1 - b + b * len / avglen)) with
idf = ln(1 + (N - df + 0.5) / (df + 0.5)): Lucene 8+ drops the classic constant factor (k1 + 1),
which does not change any ranking. A query term repeated n times counts n times.
"""

from __future__ import annotations

import json
import re
import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping, Sequence

import bm25s
import numpy as np
import Stemmer

from llmframe_ray.index import atomic
from llmframe_ray.index.corpus import CorpusStats
from llmframe_ray.index.metadata import DEFAULT_NAMESPACE
from llmframe_ray.index.sparse_top import NO_MASK, bm25_top

METHODS = ("lucene",)
TOKEN_PATTERN = r"(?u)\b\w\w+\b"
_ANALYZER_FILE = "analyzer.json"
_LENGTHS_FILE = "doc_lengths.npy"


def stopword_list(name: str | None) -> list[str]:
    """The stopwords bm25s ships under `name` ("en", "english", "de", ...); [] for None."""
    if name is None:
        return []
    try:
        return sorted(set(bm25s.tokenization.Tokenizer(stopwords=name).stopwords))
    except ValueError as exc:
        raise ValueError(f"unknown stopword list {name!r}: {exc}") from None


@dataclass(frozen=True)
class SparseParams:
    """BM25 settings. `stemmer` is a PyStemmer algorithm name; `stopwords` a bm25s list name."""

    k1: float = 1.5
    b: float = 0.75
    method: str = "lucene"
    stemmer: str | None = "english"
    stopwords: str | None = "en"

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(
                f"unknown BM25 method {self.method!r}; valid methods: {', '.join(METHODS)}"
            )
        if not self.k1 > 0:
            raise ValueError(f"k1 must be positive, got {self.k1!r}")
        if not 0 <= self.b <= 1:
            raise ValueError(f"b must be between 0 and 1, got {self.b!r}")
        if self.stemmer is not None and self.stemmer not in Stemmer.algorithms():
            valid = ", ".join(Stemmer.algorithms())
            raise ValueError(f"unknown stemmer {self.stemmer!r}; valid stemmers: {valid}")
        stopword_list(self.stopwords)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SparseParams:
        return cls(**dict(data))


class Analyzer:
    """Text -> terms. Holds no mutable state but a per-thread stemmer (PyStemmer is not
    thread-safe), so one analyzer can serve concurrent queries."""

    def __init__(self, stemmer: str | None, stopwords: Sequence[str], lower: bool = True) -> None:
        self.stemmer_name = stemmer
        self.stopwords = frozenset(stopwords)
        self.lower = lower
        self._split = re.compile(TOKEN_PATTERN).findall
        self._local = threading.local()
        # analysers with equal keys give the same terms for any text
        self.key = (TOKEN_PATTERN, lower, stemmer, self.stopwords)

    def _stem(self, word: str) -> str:
        stemmer = getattr(self._local, "stemmer", None)
        if stemmer is None:
            stemmer = self._local.stemmer = Stemmer.Stemmer(self.stemmer_name)
        return stemmer.stemWord(word)

    def terms(self, text: str) -> list[str]:
        if self.lower:
            text = text.lower()
        words = [w for w in self._split(text) if w not in self.stopwords]
        if self.stemmer_name is None:
            return words
        return [self._stem(w) for w in words]

    def to_dict(self) -> dict[str, Any]:
        return {
            "pattern": TOKEN_PATTERN,
            "lower": self.lower,
            "stemmer": self.stemmer_name,
            "stopwords": sorted(self.stopwords),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Analyzer:
        if data["pattern"] != TOKEN_PATTERN:
            raise ValueError(f"unsupported token pattern {data['pattern']!r}")
        return cls(stemmer=data["stemmer"], stopwords=data["stopwords"], lower=data["lower"])


class SparseIndex:
    """BM25 over a list of texts; row i is `texts[i]`."""

    def __init__(
        self,
        bm25: bm25s.BM25,
        analyzer: Analyzer,
        params: SparseParams,
        doc_lengths: np.ndarray,
        corpus: Mapping[str, int] | None = None,
    ) -> None:
        self._bm25 = bm25
        self.analyzer = analyzer
        self.params = params
        self._doc_lengths = doc_lengths
        # {"n_docs", "n_tokens"} of the corpus the scores were computed for (None: written by
        # a release that scored every shard with its own statistics)
        self.corpus = MappingProxyType(dict(corpus)) if corpus is not None else None

    @property
    def corpus_wide(self) -> bool:
        """True when the scores use statistics of a corpus larger than this index."""
        return self.corpus is not None and self.corpus["n_docs"] != len(self)

    @classmethod
    def build(
        cls, texts: Sequence[str], params: SparseParams, corpus: CorpusStats | None = None,
        namespaces: Sequence[str] | None = None,
    ) -> SparseIndex:
        """Index `texts`. BM25's corpus statistics (document frequencies, document count, average
        length) are the texts' own, or `corpus`'s: the statistics of the whole corpus when the
        texts are one shard of it. Every shard scored with the same `corpus` ranks exactly as one
        index over all the texts would (see `corpus_wide`). `namespaces` (one per text; None:
        all default) scores each text with its namespace's statistics."""
        if len(texts) == 0:
            raise ValueError("cannot build a sparse index from zero texts")
        analyzer = Analyzer(params.stemmer, stopword_list(params.stopwords))
        vocab: dict[str, int] = {}
        corpus_ids = []
        for text in texts:
            corpus_ids.append([vocab.setdefault(t, len(vocab)) for t in analyzer.terms(text)])
        lengths = np.array([len(ids) for ids in corpus_ids], dtype=np.int64)
        spaces = np.asarray(namespaces if namespaces is not None else [DEFAULT_NAMESPACE] * len(texts), dtype=object)
        if len(spaces) != len(texts):
            raise ValueError(f"{len(texts)} texts but {len(spaces)} namespaces")
        groups = {ns: np.flatnonzero(spaces == ns) for ns in sorted(set(spaces.tolist()))}
        own = CorpusStats.of_namespaces({
            ns: _own_stats([corpus_ids[i] for i in rows], vocab, lengths[rows]) for ns, rows in groups.items()
        })
        if corpus is None:
            corpus = own
        else:
            for ns in groups:
                _check_covers(corpus.of_namespace(ns), own.of_namespace(ns))
        bm25 = bm25s.BM25(k1=params.k1, b=params.b, method=params.method)
        bm25.scores = _lucene_matrix(corpus_ids, vocab, lengths, corpus, params, spaces)
        bm25.vocab_dict = vocab
        bm25.unique_token_ids_set = set(vocab.values())
        bm25.nonoccurrence_array = None  # Lucene BM25 scores only the terms a document holds
        return cls(bm25, analyzer, params, lengths, corpus_info(corpus))

    def __len__(self) -> int:
        return int(self._bm25.scores["num_docs"])

    @property
    def n_tokens(self) -> int:
        """Total length of the indexed texts, in analysed terms."""
        return int(np.sum(self._doc_lengths))

    def term_ids(self, query: str) -> list[int]:
        """The query's terms that occur in the corpus, as vocabulary ids (repeats kept)."""
        return self._vocab_ids(self.analyzer.terms(query))

    def _vocab_ids(self, terms: Sequence[str]) -> list[int]:
        vocab = self._bm25.vocab_dict
        return [vocab[t] for t in terms if t in vocab]

    def search(self, queries: Sequence[str], k: int) -> list[list[tuple[int, float]]]:
        """Per query, up to `k` (row, score) pairs with a positive score, best first.

        Ties are broken by row, ascending. A query with no term in the corpus (only stopwords,
        only unknown words, or empty) gets [].
        """
        return [list(zip(rows.tolist(), scores.tolist())) for rows, scores in self.search_arrays(queries, k)]

    def search_arrays(
        self, queries: Sequence[str], k: int, allowed: np.ndarray | None = None
    ) -> list[tuple[np.ndarray, np.ndarray]]:
        """`search` as (rows int64, scores) arrays per query; with `allowed` (a bool array over
        the rows), the best of the allowed rows only."""
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"k must be a positive integer, got {k!r}")
        if isinstance(queries, str):
            raise ValueError("queries must be a sequence of strings, not one string")
        return [self.top_of_terms(self.analyzer.terms(query), k, allowed) for query in queries]

    def postings(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, Mapping[str, int]]:
        """The score matrix as CSC arrays (data, row indices, column pointers; one column per
        term) and the vocabulary (term -> column), as `top_of_terms` reads them."""
        matrix = self._bm25.scores
        data, indices, indptr = (np.asarray(matrix[key]) for key in ("data", "indices", "indptr"))
        return data, indices, indptr, MappingProxyType(self._bm25.vocab_dict)

    def top_of_terms(
        self, terms: Sequence[str], k: int, allowed: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """The best `min(k, len(self))` rows (with a positive score) for a query already
        analysed into `terms` (by this index's analyzer, or one with the same `key`); with
        `allowed`, among the rows it marks true only (an exact filter: never fewer than `k` rows
        while enough allowed rows score)."""
        matrix = self._bm25.scores
        data, indices, indptr = (np.asarray(matrix[key]) for key in ("data", "indices", "indptr"))
        ids = np.asarray(self._vocab_ids(terms), dtype=np.int64)
        mask = NO_MASK if allowed is None else np.asarray(allowed, dtype=np.bool_)
        return bm25_top(data, indices, indptr, len(self), ids, min(k, len(self)), mask)

    def stats(self, namespaces: Sequence[str] | None = None) -> CorpusStats:
        """Document count, total length and per-term document frequencies (computed here), by
        namespace when `namespaces` (one per row) names any but the default."""
        matrix = self._bm25.scores
        indptr = np.asarray(matrix["indptr"])
        lengths = np.asarray(self._doc_lengths)
        # Column t of the score matrix has one entry per document holding term t (Lucene idf is
        # always positive, so no entry is zero).
        if namespaces is None or set(namespaces) <= {DEFAULT_NAMESPACE}:
            counts = np.diff(indptr)
            freqs = {term: int(counts[tid]) for term, tid in self._bm25.vocab_dict.items()}
            return CorpusStats(len(self), int(np.sum(lengths)), freqs)
        spaces = np.asarray(namespaces, dtype=object)
        columns = np.repeat(np.arange(len(indptr) - 1), np.diff(indptr))
        rows = np.asarray(matrix["indices"])
        parts = {}
        for ns in sorted(set(spaces.tolist())):
            mine = spaces == ns
            counts = np.bincount(columns[mine[rows]], minlength=len(indptr) - 1)
            freqs = {term: int(counts[tid]) for term, tid in self._bm25.vocab_dict.items() if counts[tid]}
            parts[ns] = CorpusStats(int(mine.sum()), int(lengths[mine].sum()), freqs)
        return CorpusStats.of_namespaces(parts)

    def save(self, directory: str | Path) -> None:
        """Write the index files into `directory` (created when missing).

        Each file is complete once written, but the set is not switched atomically:
        `IndexShard.save` provides that for a whole shard.
        """
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self._bm25.save(directory, show_progress=False)
        atomic.write_array(directory / _LENGTHS_FILE, np.asarray(self._doc_lengths))
        atomic.write_json(
            directory / _ANALYZER_FILE,
            {
                "analyzer": self.analyzer.to_dict(),
                "params": self.params.to_dict(),
                "corpus": dict(self.corpus) if self.corpus is not None else None,
            },
        )

    @classmethod
    def load(cls, directory: str | Path, *, mmap: bool = True) -> SparseIndex:
        """Read an index written by `save`; with `mmap` the score arrays are memory-mapped."""
        directory = Path(directory)
        saved = json.loads((directory / _ANALYZER_FILE).read_text(encoding="utf-8"))
        analyzer = Analyzer.from_dict(saved["analyzer"])
        params = SparseParams.from_dict(saved["params"])
        bm25 = bm25s.BM25.load(directory, mmap=mmap, load_corpus=False, show_progress=False)
        lengths = np.load(directory / _LENGTHS_FILE, mmap_mode="r" if mmap else None)
        return cls(bm25, analyzer, params, lengths, saved.get("corpus"))


def corpus_info(stats: CorpusStats) -> dict[str, Any]:
    info: dict[str, Any] = {"n_docs": stats.n_docs, "n_tokens": stats.n_tokens}
    if stats.parts:
        info["namespaces"] = {ns: {"n_docs": p.n_docs, "n_tokens": p.n_tokens} for ns, p in stats.parts.items()}
    return info


def _own_stats(corpus_ids: list[list[int]], vocab: dict[str, int], lengths: np.ndarray) -> CorpusStats:
    counts = np.zeros(len(vocab), dtype=np.int64)
    for ids in corpus_ids:
        counts[np.unique(np.asarray(ids, dtype=np.int64))] += 1
    return CorpusStats(len(corpus_ids), int(lengths.sum()), dict(zip(vocab, counts.tolist())))


def _check_covers(corpus: CorpusStats, own: CorpusStats) -> None:
    """`corpus` must include the texts being indexed (a superset of their statistics)."""
    if corpus.n_docs < own.n_docs or corpus.n_tokens < own.n_tokens:
        raise ValueError(
            f"corpus statistics ({corpus.n_docs} documents, {corpus.n_tokens} terms) do not include "
            f"these texts ({own.n_docs} documents, {own.n_tokens} terms)"
        )
    for term, df in own.doc_freqs.items():
        if corpus.doc_freqs.get(term, 0) < df:
            raise ValueError(
                f"corpus statistics give term {term!r} a document frequency of "
                f"{corpus.doc_freqs.get(term, 0)}, below its {df} in these texts"
            )


def _lucene_matrix(
    corpus_ids: list[list[int]],
    vocab: dict[str, int],
    lengths: np.ndarray,
    corpus: CorpusStats,
    params: SparseParams,
    namespaces: np.ndarray,
) -> dict[str, Any]:
    """bm25s's eager score matrix (CSC: one column per term) with Lucene BM25 computed from
    `corpus`'s statistics: idf = ln(1 + (N - df + 0.5) / (df + 0.5)), tf saturation with
    the corpus average length, each row with its namespace's statistics. Each entry depends
    only on its own (tf, length, df, N, avg), so the same text gets the same entries in any
    shard layout."""
    import scipy.sparse as sp

    n_docs, n_vocab = len(corpus_ids), len(vocab)
    rows = np.repeat(np.arange(n_docs, dtype=np.int64), lengths)
    cols = np.fromiter((t for ids in corpus_ids for t in ids), dtype=np.int64, count=int(lengths.sum()))
    pairs, tf = np.unique(rows * max(n_vocab, 1) + cols, return_counts=True)
    rows, cols = pairs // max(n_vocab, 1), pairs % max(n_vocab, 1)
    tf = tf.astype(np.float64)
    values = np.empty(len(rows), dtype=np.float32)
    names, codes = np.unique(namespaces.astype(str), return_inverse=True)
    entry_codes = codes[rows]
    for code, ns in enumerate(names.tolist()):
        stats = corpus.of_namespace(ns)
        df = np.zeros(n_vocab, dtype=np.float64)
        for term, tid in vocab.items():
            df[tid] = stats.doc_freqs.get(term, 0)
        idf = np.log(1.0 + (stats.n_docs - df + 0.5) / (df + 0.5))
        norm = params.k1 * (1.0 - params.b + params.b * lengths / stats.avg_doc_length)
        mine = entry_codes == code if len(names) > 1 else slice(None)
        values[mine] = (idf[cols[mine]] * tf[mine] / (tf[mine] + norm[rows[mine]])).astype(np.float32)
    matrix = sp.csc_matrix((values, (rows, cols)), shape=(n_docs, n_vocab), dtype=np.float32)
    return {"data": matrix.data, "indices": matrix.indices, "indptr": matrix.indptr, "num_docs": n_docs}


def corpus_stats(texts: Sequence[str], params: SparseParams, namespaces: Sequence[str] | None = None) -> CorpusStats:
    """The BM25 statistics of one shard's texts, to be merged with the other shards' (the first
    of the two passes of a sharded build; see SparseIndex.build)."""
    return SparseIndex.build(list(texts), params, namespaces=namespaces).stats(namespaces)
