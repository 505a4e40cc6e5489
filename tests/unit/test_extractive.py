import dataclasses

import pytest

from llmframe_ray.generate.extractive import ExtractiveAnswerer
from llmframe_ray.types import Answer, Citation, Hit

PREAMBLE = (
    "Extractive answer (no language model configured): the sentences below are quoted "
    "from the retrieved passages.\n\n"
)
NO_MATCH = (
    "Extractive answer (no language model configured): no retrieved passage contains the "
    "question's terms; the best-ranked passage begins:\n\n"
)
NOTHING_FOUND = "No relevant passages were found in the index for this question."


def hit(i, text, title=""):
    return Hit(f"d{i}", f"d{i}#0", text, score=1.0 / i, rank=i, title=title)


HITS = [
    hit(1, "Glaciers store much of the fresh water on Earth. "
        "They form where snow accumulates over centuries.", "Glaciers"),
    hit(2, "Water boils at 100 degrees Celsius at sea level. "
        "At high altitude the boiling point is lower.", "Boiling"),
    hit(3, "Mount Everest is the highest mountain on Earth. "
        "Its summit sits above most of the atmosphere.", "Everest"),
    hit(4, "Pressure cookers raise the boiling point of water. "
        "Food therefore cooks faster inside them.", "Cookers"),
]
QUESTION = "Why is the boiling point of water lower at altitude?"
# Query terms: whi, boil, point, water, lower, altitud ("is", "the", "of", "at" are stop words).
# 8 candidate sentences. df: water 3, boil 3, point 2, lower 1, altitud 1, whi 0.
# idf: water = boil = ln(1 + 8/3) = 1.2993, point = ln 5 = 1.6094, lower = altitud = ln 9 = 2.1972.
#   hit 1 s0 (water)                           1.2993 / log2(2) = 1.2993
#   hit 2 s0 (water, boil)                     2.5986 / log2(3) = 1.6395
#   hit 2 s1 (altitud, boil, point, lower)     7.3031 / log2(3) = 4.6078
#   hit 4 s0 (boil, point, water)              4.2080 / log2(5) = 1.8123
# Top 3: hit 2 s1, hit 4 s0, hit 2 s0; hit 1 is left out, so hit 2 is cited as [1].
H2S0 = "Water boils at 100 degrees Celsius at sea level."
H2S1 = "At high altitude the boiling point is lower."
H4S0 = "Pressure cookers raise the boiling point of water."


def test_best_sentences_quoted_in_reading_order_and_citations_renumbered():
    answer = ExtractiveAnswerer().answer(QUESTION, HITS)
    assert answer == Answer(
        text=PREAMBLE + f"{H2S0} [1] {H2S1} [1] {H4S0} [2]",
        citations=(
            Citation(1, "d2", "d2#0", "Boiling", f"{H2S0} {H2S1}"),
            Citation(2, "d4", "d4#0", "Cookers", H4S0),
        ),
        provider="extractive",
        model="extractive-v1",
        finish_reason="stop",
    )
    assert answer.cited is True


def test_max_sentences_keeps_only_the_top_scores():
    answer = ExtractiveAnswerer(max_sentences=2).answer(QUESTION, HITS)
    assert answer.text == PREAMBLE + f"{H2S1} [1] {H4S0} [2]"
    assert answer.citations == (
        Citation(1, "d2", "d2#0", "Boiling", H2S1),
        Citation(2, "d4", "d4#0", "Cookers", H4S0),
    )


def test_first_hit_is_cited_first_when_it_is_quoted():
    # With 4 sentences hit 1 s0 (1.2993) is the 4th best and enters, taking [1].
    answer = ExtractiveAnswerer(max_sentences=4).answer(QUESTION, HITS)
    assert answer.text == PREAMBLE + (
        "Glaciers store much of the fresh water on Earth. [1] "
        f"{H2S0} [2] {H2S1} [2] {H4S0} [3]"
    )
    assert [(c.n, c.doc_id) for c in answer.citations] == [(1, "d1"), (2, "d2"), (3, "d4")]


def test_stream_yields_preamble_then_one_delta_per_sentence():
    answerer = ExtractiveAnswerer()
    deltas = list(answerer.stream(QUESTION, HITS))
    assert deltas == [PREAMBLE, f"{H2S0} [1]", f" {H2S1} [1]", f" {H4S0} [2]"]
    assert "".join(deltas) == answerer.answer(QUESTION, HITS).text


def test_no_hits_says_nothing_was_found():
    answerer = ExtractiveAnswerer()
    answer = answerer.answer(QUESTION, [])
    assert answer == Answer(NOTHING_FOUND, (), "extractive", "extractive-v1", "no_context")
    assert answer.cited is False
    assert list(answerer.stream(QUESTION, [])) == [NOTHING_FOUND]


def test_hits_without_text_count_as_no_hits():
    answer = ExtractiveAnswerer().answer(QUESTION, [hit(1, ""), hit(2, "  \n ")])
    assert answer.text == NOTHING_FOUND
    assert (answer.citations, answer.finish_reason) == ((), "no_context")


def test_no_matching_term_quotes_the_first_sentence_of_the_top_hit():
    answerer = ExtractiveAnswerer()
    answer = answerer.answer("Who painted the Mona Lisa?", HITS)
    first = "Glaciers store much of the fresh water on Earth."
    assert answer == Answer(
        text=NO_MATCH + f"{first} [1]",
        citations=(Citation(1, "d1", "d1#0", "Glaciers", first),),
        provider="extractive",
        model="extractive-v1",
        finish_reason="stop",
    )
    assert list(answerer.stream("Who painted the Mona Lisa?", HITS)) == [NO_MATCH, f"{first} [1]"]


def test_no_match_fallback_skips_a_top_hit_without_text():
    answer = ExtractiveAnswerer().answer("Mona Lisa", [hit(1, ""), HITS[2]])
    assert answer.text == NO_MATCH + "Mount Everest is the highest mountain on Earth. [1]"
    assert answer.citations == (
        Citation(1, "d3", "d3#0", "Everest", "Mount Everest is the highest mountain on Earth."),
    )


@pytest.mark.parametrize("question", ["Is it that?", "to be or not to be", "THE and OF"])
def test_stop_word_only_question_falls_back_to_the_top_hit(question):
    answer = ExtractiveAnswerer().answer(question, HITS)
    assert answer.text == NO_MATCH + "Glaciers store much of the fresh water on Earth. [1]"
    assert [c.doc_id for c in answer.citations] == ["d1"]


def test_equal_scores_prefer_the_earlier_sentence():
    # Both sentences contain "water" only: ln(1 + 2/2) each, same hit, so position decides.
    hits = [hit(1, "Water is wet and clear today. Water is cold at night too.")]
    answer = ExtractiveAnswerer(max_sentences=1).answer("water", hits)
    assert answer.text == PREAMBLE + "Water is wet and clear today. [1]"


def test_short_fragments_are_dropped_unless_a_hit_has_nothing_else():
    hits = [hit(1, "Boil? Yes. Water boils quickly when heated."), hit(2, "Now! Boil it.")]
    # min 20: hit 1 keeps only its 32-char sentence; hit 2 keeps "Boil it." (its longest,
    # not its first).
    answer = ExtractiveAnswerer().answer("boil", hits)
    assert answer.text == PREAMBLE + "Water boils quickly when heated. [1] Boil it. [2]"
    assert [c.snippet for c in answer.citations] == ["Water boils quickly when heated.", "Boil it."]
    # min 1: "Boil?" also matches (ln(1 + 5/3) in hit 1) and is quoted.
    answer = ExtractiveAnswerer(min_sentence_chars=1).answer("boil", hits)
    assert answer.text == PREAMBLE + "Boil? [1] Water boils quickly when heated. [1] Boil it. [2]"
    assert answer.citations[0].snippet == "Boil? Water boils quickly when heated."


def test_idf_favours_the_rarer_term_and_counts_each_query_term_once():
    text = (
        "Water covers most of the planet. Water also fills deep lakes. "
        "Kettles boil within minutes."
    )
    hits = [hit(1, text)]
    # N = 3: water ln(1 + 3/2) = 0.9163 in two sentences; boil ln(1 + 3/1) = 1.3863 in one.
    answerer = ExtractiveAnswerer(max_sentences=1)
    assert answerer.answer("boil water", hits).text == PREAMBLE + "Kettles boil within minutes. [1]"
    # Repeating "water" in the question does not add to its weight.
    assert answerer.answer("water water water boil", hits).text == (
        PREAMBLE + "Kettles boil within minutes. [1]"
    )


def test_rank_prior_lets_a_common_term_in_the_top_hit_beat_a_rare_one_lower_down():
    hits = [
        hit(1, "Water covers most of the planet. Water also fills deep lakes."),
        hit(2, "Kettles boil within minutes."),
    ]
    # N = 3: hit 1 sentences: water ln(1 + 3/2) / log2(2) = 0.9163 each;
    # hit 2: boil ln(1 + 3/1) / log2(3) = 1.3863 / 1.5850 = 0.8747.
    answerer = ExtractiveAnswerer(max_sentences=1)
    assert answerer.answer("boil water", hits).text == (
        PREAMBLE + "Water covers most of the planet. [1]"
    )
    answer = ExtractiveAnswerer(max_sentences=2).answer("boil water", hits)
    assert answer.text == PREAMBLE + (
        "Water covers most of the planet. [1] Water also fills deep lakes. [1]"
    )
    answer = ExtractiveAnswerer(max_sentences=3).answer("boil water", hits)
    assert answer.text == PREAMBLE + (
        "Water covers most of the planet. [1] Water also fills deep lakes. [1] "
        "Kettles boil within minutes. [2]"
    )


def test_sentences_end_after_closing_quotes_and_brackets_and_at_newlines():
    text = (
        'The sign read "Boiling water ahead!" It was posted near the 2.5 litre kettle\n'
        "Boiling kettles whistle loudly (usually.) Nothing else here matters at all"
    )
    answer = ExtractiveAnswerer(min_sentence_chars=1).answer("boiling", [hit(1, text, "Sign")])
    assert answer.text == PREAMBLE + (
        'The sign read "Boiling water ahead!" [1] Boiling kettles whistle loudly (usually.) [1]'
    )
    assert answer.citations == (
        Citation(
            1, "d1", "d1#0", "Sign",
            'The sign read "Boiling water ahead!" Boiling kettles whistle loudly (usually.)',
        ),
    )
    # "2.5" is not followed by whitespace, so that sentence stays whole; the newline ends it.
    answer = ExtractiveAnswerer(min_sentence_chars=1).answer("litre", [hit(1, text)])
    assert answer.text == PREAMBLE + "It was posted near the 2.5 litre kettle [1]"


@pytest.mark.parametrize(
    ("limit", "snippet"),
    [
        (20, "Water boils at 100…"),  # "Water boils at 100 d" ends mid-word: back to the space
        (18, "Water boils at 100…"),  # the cut falls just before a space
        (19, "Water boils at 100…"),  # trailing space is stripped
        (3, "Wat…"),  # no space to go back to: hard cut
        (48, H2S0),  # fits exactly: not cut
    ],
)
def test_snippet_is_cut_at_a_word_boundary_with_an_ellipsis(limit, snippet):
    answer = ExtractiveAnswerer(snippet_chars=limit).answer("Celsius", [HITS[1]])
    assert answer.text == PREAMBLE + f"{H2S0} [1]"  # the text itself is never cut
    assert answer.citations[0].snippet == snippet


@pytest.mark.parametrize("name", ["max_sentences", "min_sentence_chars", "snippet_chars"])
@pytest.mark.parametrize("value", [0, -3])
def test_constructor_rejects_values_below_one(name, value):
    with pytest.raises(ValueError) as excinfo:
        ExtractiveAnswerer(**{name: value})
    assert str(excinfo.value) == f"{name} must be at least 1, got {value}"


@pytest.mark.parametrize("question", ["", "   ", "\n\t"])
def test_blank_question_is_rejected_by_answer_and_stream(question):
    answerer = ExtractiveAnswerer()
    with pytest.raises(ValueError) as excinfo:
        answerer.answer(question, HITS)
    assert str(excinfo.value) == "question must not be empty"
    with pytest.raises(ValueError) as excinfo:
        answerer.stream(question, HITS)  # raises on the call, before iteration
    assert str(excinfo.value) == "question must not be empty"


def test_answer_is_frozen_and_stores_citations_as_a_tuple():
    citation = Citation(1, "d1", "d1#0", "T", "s")
    answer = Answer("x [1]", [citation], "p", "m")
    assert answer.citations == (citation,)
    assert answer.finish_reason == "stop"
    assert answer.cited is True
    assert Answer("x", [], "p", "m").cited is False
    with pytest.raises(dataclasses.FrozenInstanceError):
        answer.text = "y"  # type: ignore[misc]


def test_events_are_the_deltas_then_the_answer():
    answerer = ExtractiveAnswerer()
    question = "How do glaciers move?"
    hits = [
        Hit("d1", "d1#0", "Glaciers move slowly downhill under their own weight. Snow falls.", 2.0, 1),
        Hit("d2", "d2#0", "Rivers carry sediment to the sea over many years.", 1.0, 2),
    ]
    events = list(answerer.events(question, hits))
    assert events[:-1] == list(answerer.stream(question, hits))
    assert events[-1] == answerer.answer(question, hits)
    assert events[-1].citations[0].doc_id == "d1"
