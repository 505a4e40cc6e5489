"""Token-aware recursive chunking, sized in the embedding model's own tokens.

A document's text is cut into units: paragraphs (split at blank lines); a paragraph over the
budget into sentences; a sentence over the budget into words; a word over the budget into
character pieces that each fit. Consecutive units are then packed greedily into chunks.

Packing adds up the units' token counts. For an *additive* counter that sum is the token count of
the units joined by whitespace. BERT WordPiece is additive: its pre-tokenizer splits at
whitespace and punctuation and whitespace yields no token, so no token spans two units. Units are
always separated by whitespace, except the character pieces of one long word. For an additive
counter, paragraph counts are the sums of their sentences' counts, so the text is tokenized about
once; only chunks where the sum may be wrong are counted again: pieces of one word side by side,
or whitespace BERT deletes (\x0b, \x0c, ...). For any other counter every chunk is counted again.
A chunk whose real count is over its limit is split in two until it fits.

Counting happens in a few batched `count_many` calls per `chunk_many` call (sentences,
paragraphs when not additive, words of long sentences, titles, checks), never once per unit;
only a word longer than the whole budget is measured piece by piece.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Iterable, Protocol, Sequence

from llmframe_ray.types import Chunk, Document, passage_text

_PARAGRAPH_BREAK = re.compile(r"\n\s*\n")
_SENTENCE_END = re.compile(r"[.!?]+[\"'”’»)\]]*\s+")
_SENTENCE_OPENERS = "\"'“‘«(["
_WORD = re.compile(r"\S+")
_ODD_WHITESPACE = re.compile(r"[^\S \t\n\r]")
_ADDITIVE_PRE_TOKENIZERS = frozenset({"BertPreTokenizer", "Whitespace", "WhitespaceSplit"})


class TokenCounter(Protocol):
    """Counts tokens of many texts at once, special tokens excluded.

    A counter may also have `additive = True` to promise that the count of texts joined by
    whitespace is the sum of their counts; without it, every chunk is counted again.
    """

    def count_many(self, texts: Sequence[str]) -> list[int]: ...


class HFTokenCounter:
    """Counts with a Hugging Face `tokenizers.Tokenizer` (copied; truncation and padding off).

    `additive` is true when the pre-tokenizer splits at whitespace (BERT, Whitespace).
    """

    def __init__(self, tokenizer: object) -> None:
        from tokenizers import Tokenizer

        if not isinstance(tokenizer, Tokenizer):
            raise TypeError(f"expected a tokenizers.Tokenizer, got {type(tokenizer).__name__}")
        config = tokenizer.to_str()
        own = Tokenizer.from_str(config)
        own.no_truncation()
        own.no_padding()
        self._tokenizer = own
        self._encode = getattr(own, "encode_batch_fast", own.encode_batch)
        pre = json.loads(config).get("pre_tokenizer") or {}
        self.additive = pre.get("type") in _ADDITIVE_PRE_TOKENIZERS

    @classmethod
    def from_file(cls, path: str) -> HFTokenCounter:
        """Load a `tokenizer.json` file."""
        from tokenizers import Tokenizer

        return cls(Tokenizer.from_file(str(path)))

    def count_many(self, texts: Sequence[str]) -> list[int]:
        if not texts:
            return []
        return [len(e.ids) for e in self._encode(list(texts), add_special_tokens=False)]


class WhitespaceTokenCounter:
    """Counts whitespace-separated words: for tests, and for use without a model."""

    additive = True

    def count_many(self, texts: Sequence[str]) -> list[int]:
        return [len(text.split()) for text in texts]


@dataclass(slots=True)
class _Unit:
    start: int
    end: int
    tokens: int


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
        given = {"chunk_size": chunk_size, "overlap": overlap, "special_tokens": special_tokens}
        for name, value in given.items():
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
        if chunk_size < 2 * special_tokens + 2:
            raise ValueError(
                f"chunk_size must be at least 2 * special_tokens + 2, got {chunk_size}"
            )
        if 2 * overlap >= chunk_size - special_tokens:
            raise ValueError(
                f"overlap must be less than (chunk_size - special_tokens) / 2 = "
                f"{(chunk_size - special_tokens) / 2:g}, got {overlap}"
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
        measured = self._fit(docs, units, spans, title_tokens, budgets)
        return [self._build(doc, units[i], measured[i]) for i, doc in enumerate(docs)]

    @property
    def _additive(self) -> bool:
        return getattr(self.counter, "additive", False) is True

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
        """Every document's units, in text order, each within its budget where possible."""
        paragraphs = [
            (d, s, e)
            for d, doc in enumerate(docs)
            for s, e in _paragraph_spans(doc.text)
        ]
        sentences = [_sentence_spans(docs[d].text, s, e) for d, s, e in paragraphs]
        flat = self._count(
            [docs[d].text[s:e] for (d, _, _), sents in zip(paragraphs, sentences) for s, e in sents]
        )
        sentence_tokens, at = [], 0
        for sents in sentences:
            sentence_tokens.append(flat[at : at + len(sents)])
            at += len(sents)
        additive = self._additive
        paragraph_tokens = [sum(c) if len(c) == 1 or additive else -1 for c in sentence_tokens]
        unknown = [i for i, n in enumerate(paragraph_tokens) if n < 0]
        measured = self._count([docs[paragraphs[i][0]].text[paragraphs[i][1] : paragraphs[i][2]]
                                for i in unknown])
        for i, n in zip(unknown, measured):
            paragraph_tokens[i] = n

        per_doc: list[list[_Unit | list[_Unit]]] = [[] for _ in docs]
        long_sentences: list[tuple[int, int, int, list[_Unit]]] = []
        for i, (d, s, e) in enumerate(paragraphs):
            if paragraph_tokens[i] <= budgets[d]:
                per_doc[d].append(_Unit(s, e, paragraph_tokens[i]))
                continue
            for (ss, se), n in zip(sentences[i], sentence_tokens[i]):
                if n <= budgets[d]:
                    per_doc[d].append(_Unit(ss, se, n))
                else:
                    slot: list[_Unit] = []
                    per_doc[d].append(slot)
                    long_sentences.append((d, ss, se, slot))
        self._split_words(docs, budgets, long_sentences)
        return [
            [u for item in items for u in (item if isinstance(item, list) else [item])]
            for items in per_doc
        ]

    def _split_words(
        self,
        docs: list[Document],
        budgets: list[int],
        long_sentences: list[tuple[int, int, int, list[_Unit]]],
    ) -> None:
        """Fill each long sentence's slot with its words, hard-splitting words over budget."""
        words = [(d, _word_spans(docs[d].text, s, e), slot) for d, s, e, slot in long_sentences]
        counts = iter(self._count([docs[d].text[a:b] for d, spans, _ in words for a, b in spans]))
        for d, spans, slot in words:
            for (a, b), n in zip(spans, counts):
                if n <= budgets[d]:
                    slot.append(_Unit(a, b, n))
                else:
                    slot.extend(self._hard_split(docs[d].text, a, b, budgets[d]))

    def _hard_split(self, text: str, start: int, end: int, budget: int) -> list[_Unit]:
        """Cut one word into the longest character pieces that fit (binary search per piece)."""
        pieces = []
        while start < end:
            lo, hi = start + 1, end  # a piece has at least one character, even if over budget
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if self._count([text[start:mid]])[0] <= budget:
                    lo = mid
                else:
                    hi = mid - 1
            pieces.append(_Unit(start, lo, self._count([text[start:lo]])[0]))
            start = lo
        return pieces

    def _pack(self, units: list[_Unit], budget: int) -> list[tuple[int, int]]:
        """Greedy packing into [first, last) unit ranges, with overlap carried over.

        The carried overlap is capped at half the budget: a long title can shrink the budget so
        far that a full `overlap` would leave each new chunk only a unit or two of new text.
        """
        spans: list[tuple[int, int]] = []
        overlap = min(self.overlap, budget // 2)
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
            while tail - 1 > first and carried + units[tail - 1].tokens <= overlap:
                tail -= 1
                carried += units[tail].tokens
            first = tail
        return spans

    def _fit(
        self,
        docs: list[Document],
        units: list[list[_Unit]],
        spans: list[list[tuple[int, int]]],
        title_tokens: list[int],
        budgets: list[int],
    ) -> list[list[tuple[int, int, int]]]:
        """(first, last, n_tokens) per chunk; a span counted over its limit is halved."""
        done: list[list[tuple[int, int, int]]] = [[] for _ in docs]
        pending = []
        for d, doc_spans in enumerate(spans):
            for a, b in doc_spans:
                if self._additive and not self._suspect(docs[d].text, units[d], a, b):
                    total = sum(u.tokens for u in units[d][a:b])
                    done[d].append((a, b, self.special_tokens + title_tokens[d] + total))
                else:
                    pending.append((d, a, b))
        while pending:
            texts = []
            for d, a, b in pending:
                body = docs[d].text[units[d][a].start : units[d][b - 1].end]
                texts.append(passage_text(docs[d].title, body))
            retry = []
            for (d, a, b), n in zip(pending, self._count(texts)):
                total = n + self.special_tokens
                if total > self.special_tokens + title_tokens[d] + budgets[d] and b - a > 1:
                    mid = (a + b) // 2
                    retry.extend([(d, a, mid), (d, mid, b)])
                else:
                    done[d].append((a, b, total))
            pending = retry
        for doc_spans in done:
            doc_spans.sort()
        return done

    @staticmethod
    def _suspect(text: str, units: list[_Unit], a: int, b: int) -> bool:
        """Whether the sum of unit counts may differ from the count of the chunk's text."""
        for i in range(a + 1, b):
            if units[i - 1].end == units[i].start:
                return True
        return _ODD_WHITESPACE.search(text, units[a].start, units[b - 1].end) is not None

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
                    metadata=doc.metadata,
                )
            )
        return chunks


def _paragraph_spans(text: str) -> list[tuple[int, int]]:
    """Stretches of text between blank lines, trimmed of whitespace, non-empty."""
    spans, cut = [], 0
    for match in _PARAGRAPH_BREAK.finditer(text):
        spans.extend(_trimmed(text, cut, match.start()))
        cut = match.end()
    return spans + _trimmed(text, cut, len(text))


def _trimmed(text: str, start: int, end: int) -> list[tuple[int, int]]:
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return [(start, end)] if start < end else []


def _sentence_spans(text: str, start: int, end: int) -> list[tuple[int, int]]:
    """Cut after . ! ? (and closing quotes or brackets), whitespace, then an upper-case letter,
    a digit or an opening quote or bracket."""
    spans, cut = [], start
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


def _word_spans(text: str, start: int, end: int) -> list[tuple[int, int]]:
    return [m.span() for m in _WORD.finditer(text, start, end)]


def sentences(text: str) -> list[str]:
    """The sentences of `text`, paragraph by paragraph, as the chunker cuts them."""
    return [text[a:b] for start, end in _paragraph_spans(text) for a, b in _sentence_spans(text, start, end)]
