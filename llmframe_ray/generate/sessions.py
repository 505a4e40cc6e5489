"""Conversation history per session id, so that follow-up questions see earlier turns.

A session is a list of (question, answer) turns. `history(session_id)` returns the most recent
turns that fit in `token_budget` (oldest dropped first, whole turns only) as Messages;
`append` records a turn. At most `max_sessions` sessions are kept: the least recently used
one is forgotten first. Token counts are estimated (about 4 characters per token, the usual
rule of thumb for English with these vendors' tokenizers), never sent anywhere.
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from typing import Callable

from llmframe_ray.generate.base import Message

SESSION_ID = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")


def estimate_tokens(text: str) -> int:
    return max(1, (len(text) + 3) // 4)


def check_session_id(session_id: str) -> str:
    if not SESSION_ID.match(session_id):
        raise ValueError("must be 1-128 characters of letters, digits, '.', '_', ':' or '-'")
    return session_id


def trim_turns(
    turns: list[tuple[str, str]], budget: int, count_tokens: Callable[[str], int] = estimate_tokens
) -> list[Message]:
    """The newest whole (question, answer) turns whose tokens fit in `budget`, as Messages."""
    kept: list[tuple[str, str]] = []
    used = 0
    for question, answer in reversed(turns):
        cost = count_tokens(question) + count_tokens(answer)
        if used + cost > budget:
            break
        kept.append((question, answer))
        used += cost
    messages: list[Message] = []
    for question, answer in reversed(kept):
        messages += [Message("user", question), Message("assistant", answer)]
    return messages


class SessionStore:
    def __init__(
        self, token_budget: int, max_sessions: int, count_tokens: Callable[[str], int] = estimate_tokens
    ) -> None:
        if token_budget < 0 or max_sessions < 1:
            raise ValueError("token_budget must be >= 0 and max_sessions >= 1")
        self.token_budget = token_budget
        self.max_sessions = max_sessions
        self.count_tokens = count_tokens
        self._turns: OrderedDict[str, list[tuple[str, str]]] = OrderedDict()
        self._lock = threading.Lock()

    def history(self, session_id: str) -> list[Message]:
        with self._lock:
            turns = list(self._turns.get(check_session_id(session_id), ()))
            if session_id in self._turns:
                self._turns.move_to_end(session_id)
        return trim_turns(turns, self.token_budget, self.count_tokens)

    def append(self, session_id: str, question: str, answer: str) -> None:
        with self._lock:
            turns = self._turns.setdefault(check_session_id(session_id), [])
            turns.append((question, answer))
            self._turns.move_to_end(session_id)
            while len(self._turns) > self.max_sessions:
                self._turns.popitem(last=False)

    def __len__(self) -> int:
        return len(self._turns)
