"""Prompting with citations: the system prompt, the user message that carries the numbered
context and the question, its exact inverse, and citation markers mapped back to hits.

The user message (`build_messages`) has a fixed layout:

    <context>
    [1] <title of hit 1>
    <text of hit 1>

    [2]
    <text of hit 2, which has no title>
    </context>

    Question: <the question, verbatim>

`context_blocks(hits)` is the part between the tags: one block per hit, numbered from 1 in the
order given, separated by one blank line. A block is a header line, `[n] <title>` (just `[n]`
when the title is empty; titles are single-line, so line breaks in a title become spaces),
followed by the hit's text on the next lines. With no hits the context is empty:
`<context>\\n\\n</context>`.

So that the layout can be read back exactly (`parse_context`, `question_of`), a text line that
could be mistaken for structure (a line that starts, after any spaces, with `[<digits>]` or
with `</context>`) is sent with one extra leading space, which `parse_context` removes again.
A header is therefore always a line starting with `[<digits>]`, and the first
`\\n</context>` always closes the context.

Citations: the model writes `[n]` after a claim, n being a context block number; `[1, 3]` and
`[1][3]` cite several blocks. `cite` maps the markers of an answer to Citations of the hits, in
order of first appearance; `unknown_markers` lists the numbers that name no block.
"""

from __future__ import annotations

import re
from typing import Iterable, Sequence

from llmframe_ray.errors import EmptyQueryError, LLMFrameError
from llmframe_ray.generate.base import Message
from llmframe_ray.types import Citation, Hit

SYSTEM_PROMPT = (
    "You answer questions using only the numbered context passages in the user's message. "
    "The passages are inside <context> tags; each one starts with a line \"[n] title\" giving "
    "its number n, and the question follows the context after \"Question:\".\n"
    "Rules:\n"
    "- Use only facts stated in the context, never your own knowledge.\n"
    "- Cite every claim with the number of the passage that supports it, in square brackets "
    "right after the claim, for example [1], or [1][3] when several passages support it. "
    "Cite only numbers that appear in the context.\n"
    "- If the context does not contain the answer, say that the provided context does not "
    "contain it, and do not guess.\n"
    "- Be concise."
)
CONTEXT_OPEN = "<context>"
CONTEXT_CLOSE = "</context>"
QUESTION_PREFIX = "Question: "
SNIPPET_CHARS = 240
ELLIPSIS = "…"

_END = f"\n{CONTEXT_CLOSE}\n\n{QUESTION_PREFIX}"
_HEADER = re.compile(r"\[(\d+)\](?: (.*))?")
_RESERVED = re.compile(rf" *(?:\[\d+\]|{re.escape(CONTEXT_CLOSE)})")
_ESCAPED = re.compile(rf" +(?:\[\d+\]|{re.escape(CONTEXT_CLOSE)})")
_LINE_BREAK = re.compile(r"\r\n|[\r\n]")
_MARKER = re.compile(r"\[(\d+(?:\s*,\s*\d+)*)\]")
_SPACE = re.compile(r"\s")


class PromptLayoutError(LLMFrameError, ValueError):
    """A user message that starts like the context layout but does not follow it."""


def _escape(text: str) -> str:
    return "\n".join(" " + line if _RESERVED.match(line) else line for line in text.split("\n"))


def _unescape(lines: Iterable[str]) -> str:
    return "\n".join(line[1:] if _ESCAPED.match(line) else line for line in lines)


def single_line(title: str) -> str:
    """The title as context headers show it: line breaks replaced by spaces."""
    return _LINE_BREAK.sub(" ", title)


def context_blocks(hits: Sequence[Hit]) -> str:
    """The numbered context: `[n] <title>` (or `[n]`), then the text; blocks separated by a
    blank line. Empty for no hits."""
    blocks: list[str] = []
    for n, hit in enumerate(hits, start=1):
        title = single_line(hit.title)
        header = f"[{n}] {title}" if title else f"[{n}]"
        blocks.append(f"{header}\n{_escape(hit.text)}")
    return "\n\n".join(blocks)


def user_message(question: str, hits: Sequence[Hit]) -> str:
    """The user message's text: the context in tags, a blank line, then the question."""
    if not question.strip():
        raise EmptyQueryError()
    return f"{CONTEXT_OPEN}\n{context_blocks(hits)}{_END}{question}"


def build_messages(question: str, hits: Sequence[Hit], history: Sequence[Message] = ()) -> list[Message]:
    """The earlier turns of the conversation, then one user message with context and question.
    The system prompt is not a message: pass `SYSTEM_PROMPT` as the provider's `system`."""
    return [*history, Message("user", user_message(question, hits))]


def _split_layout(message_text: str) -> tuple[str, str] | None:
    """(context, question) of a message in the layout; None for a message without context."""
    start = len(CONTEXT_OPEN) + 1
    if not message_text.startswith(CONTEXT_OPEN + "\n"):
        return None
    end = message_text.find(_END, start - 1)
    if end < 0:
        raise PromptLayoutError(
            f"the message opens {CONTEXT_OPEN} but has no '{CONTEXT_CLOSE}' line followed by "
            f"a blank line and {QUESTION_PREFIX.strip()!r}"
        )
    return message_text[start:end] if end >= start else "", message_text[end + len(_END):]


def parse_context(message_text: str) -> list[tuple[int, str, str]]:
    """(n, title, text) of every context block of a user message: the exact inverse of
    `context_blocks`. [] for a message without the layout or with an empty context."""
    layout = _split_layout(message_text)
    if layout is None or not layout[0]:
        return []
    parsed: list[tuple[int, str, list[str]]] = []
    for line in layout[0].split("\n"):
        header = _HEADER.fullmatch(line)
        if header is not None:
            parsed.append((int(header.group(1)), header.group(2) or "", []))
        elif not parsed:
            raise PromptLayoutError(f"the context does not start with a [n] header: {line[:80]!r}")
        else:
            parsed[-1][2].append(line)
    blocks: list[tuple[int, str, str]] = []
    for i, (n, title, lines) in enumerate(parsed):
        if i < len(parsed) - 1:  # all but the last block end with the separating blank line
            if len(lines) < 2 or lines[-1] != "":
                raise PromptLayoutError(f"context block [{n}] is not followed by a blank line")
            lines = lines[:-1]
        if not lines:
            raise PromptLayoutError(f"context block [{n}] has no text line")
        blocks.append((n, title, _unescape(lines)))
    return blocks


def question_of(message_text: str) -> str:
    """The question of a user message in the layout, verbatim; a message without the context
    layout is taken as a bare question and returned whole."""
    layout = _split_layout(message_text)
    return message_text if layout is None else layout[1]


def _marker_numbers(text: str) -> list[int]:
    """Every number in a citation marker, in order of appearance, repeats included."""
    return [int(n) for m in _MARKER.finditer(text) for n in m.group(1).split(",")]


def snippet_of(text: str, limit: int = SNIPPET_CHARS) -> str:
    """At most `limit` characters of `text`, cut at a word boundary, with "…" when cut."""
    if len(text) <= limit:
        return text
    cut = text[:limit]
    if not text[limit].isspace():
        boundary = max((m.start() for m in _SPACE.finditer(cut)), default=0)
        if boundary > 0:
            cut = cut[:boundary]
    return cut.rstrip() + ELLIPSIS


def cite(text: str, hits: Sequence[Hit]) -> tuple[Citation, ...]:
    """A Citation for every hit that a `[n]` marker of `text` names (n from 1), in order of
    first appearance. Out-of-range numbers are skipped. No valid marker: () (uncited)."""
    seen: dict[int, None] = {}
    for n in _marker_numbers(text):
        if 1 <= n <= len(hits):
            seen.setdefault(n)
    return tuple(
        Citation(
            n=n,
            doc_id=hits[n - 1].doc_id,
            chunk_id=hits[n - 1].chunk_id,
            title=hits[n - 1].title,
            snippet=snippet_of(hits[n - 1].text),
        )
        for n in seen
    )


def unknown_markers(text: str, n_hits: int) -> list[int]:
    """The marker numbers of `text` that name no context block (not in 1..n_hits), each once,
    in order of first appearance."""
    return list(dict.fromkeys(n for n in _marker_numbers(text) if not 1 <= n <= n_hits))
