import asyncio

import pytest

from llmframe_ray.generate.base import Completion, Message, ProviderRequestError, StreamEnd, Usage
from llmframe_ray.generate.extractive_provider import ExtractiveProvider
from llmframe_ray.generate.prompts import build_messages, cite
from llmframe_ray.types import Citation, Hit

PREAMBLE = (
    "Extractive answer (no language model configured): the sentences below are quoted "
    "from the retrieved passages.\n\n"
)
G = "Glaciers store much of the fresh water on Earth. They form where snow accumulates over centuries."
B = "Water boils at 100 degrees Celsius at sea level. At high altitude the boiling point is lower."
C = "Pressure cookers raise the boiling point of water. Food therefore cooks faster inside them."
HITS = [
    Hit("glaciers", "glaciers#0", G, 3.0, 1, title="Glaciers"),
    Hit("boiling", "boiling#2", B, 2.0, 2, title="Boiling"),
    Hit("cookers", "cookers#1", C, 1.0, 3, title="Cookers"),
]
QUESTION = "Why is the boiling point of water lower at altitude?"
# Terms: whi, boil, point, water, lower, altitud. 6 sentences; df water 3, boil 3, point 2,
# lower 1, altitud 1: idf water = boil = ln 3 = 1.0986, point = ln 4 = 1.3863, lower = altitud
# = ln 7 = 1.9459. Scores (idf sum / log2(block index + 2)):
#   block 1 s0 (water)                        1.0986 / 1     = 1.0986
#   block 2 s0 (water, boil)                  2.1972 / 1.585 = 1.3863
#   block 2 s1 (altitud, boil, point, lower)  6.3767 / 1.585 = 4.0233
#   block 3 s0 (boil, point, water)           3.5835 / 2     = 1.7918
# Top 3: block 2 s1, block 3 s0, block 2 s0. The answerer calls block 2 [1] and block 3 [2];
# the provider writes the context numbers [2] and [3].
TEXT = (
    PREAMBLE
    + "Water boils at 100 degrees Celsius at sea level. [2] "
    + "At high altitude the boiling point is lower. [2] "
    + "Pressure cookers raise the boiling point of water. [3]"
)
HISTORY = [Message("user", "Hi there"), Message("assistant", "Hello.")]
SYSTEM = "Answer from context."
# Input words: system 3 + history 2 + 1 + user message 66 (<context> 1, headers 2 + 2 + 2,
# texts 16 + 17 + 14, </context> 1, "Question:" 1, question 10) = 72.
# Output words: preamble 15 + 10 + 9 + 9 = 43.
USAGE = Usage(72, 43)


def messages():
    return build_messages(QUESTION, HITS, HISTORY)


def test_generate_uses_the_context_numbering():
    completion = asyncio.run(ExtractiveProvider().generate(messages(), system=SYSTEM))
    assert completion == Completion(TEXT, USAGE, "extractive-v1", "extractive", "stop")


def test_cite_on_the_callers_side_maps_to_the_right_hits():
    text = asyncio.run(ExtractiveProvider().generate(messages(), system=SYSTEM)).text
    assert cite(text, HITS) == (
        Citation(2, "boiling", "boiling#2", "Boiling", B),
        Citation(3, "cookers", "cookers#1", "Cookers", C),
    )


async def collect(iterator):
    return [item async for item in iterator]


def test_stream_deltas_join_to_the_generate_text_then_a_stream_end():
    items = asyncio.run(collect(ExtractiveProvider().stream(messages(), system=SYSTEM)))
    assert items == [
        PREAMBLE,
        "Water boils at 100 degrees Celsius at sea level. [2]",
        " At high altitude the boiling point is lower. [2]",
        " Pressure cookers raise the boiling point of water. [3]",
        StreamEnd(USAGE, "extractive-v1", "extractive", "stop"),
    ]
    assert "".join(items[:-1]) == TEXT


def test_only_the_answerers_own_marker_is_renumbered():
    hits = [
        Hit("snow", "snow#0", "Snow falls in the winter.", 1.0, 1),
        Hit("boil", "boil#0", "Water boils at 100 degrees [7] at sea level.", 1.0, 2),
    ]
    completion = asyncio.run(ExtractiveProvider().generate(build_messages("Why does water boil?", hits)))
    assert completion.text == PREAMBLE + "Water boils at 100 degrees [7] at sea level. [2]"


def test_a_message_without_context_gets_the_no_context_answer():
    completion = asyncio.run(ExtractiveProvider().generate([Message("user", "What is ice?")]))
    assert completion == Completion(
        "No relevant passages were found in the index for this question.",
        Usage(3, 11), "extractive-v1", "extractive", "no_context",
    )
    empty = asyncio.run(ExtractiveProvider().generate(build_messages("What is ice?", [])))
    # <context> </context> Question: What is ice? = 6 words in
    assert (empty.finish_reason, empty.usage) == ("no_context", Usage(6, 11))


@pytest.mark.parametrize(
    "conversation, message",
    [
        ([Message("assistant", "Hello.")], "extractive: the messages contain no user message to answer"),
        ([Message("user", "   ")], "extractive: question must not be empty"),
        ([Message("user", "<context>\n[1]\nice")], "extractive: the message opens <context> but has no"),
    ],
)
def test_bad_requests_raise_provider_request_errors(conversation, message):
    with pytest.raises(ProviderRequestError) as raised:
        asyncio.run(ExtractiveProvider().generate(conversation))
    assert str(raised.value).startswith(message)
    assert raised.value.retryable is False


def test_structured_output_is_a_request_error():
    with pytest.raises(ProviderRequestError) as raised:
        asyncio.run(ExtractiveProvider().structured(messages(), {"type": "object"}))
    assert str(raised.value) == "extractive: the extractive answerer cannot produce structured output"
