"""Entities of a passage, offline: no model, no key, deterministic.

No package registry ships a trained English NER or noun-phrase model (spaCy's pipelines are
downloaded from release pages at run time), so the offline extractor reads surface cues:

    title      the chunk's document title (without a trailing "(...)" qualifier): what the
               chunk is about; also a gazetteer, found wherever another chunk names it
    name       a run of capitalised words inside a sentence ("Shirley Temple Black"), joined
               by "of" / "de" / "von" ...; a single capitalised word only where it does not
               start the sentence, and never a function word
    quoted     a short phrase in double quotes with a capitalised word ("A Date with Judy")
    phrase     a run of two to four lower-case content words ("insulin resistance")

Every surface form is normalised to a key (`entity_key`): lower case, a leading article and a
possessive 's dropped, each word stemmed; forms with the same key are one entity. A query is
read the same way, and also matched against every known entity by its word n-grams
(`NameMatcher`), so "the film Kiss and Tell" finds the entity titled "Kiss and Tell (1945 film)"
although "and" breaks the capitalised run.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Mapping

from llmframe_ray.graph.params import NAME, QUOTED, TITLE
from llmframe_ray.retrieve.words import FUNCTION_WORDS, stem, stem_words

# Types, in the order that a form seen with several keeps the first (a title beats a name).
PHRASE = "phrase"
TYPES = (TITLE, QUOTED, NAME, PHRASE)

MAX_NGRAM = 6  # longest entity key matched by word n-grams
MAX_NAME_WORDS = 6
MAX_QUOTED_WORDS = 8
PHRASE_WORDS = (2, 4)

_SEGMENT = re.compile(r"[.!?;:,()\[\]{}\"“”«»–—/|]+|\s['‘’]|['‘’]\s|\n\s*\n")  # ... or a paragraph break
_TOKEN = re.compile(r"[^\W_]+(?:['’.\-&][^\W_]+)*")
_QUOTED = re.compile(r"[\"“]([^\"“”]{2,80})[\"”]")
_QUALIFIER = re.compile(r"\s*\([^()]*\)\s*$")
_ARTICLES = {"the", "a", "an"}
# Capitalised by convention, not names of things a passage is about.
_CALENDAR = frozenset(
    "january february march april may june july august september october november december "
    "monday tuesday wednesday thursday friday saturday sunday".split()
)
_CONNECTORS = {"of", "de", "del", "della", "der", "den", "van", "von", "da", "du", "la", "le", "al", "el", "y"}


@dataclass(frozen=True)
class Mention:
    """One entity mentioned in a text: its key, the surface form seen, and the form's type."""

    key: str
    surface: str
    type: str


def entity_key(surface: str) -> str:
    """The normalised key of a surface form ("" when nothing is left)."""
    tokens = [t.lower().replace("’", "'") for t in _TOKEN.findall(surface)]
    if tokens and tokens[0] in _ARTICLES and len(tokens) > 1:
        tokens = tokens[1:]
    if tokens and tokens[-1].endswith("'s"):
        tokens[-1] = tokens[-1][:-2]
    return " ".join(stem(t) for t in tokens if t)


def title_surface(title: str) -> str:
    """A document title as an entity name: "Kiss and Tell (1945 film)" -> "Kiss and Tell"."""
    return _QUALIFIER.sub("", title).strip() or title.strip()


def _capitalised(token: str) -> bool:
    return token[:1].isupper() or (token[:1].isdigit() and any(c.isalpha() for c in token))


def _names(tokens: list[str]) -> Iterable[list[str]]:
    """Runs of capitalised tokens of one segment (connectors allowed inside a run)."""
    run: list[str] = []
    for position, token in enumerate(tokens + [""]):
        if token and _capitalised(token):
            run.append(token)
            continue
        if token.lower() in _CONNECTORS and run and position + 1 < len(tokens) and _capitalised(tokens[position + 1]):
            run.append(token)
            continue
        if run:
            yield run
        run = []


def _phrases(tokens: list[str]) -> Iterable[list[str]]:
    """Runs of lower-case content words (two to four of them; longer runs split)."""
    run: list[str] = []
    for token in tokens + [""]:
        lower = token.lower()
        if token and token.islower() and lower not in FUNCTION_WORDS and len(lower) > 2:
            run.append(token)
            continue
        low, high = PHRASE_WORDS
        for start in range(0, len(run), high):
            piece = run[start : start + high]
            if len(piece) >= low:
                yield piece
        run = []


class OfflineExtractor:
    """Entities of passages and queries by surface cues (module docstring)."""

    name = "offline-v3"  # a graph built by another version is rebuilt (graph/build.py)

    def extract(self, text: str, title: str = "") -> list[Mention]:
        """The distinct entities of a passage (by key, first type seen wins), in order."""
        found: dict[str, Mention] = {}

        def add(surface: str, type_: str) -> None:
            key = entity_key(surface)
            if not key or key in FUNCTION_WORDS or len(key) < 2 or key.isdigit() or surface.lower() in _CALENDAR:
                return
            if key not in found:
                found[key] = Mention(key, surface.strip(), type_)

        if title.strip():
            add(title_surface(title), TITLE)
        for quoted in _QUOTED.findall(text):  # a title of a work, not scare quotes ("useful")
            if len(quoted.split()) <= MAX_QUOTED_WORDS and any(_capitalised(t) for t in _TOKEN.findall(quoted)):
                add(quoted, QUOTED)
        for segment in _SEGMENT.split(_QUOTED.sub(" . ", text)):  # a quoted title is one entity
            tokens = _TOKEN.findall(segment)
            for run in _names(tokens):
                while run and run[-1].lower() in _CONNECTORS:
                    run = run[:-1]
                if not run:
                    continue
                starts_segment = run[0] == tokens[0]
                if len(run) == 1 and (starts_segment or run[0].lower() in FUNCTION_WORDS):
                    continue
                if starts_segment and run[0].lower() in FUNCTION_WORDS:
                    run = run[1:]  # "The Beatles" keeps "Beatles"; "In Paris" keeps "Paris"
                if run and len(run) <= MAX_NAME_WORDS:
                    add(" ".join(run), NAME)
            for run in _phrases(tokens):
                add(" ".join(run), PHRASE)
        return list(found.values())


def _segments(text: str) -> Iterable[tuple[list[str], list[str]]]:
    """(tokens, their stems) of each segment of `text` (no n-gram crosses a segment)."""
    stemmer = stem_words()
    for segment in _SEGMENT.split(text):
        tokens = _TOKEN.findall(segment)
        yield tokens, stemmer([t.lower().replace("’", "'") for t in tokens])


def key_ngrams(text: str, max_n: int = MAX_NGRAM) -> Iterable[tuple[int, int, str, bool]]:
    """(start, length, key, capitalised) for every word n-gram of `text` (n <= max_n) inside
    one segment; `capitalised`: its first word is written with a capital."""
    offset = 0
    for tokens, stems in _segments(text):
        for start in range(len(stems)):
            capital = _capitalised(tokens[start])
            for n in range(1, min(max_n, len(stems) - start) + 1):
                yield offset + start, n, " ".join(stems[start : start + n]), capital
        offset += len(stems) + 1


class NameMatcher:
    """Known entity keys (key -> id), read for in texts by word n-grams (`match`). With
    `prefixes` it also holds every proper word prefix of the keys, so a scan extends an n-gram
    only while some key starts with it: most words start none, and cost a lookup or two, not
    MAX_NGRAM joins and lookups (half the time of a graph build's linking pass; about 13 MiB for SciFact's
    111,562 names, so a served graph ranker, which reads a few short queries, goes without).
    One-word keys match only when written with a capital, and only those in `single` where it
    is given (a one-word entity "Film" must not match every "film")."""

    def __init__(self, known: Mapping[str, int], single: Mapping[str, int] | None = None, *, prefixes: bool = True) -> None:
        self.known = known
        self.one_word = known if single is None else single
        self.prefixes: set[str] | None = None
        if prefixes:
            self.prefixes = set()
            for key in known:
                cut = key.rfind(" ")
                while cut > 0 and key[:cut] not in self.prefixes:
                    self.prefixes.add(key[:cut])
                    cut = key.rfind(" ", 0, cut)

    def match(self, text: str) -> list[int]:
        """Ids of the known entities named in `text`, the longest match first at each position,
        and no shorter match inside a longer one, in the order of their positions."""
        known, one_word, prefixes = self.known, self.one_word, self.prefixes
        best: list[tuple[int, int, int]] = []  # (start, length, id), by start
        offset = 0
        for tokens, stems in _segments(text):
            size = len(stems)
            for start in range(size):
                key = stems[start]
                found = None
                if key in one_word and _capitalised(tokens[start]):
                    found = (offset + start, 1, one_word[key])
                end = start + 1
                while (prefixes is None or key in prefixes) and end < size and end - start < MAX_NGRAM:
                    key = key + " " + stems[end]
                    end += 1
                    if key in known:
                        found = (offset + start, end - start, known[key])
                if found is not None:
                    best.append(found)
            offset += size + 1
        out: list[int] = []
        covered_until = -1
        for start, n, entity in best:
            if start + n - 1 <= covered_until:
                continue
            covered_until = start + n - 1
            if entity not in out:
                out.append(entity)
        return out


def match_known(text: str, known: Mapping[str, int], *, single: Mapping[str, int] | None = None) -> list[int]:
    """The known entities named in one text (`NameMatcher.match`, without a prefix set: for
    one text, building it costs more than it saves); hold a NameMatcher to read many."""
    return NameMatcher(known, single, prefixes=False).match(text)
