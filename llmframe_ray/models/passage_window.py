"""The part of a long passage that a cross-encoder reads: its best-matching window.

A (query, passage) pair longer than the model's max length is cut. Cut at the head (the
tokenizer's truncation), a passage loses its end, where the sentence that settles the query may
be. `PassageWindow.fit` keeps the passage's title and the run of whole sentences that fits the
token budget and holds the most distinct query terms (BM25's analysis: lowercased, English
stopwords dropped, stemmed); ties go to the earliest run, so a passage whose end does not match
better keeps its head. A passage that fits is left as it is.
"""

from __future__ import annotations

import re
from typing import Any

from llmframe_ray.index.sparse import Analyzer, stopword_list

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def sentences(text: str) -> list[str]:
    """The text's sentences (split after . ! or ? and whitespace), stripped, none empty."""
    return [s.strip() for s in _SENTENCE_END.split(text) if s.strip()]


class PassageWindow:
    """Fits passages to `max_length` tokens of (query, passage) for one tokenizer."""

    def __init__(self, tokenizer: Any, max_length: int) -> None:
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.analyzer = Analyzer("english", stopword_list("en"))
        alone = self._count(["a"])[0]
        self.specials = len(tokenizer.encode("a", "a").ids) - 2 * alone  # [CLS], [SEP]s of a pair

    def _count(self, texts: list[str]) -> list[int]:
        return [len(e.ids) for e in self.tokenizer.encode_batch(texts, add_special_tokens=False)]

    def fit(self, query: str, passage: str) -> str:
        title, newline, text = passage.partition("\n")
        if not newline:  # no title line
            title, text = "", passage
        parts = sentences(text)
        counts = self._count([query, title, *parts]) if title else self._count([query, "", *parts])
        room = self.max_length - self.specials - counts[0] - counts[1]
        lengths = counts[2:]
        if sum(lengths) <= room or room <= 0 or len(parts) < 2:
            return passage
        wanted = set(self.analyzer.terms(query))
        hits = [wanted & set(self.analyzer.terms(s)) for s in parts]
        best, best_span, end, used = -1, (0, 1), 0, 0
        for start in range(len(parts)):  # the longest run from each start that fits (two pointers)
            if end < start:
                end, used = start, 0
            while end < len(parts) and used + lengths[end] <= room:
                used += lengths[end]
                end += 1
            found = len(set().union(*hits[start:end])) if end > start else len(hits[start])
            if found > best:
                best, best_span = found, (start, max(end, start + 1))
            if end > start:
                used -= lengths[start]
        start, stop = best_span
        window = " ".join(parts[start:stop])
        return f"{title}\n{window}" if title else window
