"""Token-aware recursive chunking, sized in the embedding model's own tokens.

A document's text is cut into units: paragraphs (split at blank lines); a paragraph over the
budget into sentences; a sentence over the budget into words; a word over the budget into
character pieces that each fit. Consecutive units are then packed greedily into chunks.

Packing adds up the units' token counts. That is exact when the tokenizer never forms a token
across whitespace, as BERT WordPiece does (its pre-tokenizer splits on whitespace and
punctuation, and whitespace yields no tokens), because units are always separated by
whitespace in the text. Every chunk is then counted for real; a chunk for which the sum was wrong
(another tokenizer, or character pieces of one word rejoined) is split in two until it fits.

Token counting happens in a few batched `count_many` calls per `chunk_many` call (one per
splitting level, one for titles and one to check the chunks), never once per unit; only a word
longer than the whole budget is measured piece by piece.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Iterable, Protocol, Sequence

from llmframe_ray.types import Chunk, Document

_PARAGRAPH_BREAK = re.compile(r"\n\s*\n")
_SENTENCE_END = re.compile(r"[.!?]+[\"'”’»)\]]*\s+")
_SENTENCE_OPENERS = "\"'“‘«(["
_WORD = re.compile(r"\S+")

_PARAGRAPH, _SENTENCE, _WORD_LEVEL, _PIECE = 0, 1, 2, 3


class TokenCounter(Protocol):
    """Counts tokens of many texts at once, special tokens excluded."""

    def count_many(self, texts: Sequence[str]) -> list[int]: ...


class HFTokenCounter:
    """Counts with a Hugging Face `tokenizers.Tokenizer` (copied; truncation and padding off)."""

    def __init__(self, tokenizer: object) -> None:
        from tokenizers import Tokenizer

        if not isinstance(tokenizer, Tokenizer):
            raise TypeError(f"expected a tokenizers.Tokenizer, got {type(tokenizer).__name__}")
        own = Tokenizer.from_str(tokenizer.to_str())
        own.no_truncation()
        own.no_padding()
        self._tokenizer = own

    @classmethod
    def from_file(cls, path: str) -> HFTokenCounter:
        """Load a `tokenizer.json` file."""
        from tokenizers import Tokenizer

        return cls(Tokenizer.from_file(str(path)))

    def count_many(self, texts: Sequence[str]) -> list[int]:
        if not texts:
            return []
        encodings = self._tokenizer.encode_batch(list(texts), add_special_tokens=False)
        return [len(e.ids) for e in encodings]


class WhitespaceTokenCounter:
    """Counts whitespace-separated words: for tests, and for use without a model."""

    def count_many(self, texts: Sequence[str]) -> list[int]:
        return [len(text.split()) for text in texts]


@dataclass(slots=True)
class _Unit:
    doc: int
    start: int
    end: int
    level: int
    tokens: int = -1


class Chunker:
    """Cuts documents into overlapping chunks of at most `chunk_size` tokens.

    `chunk_size` counts everything the embedder sees: `special_tokens` (2 for BERT's [CLS] and
    [SEP]), the title line and the body. The body budget is chunk_size - special_tokens -
    tokens(title + "\\n"), but never less than chunk_size // 2: a title longer than that is still
    carried, and then (only then) a chunk's `n_tokens` may exceed `chunk_size`.

    A chunk after the first starts with the trailing whole units of the previous chunk whose
    tokens add up to at most `overlap` (never the whole previous chunk). `n_tokens` is the real
    count of `indexed_text` plus `special_tokens`. Chunk ids are
    f"{doc_id}#{position}-{blake2b(text, digest_size=4).hexdigest()}".
    """

    def __init__(
        self, counter: TokenCounter, chunk_size: int, overlap: int, special_tokens: int = 2
    ) -> None:
        for name, value in (
            ("chunk_size", chunk_size),
            ("overlap", overlap),
            ("special_tokens", special_tokens),
        ):
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"{name} must be an integer, got {value!r}")
        if special_tokens < 0:
            raise ValueError(f"special_tokens must be >= 0, got {special_tokens}")
        if chunk_size < 2 * special_tokens + 2:
            raise ValueError(
                f"chunk_size must be at least {2 * special_tokens + 2} "
                f"(2 * special_tokens + 2), got {chunk_size}"
            )
        if overlap < 0:
            raise ValueError(f"overlap must be >= 0, got {overlap}")
        if 2 * overlap >= chunk_size - special_tokens:
            raise ValueError(
                f"overlap must be less than half of chunk_size - special_tokens "
                f"({chunk_size - special_tokens}), got {overlap}"
            )
        self.counter = counter
        self.chunk_size = chunk_size
        self.overlap = overlap
        self.special_tokens = special_tokens

    def chunk(self, doc: Document) -> list[Chunk]:
        """The chunks of one document, positions 0..n-1; [] when its text is blank."""
        return self.chunk_many([doc])[0]

    def chunk_many(self, docs: Iterable[Document]) -> list[list[Chunk]]:
        """Chunk many documents with batched token counting; one list per document, in order."""
        docs = list(docs)
        title_tokens = self._count_titles(docs)
        budgets = [
            max(self.chunk_size - self.special_tokens - t, self.chunk_size // 2)
            for t in title_tokens
        ]
        units = self._units(docs, budgets)
        spans = [self._pack(doc_units, budgets[i]) for i, doc_units in enumerate(units)]
        limits = [self.special_tokens + t + b for t, b in zip(title_tokens, budgets)]
        measured = self._fit(docs, units, spans, limits)
        return [self._build(doc, units[i], measured[i]) for i, doc in enumerate(docs)]

    def _count(self, texts: list[str]) -> list[int]:
        counts = list(self.counter.count_many(texts))
        if len(counts) != len(texts):
            raise ValueError(f"token counter returned {len(counts)} counts for {len(texts)} texts")
        return counts

    def _count_titles(self, docs: list[Document]) -> list[int]:
        titled = [i for i, d in enumerate(docs) if d.title]
        counts = self._count([f"{docs[i].title}\n" for i in titled])
        tokens = [0] * len(docs)
        for i, n in zip(titled, counts):
            tokens[i] = n
        return tokens

    def _units(self, docs: list[Document], budgets: list[int]) -> list[list[_Unit]]:
        """Split every document down to units that fit their budget, counting level by level."""
        items = [
            _Unit(d, s, e, _PARAGRAPH)
            for d, doc in enumerate(docs)
            for s, e in _spans(doc.text, _PARAGRAPH_BREAK, 0, len(doc.text))
        ]
        while True:
            todo = [u for u in items if u.tokens < 0]
            if not todo:
                break
            counts = self._count([docs[u.doc].text[u.start : u.end] for u in todo])
            for unit, n in zip(todo, counts):
                unit.tokens = n
            expanded: list[_Unit] = []
            for unit in items:
                if unit.tokens <= budgets[unit.doc] or unit.level == _PIECE:
                    expanded.append(unit)
                else:
                    expanded.extend(self._split(docs[unit.doc].text, unit, budgets[unit.doc]))
            items = expanded
        per_doc: list[list[_Unit]] = [[] for _ in docs]
        for unit in items:
            per_doc[unit.doc].append(unit)
        return per_doc

    def _split(self, text: str, unit: _Unit, budget: int) -> list[_Unit]:
        """Children of an over-budget unit at the next level that actually divides it."""
        level = unit.level
        while level < _WORD_LEVEL:
            level += 1
            if level == _SENTENCE:
                spans = _sentence_spans(text, unit.start, unit.end)
            else:
                spans = list(_word_spans(text, unit.start, unit.end))
            if len(spans) > 1:
                return [_Unit(unit.doc, s, e, level) for s, e in spans]
        return self._hard_split(text, unit, budget)

    def _hard_split(self, text: str, unit: _Unit, budget: int) -> list[_Unit]:
        """Cut one word into the longest character pieces that fit (binary search per piece)."""
        pieces = []
        start = unit.start
        while start < unit.end:
            lo, hi = start + 1, unit.end
            fits = self._count([text[start:hi]])[0]
            if fits <= budget:
                lo = hi
            else:
                fits = self._count([text[start:lo]])[0]
                while hi - lo > 1:
                    mid = (lo + hi) // 2
                    n = self._count([text[start:mid]])[0]
                    if n <= budget:
                        lo, fits = mid, n
                    else:
                        hi = mid
            pieces.append(_Unit(unit.doc, start, lo, _PIECE, fits))
            start = lo
        return pieces

    def _pack(self, units: list[_Unit], budget: int) -> list[tuple[int, int]]:
        """Greedy packing into [first, last) unit ranges, with overlap carried over."""
        spans: list[tuple[int, int]] = []
        n = len(units)
        first = nxt = 0
        while nxt < n:
            total = sum(u.tokens for u in units[first:nxt])
            while first < nxt and total + units[nxt].tokens > budget:
                total -= units[first].tokens
                first += 1
            total += units[nxt].tokens
            nxt += 1
            while nxt < n and total + units[nxt].tokens <= budget:
                total += units[nxt].tokens
                nxt += 1
            spans.append((first, nxt))
            tail, carried = nxt, 0
            while tail - 1 > first and carried + units[tail - 1].tokens <= self.overlap:
                tail -= 1
                carried += units[tail].tokens
            first = tail
        return spans

    def _fit(
        self,
        docs: list[Document],
        units: list[list[_Unit]],
        spans: list[list[tuple[int, int]]],
        limits: list[int],
    ) -> list[list[tuple[int, int, int]]]:
        """Count every chunk for real; halve any span over its limit until all fit."""
        pending = [(d, a, b) for d, doc_spans in enumerate(spans) for a, b in doc_spans]
        done: list[list[tuple[int, int, int]]] = [[] for _ in docs]
        while pending:
            texts = []
            for d, a, b in pending:
                body = docs[d].text[units[d][a].start : units[d][b - 1].end]
                texts.append(f"{docs[d].title}\n{body}" if docs[d].title else body)
            counts = self._count(texts)
            retry = []
            for (d, a, b), n in zip(pending, counts):
                total = n + self.special_tokens
                if total > limits[d] and b - a > 1:
                    mid = (a + b) // 2
                    retry.extend([(d, a, mid), (d, mid, b)])
                else:
                    done[d].append((a, b, total))
            pending = retry
        for doc_spans in done:
            doc_spans.sort()
        return done

    def _build(
        self, doc: Document, units: list[_Unit], spans: list[tuple[int, int, int]]
    ) -> list[Chunk]:
        chunks = []
        for position, (a, b, n_tokens) in enumerate(spans):
            start, end = units[a].start, units[b - 1].end
            text = doc.text[start:end]
            digest = hashlib.blake2b(text.encode("utf-8"), digest_size=4).hexdigest()
            chunks.append(
                Chunk(
                    chunk_id=f"{doc.doc_id}#{position}-{digest}",
                    doc_id=doc.doc_id,
                    position=position,
                    text=text,
                    title=doc.title,
                    start=start,
                    end=end,
                    n_tokens=n_tokens,
                )
            )
        return chunks


def _spans(text: str, separator: re.Pattern[str], start: int, end: int) -> list[tuple[int, int]]:
    """Pieces of text[start:end] between separator matches, trimmed of whitespace, non-empty."""
    spans = []
    cut = start
    for match in separator.finditer(text, start, end):
        spans.extend(_trimmed(text, cut, match.start()))
        cut = match.end()
    spans.extend(_trimmed(text, cut, end))
    return spans


def _trimmed(text: str, start: int, end: int) -> list[tuple[int, int]]:
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return [(start, end)] if start < end else []


def _sentence_spans(text: str, start: int, end: int) -> list[tuple[int, int]]:
    """Sentences: cut after . ! ? (and closing quotes) + whitespace + an upper-case letter,
    digit or opening quote."""
    spans = []
    cut = start
    for match in _SENTENCE_END.finditer(text, start, end):
        after = match.end()
        if after >= end:
            break
        nxt = text[after]
        if nxt.isupper() or nxt.isdigit() or nxt in _SENTENCE_OPENERS:
            spans.extend(_trimmed(text, cut, after))
            cut = after
    spans.extend(_trimmed(text, cut, end))
    return spans


def _word_spans(text: str, start: int, end: int) -> Iterable[tuple[int, int]]:
    return (m.span() for m in _WORD.finditer(text, start, end))
