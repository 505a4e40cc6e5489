"""Words of a query or a passage as the rewriting and compression stages read them: lower-case
word tokens, English function words left out, Snowball stems for matching.

bm25s ships a 33-word English stopword list, right for ranking but too short to pick a query's
*content* words (question words, auxiliaries and pronouns would count as terms), so this
module keeps its own list of function words.
"""

from __future__ import annotations

import re
import threading
from typing import Callable

import Stemmer

WORD = re.compile(r"[^\W_]+(?:['’][^\W_]+)*")

FUNCTION_WORDS = frozenset(
    """
    a about above after again against all also am an and any are aren't as at be because been before
    being below between both but by can can't cannot could couldn't did didn't do does doesn't doing
    don't down during each either else even ever every few for from further had hadn't has hasn't
    have haven't having he he'd he'll he's her here here's hers herself him himself his how how's
    however i i'd i'll i'm i've if in into is isn't it it's its itself just let's like many may me
    might more most much must mustn't my myself neither no nor not now of off on once one only or
    other ought our ours ourselves out over own per rather same shall shan't she she'd she'll she's
    should shouldn't since so some such than that that's the their theirs them themselves then
    there there's these they they'd they'll they're they've this those though through thus to too
    under until up upon us very via was wasn't we we'd we'll we're we've were weren't what what's
    when when's where where's whether which while who who's whom whose why why's will with within
    without won't would wouldn't yet you you'd you'll you're you've your yours yourself yourselves
    tell show give find know name list explain describe please also anything something
    """.split()
)

_local = threading.local()  # PyStemmer objects are not meant to be shared between threads


def _stemmer() -> Stemmer.Stemmer:
    stemmer = getattr(_local, "stemmer", None)
    if stemmer is None:
        stemmer = _local.stemmer = Stemmer.Stemmer("english")
    return stemmer


def words(text: str) -> list[str]:
    """Every word of `text`, in order, as written (case kept)."""
    return WORD.findall(text)


def is_content(word: str) -> bool:
    """A word that says what the text is about: not a function word, and not a single
    lower-case letter (a single capital or digit counts: vitamin D, type 2)."""
    lower = word.lower().replace("’", "'")
    return lower not in FUNCTION_WORDS and (len(lower) > 1 or word.isupper() or word.isdigit())


def content_words(text: str) -> list[str]:
    return [w for w in words(text) if is_content(w)]


def stem(word: str) -> str:
    return _stemmer().stemWord(word.lower().replace("’", "'"))


def stem_words() -> Callable[[list[str]], list[str]]:
    """This thread's stemmer's list function: lower-case words -> their stems (as `stem`
    gives them, for words already lower-cased with ’ as ')."""
    return _stemmer().stemWords


def stems(text: str) -> list[str]:
    """The stems of `text`'s content words, in order (repeats kept)."""
    return [stem(w) for w in content_words(text)]
