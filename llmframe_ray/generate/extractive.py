"""Offline extractive answerer: quote the retrieved sentences that best match the question.

Used when no language-model provider is configured. Nothing is generated: the answer is a
preamble saying so, followed by sentences copied from the hits, each with a citation marker.

1. Split each hit's text into sentences: after `.`, `?` or `!` (and any closing quotes or
   brackets right after it) when whitespace follows, and at newlines. Fragments shorter than
   `min_sentence_chars` are dropped, unless that would leave the hit with none; then its
   longest fragment is kept.
2. Analyse the question and every sentence into terms: lowercase `\\w+` tokens, English stop
   words (bm25s `STOPWORDS_EN`) removed, then Snowball English stems (PyStemmer).
3. Score a sentence as the sum, over the distinct question terms it contains, of
   idf(t) = ln(1 + N / df(t)), where N is the number of candidate sentences over all hits and
   df(t) how many of them contain t; multiply by the rank prior 1 / log2(i + 2) of its hit
   (i = 0 for the best hit).
4. Keep the `max_sentences` best sentences that score above zero (ties: earlier hit, then
   earlier sentence) and quote them in reading order: by hit, then by position in the hit.
   When no sentence scores above zero, quote the first sentence of the best-ranked hit that
   has any text, and say that no passage contains the question's terms.
5. Number citations by first appearance in the text: the first hit quoted is [1], the next
   distinct hit [2], and so on. A citation's snippet is the hit's quoted sentences joined by a
   space, cut at a word boundary to at most `snippet_chars` characters, then "…" appended.

With no hits (or only hits without text) the answer says nothing was found, cites nothing and
has finish_reason "no_context".
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Iterator, Sequence

import Stemmer
from bm25s.stopwords import STOPWORDS_EN

from llmframe_ray.generate.prompts import snippet_of
from llmframe_ray.types import Answer, Citation, Hit

PREAMBLE = (
    "Extractive answer (no language model configured): "
    "the sentences below are quoted from the retrieved passages.\n\n"
)
NO_MATCH_PREAMBLE = (
    "Extractive answer (no language model configured): no retrieved passage contains the "
    "question's terms; the best-ranked passage begins:\n\n"
)
NO_CONTEXT_TEXT = "No relevant passages were found in the index for this question."

# A sentence ends after . ? or ! plus any closing quotes/brackets, when whitespace follows;
# a newline always ends one.
_SENTENCE_END = re.compile(r"[.?!][\"'”’»)\]}]*(?=\s)|\n")
_WORD = re.compile(r"\w+")
_STOPWORDS = frozenset(STOPWORDS_EN)


@dataclass(frozen=True)
class _Sentence:
    hit_index: int
    position: int
    text: str


@dataclass(frozen=True)
class _Plan:
    """Everything an answer is made of; `answer` and `stream` both render from one plan."""

    preamble: str
    quoted: tuple[tuple[str, int], ...]  # (sentence, citation number), in reading order
    citations: tuple[Citation, ...]
    finish_reason: str


def _split_sentences(text: str) -> list[str]:
    pieces: list[str] = []
    start = 0
    for match in _SENTENCE_END.finditer(text):
        pieces.append(text[start : match.end()])
        start = match.end()
    pieces.append(text[start:])
    return [piece.strip() for piece in pieces if piece.strip()]


def _render(plan: _Plan) -> Iterator[str]:
    """The answer text as deltas: the preamble, then one sentence with its marker per delta."""
    yield plan.preamble
    for k, (sentence, n) in enumerate(plan.quoted):
        yield f"{' ' if k else ''}{sentence} [{n}]"


class ExtractiveAnswerer:
    """Answers by quoting the best-matching retrieved sentences, with numbered citations."""

    provider = "extractive"
    model = "extractive-v1"

    def __init__(
        self, *, max_sentences: int = 3, min_sentence_chars: int = 20, snippet_chars: int = 240
    ) -> None:
        for name, value in (
            ("max_sentences", max_sentences),
            ("min_sentence_chars", min_sentence_chars),
            ("snippet_chars", snippet_chars),
        ):
            if value < 1:
                raise ValueError(f"{name} must be at least 1, got {value!r}")
        self.max_sentences = max_sentences
        self.min_sentence_chars = min_sentence_chars
        self.snippet_chars = snippet_chars
        self._stemmer = Stemmer.Stemmer("english")

    def answer(self, question: str, hits: Sequence[Hit]) -> Answer:
        """The whole answer at once; its text is what `stream` yields, joined."""
        return self._answer_of(self._plan(question, hits))

    def stream(self, question: str, hits: Sequence[Hit]) -> Iterator[str]:
        """The answer text in deltas. A blank question raises here, before any delta."""
        return _render(self._plan(question, hits))

    def events(self, question: str, hits: Sequence[Hit]) -> Iterator[str | Answer]:
        """The deltas of `stream`, then the complete Answer (with its citations).
        A blank question raises here, before any delta."""
        plan = self._plan(question, hits)

        def run() -> Iterator[str | Answer]:
            yield from _render(plan)
            yield self._answer_of(plan)

        return run()

    def _answer_of(self, plan: _Plan) -> Answer:
        return Answer(
            text="".join(_render(plan)),
            citations=plan.citations,
            provider=self.provider,
            model=self.model,
            finish_reason=plan.finish_reason,
        )

    def _plan(self, question: str, hits: Sequence[Hit]) -> _Plan:
        if not question.strip():
            raise ValueError("question must not be empty")
        sentences = [
            _Sentence(i, position, text)
            for i, hit in enumerate(hits)
            for position, text in enumerate(self._sentences_of(hit.text))
        ]
        if not sentences:
            return _Plan(NO_CONTEXT_TEXT, (), (), "no_context")
        scores = self._scores(question, sentences)
        ranked = sorted(
            ((score, s) for score, s in zip(scores, sentences) if score > 0),
            key=lambda pair: (-pair[0], pair[1].hit_index, pair[1].position),
        )
        chosen = sorted(
            (s for _, s in ranked[: self.max_sentences]),
            key=lambda s: (s.hit_index, s.position),
        )
        preamble = PREAMBLE
        if not chosen:
            preamble, chosen = NO_MATCH_PREAMBLE, [sentences[0]]
        numbers: dict[int, int] = {}
        for s in chosen:
            numbers.setdefault(s.hit_index, len(numbers) + 1)
        citations = tuple(
            Citation(
                n=n,
                doc_id=hits[i].doc_id,
                chunk_id=hits[i].chunk_id,
                title=hits[i].title,
                snippet=self._snippet(" ".join(s.text for s in chosen if s.hit_index == i)),
            )
            for i, n in numbers.items()
        )
        quoted = tuple((s.text, numbers[s.hit_index]) for s in chosen)
        return _Plan(preamble, quoted, citations, "stop")

    def _sentences_of(self, text: str) -> list[str]:
        fragments = _split_sentences(text)
        kept = [f for f in fragments if len(f) >= self.min_sentence_chars]
        if not kept and fragments:
            kept = [max(fragments, key=len)]  # the first of the longest
        return kept

    def _terms(self, text: str) -> set[str]:
        words = [w for w in _WORD.findall(text.lower()) if w not in _STOPWORDS]
        return set(self._stemmer.stemWords(words))

    def _scores(self, question: str, sentences: Sequence[_Sentence]) -> list[float]:
        query = self._terms(question)
        sentence_terms = [self._terms(s.text) for s in sentences]
        n = len(sentences)
        idf: dict[str, float] = {}
        for term in query:
            df = sum(term in terms for terms in sentence_terms)
            if df:
                idf[term] = math.log(1 + n / df)
        # Sum in sorted term order so the float result does not depend on set iteration order.
        return [
            sum(idf[t] for t in sorted(query & terms)) / math.log2(s.hit_index + 2)
            for s, terms in zip(sentences, sentence_terms)
        ]

    def _snippet(self, text: str) -> str:
        return snippet_of(text, self.snippet_chars)
