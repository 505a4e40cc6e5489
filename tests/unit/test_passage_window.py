"""A long passage read through its best-matching window (models/passage_window.py)."""

import pytest

from llmframe_ray.models.passage_window import PassageWindow, sentences
from llmframe_ray.models.runtime import load_tokenizer
from llmframe_ray.models.export import bundled_minilm_path

FILLER = [f"Filler sentence number {i} talks about weather and nothing else at all." for i in range(12)]
TITLE = "Coastal notes"
ANSWER = "Spring tides happen when the Sun and the Moon line up."


@pytest.fixture(scope="module")
def window():
    return PassageWindow(load_tokenizer(bundled_minilm_path() / "tokenizer.json", 96), 96)


FULL = load_tokenizer(bundled_minilm_path() / "tokenizer.json", 4096)  # counts, never cuts


def pair_tokens(window, query, passage):
    return len(FULL.encode(query, passage).ids)


def test_a_passage_that_fits_is_left_alone(window):
    passage = f"{TITLE}\n{FILLER[0]} {ANSWER}"
    assert window.fit("when are spring tides", passage) == passage


def test_the_sentences_that_match_the_query_are_kept_with_the_title(window):
    passage = f"{TITLE}\n" + " ".join(FILLER + [ANSWER])
    query = "when do spring tides happen"
    assert pair_tokens(window, query, passage) > 96  # the head would lose the answer
    fitted = window.fit(query, passage)
    assert fitted.startswith(f"{TITLE}\n") and fitted.endswith(ANSWER)
    assert pair_tokens(window, query, fitted) <= 96
    # whole sentences, in their order, as many as fit
    body = sentences(fitted.partition("\n")[2])
    assert body == FILLER[len(FILLER) - len(body) + 1:] + [ANSWER]
    assert pair_tokens(window, query, f"{TITLE}\n" + " ".join([FILLER[len(FILLER) - len(body)], *body])) > 96


def test_stems_match_and_stopwords_do_not(window):
    passage = " ".join(FILLER[:6] + ["The tide is lowest at the new moon.", *FILLER[6:]])
    fitted = window.fit("the tides", passage)  # "tides" -> "tide"; "the" counts for nothing
    assert "The tide is lowest at the new moon." in fitted
    assert pair_tokens(window, "the tides", fitted) <= 96


def test_no_match_keeps_the_head(window):
    passage = f"{TITLE}\n" + " ".join(FILLER)
    fitted = window.fit("volcanic ash", passage)
    assert fitted.startswith(f"{TITLE}\n{FILLER[0]} {FILLER[1]}")
