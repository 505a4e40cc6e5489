import pytest

from llmframe_ray.errors import EmptyQueryError
from llmframe_ray.generate.base import Message
from llmframe_ray.generate.prompts import (
    SYSTEM_PROMPT, PromptLayoutError, build_messages, cite, context_blocks, parse_context,
    question_of, snippet_of, unknown_markers, user_message,
)
from llmframe_ray.types import Citation, Hit

WORDS = " ".join(f"w{i:03d}" for i in range(60))  # 299 characters; word i starts at 5 * i

HITS = [
    Hit("d1", "d1#0", "Glaciers store fresh water.\nThey form slowly.", 3.0, 1, title="Glaciers"),
    Hit("d2", "d2#4", "Water boils at 100 degrees.", 2.0, 2),
    Hit("d3", "d3#1", WORDS, 1.0, 3, title="Two\nlines"),
]
BLOCKS = (
    "[1] Glaciers\n"
    "Glaciers store fresh water.\n"
    "They form slowly.\n"
    "\n"
    "[2]\n"
    "Water boils at 100 degrees.\n"
    "\n"
    "[3] Two lines\n"
    + WORDS
)
QUESTION = "Why do glaciers form?"


def test_context_blocks_exact_text():
    assert context_blocks(HITS) == BLOCKS
    assert context_blocks([]) == ""


def test_user_message_layout():
    assert user_message(QUESTION, HITS) == (
        "<context>\n" + BLOCKS + "\n</context>\n\nQuestion: Why do glaciers form?"
    )
    assert user_message("q?", []) == "<context>\n\n</context>\n\nQuestion: q?"


def test_build_messages_puts_history_first_then_one_user_message():
    history = [Message("user", "Hi"), Message("assistant", "Hello.")]
    messages = build_messages(QUESTION, HITS[1:2], history)
    assert messages == [
        Message("user", "Hi"),
        Message("assistant", "Hello."),
        Message("user", "<context>\n[1]\nWater boils at 100 degrees.\n</context>\n\nQuestion: Why do glaciers form?"),
    ]
    assert build_messages(QUESTION, []) == [Message("user", user_message(QUESTION, []))]
    with pytest.raises(EmptyQueryError):
        build_messages("  \n", HITS)


def test_system_prompt_asks_for_numbered_citations_and_for_saying_when_the_answer_is_missing():
    assert "[1]" in SYSTEM_PROMPT and "<context>" in SYSTEM_PROMPT
    assert "does not contain the answer" in SYSTEM_PROMPT


def test_parse_context_and_question_of_invert_the_layout():
    text = user_message(QUESTION, HITS)
    assert parse_context(text) == [
        (1, "Glaciers", "Glaciers store fresh water.\nThey form slowly."),
        (2, "", "Water boils at 100 degrees."),
        (3, "Two lines", WORDS),  # titles are single-line: the newline became a space
    ]
    assert question_of(text) == QUESTION


def test_round_trip_of_text_that_looks_like_the_layout():
    tricky = [
        Hit("a", "a#0", "first\n\n[2] not a header\n</context>\n\nQuestion: not the question", 1.0, 1),
        Hit("b", "b#0", "  [7] indented\n[x] fine\nends with a newline\n", 1.0, 2, title=" [9] title "),
        Hit("c", "c#0", "", 1.0, 3),
        Hit("d", "d#0", "\n", 1.0, 4, title="</context>"),
    ]
    question = "What?\n\nQuestion: really?"
    text = user_message(question, tricky)
    # text lines that could pass for structure get one extra leading space
    assert "\n [2] not a header\n </context>\n" in text and "\n   [7] indented\n" in text
    assert parse_context(text) == [(i, h.title, h.text) for i, h in enumerate(tricky, start=1)]
    assert question_of(text) == question


def test_a_message_without_the_layout_is_a_bare_question():
    assert parse_context("What is ice?") == []
    assert question_of("What is ice?") == "What is ice?"
    assert parse_context(user_message("q", [])) == []


@pytest.mark.parametrize(
    "text, problem",
    [
        ("<context>\n[1]\nice\n\nQuestion: q", "no '</context>' line"),
        ("<context>\nice\n</context>\n\nQuestion: q", r"does not start with a \[n\] header"),
        ("<context>\n[1]\nice\n[2]\nwater\n</context>\n\nQuestion: q", r"\[1\] is not followed by a blank line"),
    ],
)
def test_a_broken_layout_raises(text, problem):
    with pytest.raises(PromptLayoutError, match=problem):
        parse_context(text)


def test_snippet_cuts_at_a_word_boundary():
    assert snippet_of(WORDS) == " ".join(f"w{i:03d}" for i in range(48)) + "…"
    # a space right at the cut: nothing but the cut itself is dropped
    assert snippet_of("x" + WORDS) == "x" + " ".join(f"w{i:03d}" for i in range(48)) + "…"
    assert snippet_of("short text") == "short text"
    assert snippet_of("a" * 300) == "a" * 240 + "…"


def test_cite_maps_every_marker_form_in_order_of_first_appearance():
    text = "They form slowly [3]. Glaciers store water [1, 2] and [2][3]. Not [4] nor [0][ 1]."
    assert cite(text, HITS) == (
        Citation(3, "d3", "d3#1", "Two\nlines", " ".join(f"w{i:03d}" for i in range(48)) + "…"),
        Citation(1, "d1", "d1#0", "Glaciers", "Glaciers store fresh water.\nThey form slowly."),
        Citation(2, "d2", "d2#4", "", "Water boils at 100 degrees."),
    )
    assert unknown_markers(text, len(HITS)) == [4, 0]


def test_an_answer_without_a_valid_marker_is_uncited():
    assert cite("The context does not say.", HITS) == ()
    assert cite("Only a bad one [9] and [12, 4].", HITS) == ()
    assert unknown_markers("Only a bad one [9] and [12, 4] [9].", 3) == [9, 12, 4]
    assert unknown_markers("All good [1,3].", 3) == []
