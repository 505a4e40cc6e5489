"""Conversation history per session, so that follow-up questions see earlier turns.

`trim_messages` keeps the newest messages whose estimated tokens fit a budget and never starts
with an assistant message (vendors expect a conversation to open with the user). A
`SessionStore` keeps, per session key, the messages of its (question, answer) turns, trimmed that
way on every append, so a session never holds more than the budget; at most `max_sessions`
sessions are kept, the least recently used forgotten first. The API keys sessions by the caller's
API key and the client's session id, so one key cannot read another's conversation. Token counts
are estimated (about 4 characters per token, the usual rule of thumb for English with these
vendors' tokenizers).
"""

from __future__ import annotations

import re
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, Sequence

from llmframe_ray.generate.base import Message

SESSION_ID = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")


@dataclass(frozen=True)
class SessionParams:
    """Tokens of history a session keeps (0: no history), and how many sessions are kept."""

    token_budget: int = 2000
    max_sessions: int = 10000


def estimate_tokens(text: str) -> int:
    return max(1, (len(text) + 3) // 4)


def check_session_id(session_id: str) -> str:
    if not SESSION_ID.match(session_id):
        raise ValueError("must be 1-128 characters of letters, digits, '.', '_', ':' or '-'")
    return session_id


def trim_messages(
    messages: Sequence[Message], budget: int, count_tokens: Callable[[str], int] = estimate_tokens
) -> list[Message]:
    """The newest messages that fit in `budget` tokens, starting with a user message."""
    kept: list[Message] = []
    used = 0
    for message in reversed(messages):
        used += count_tokens(message.content)
        if used > budget:
            break
        kept.append(message)
    kept.reverse()
    while kept and kept[0].role != "user":
        kept.pop(0)
    return kept


class SessionStore:
    def __init__(
        self, token_budget: int, max_sessions: int, count_tokens: Callable[[str], int] = estimate_tokens
    ) -> None:
        if token_budget < 0 or max_sessions < 1:
            raise ValueError("token_budget must be >= 0 and max_sessions >= 1")
        self.token_budget = token_budget
        self.max_sessions = max_sessions
        self.count_tokens = count_tokens
        self._sessions: OrderedDict[str, list[Message]] = OrderedDict()
        self._lock = threading.Lock()

    def history(self, key: str) -> list[Message]:
        with self._lock:
            if key not in self._sessions:
                return []
            self._sessions.move_to_end(key)
            return list(self._sessions[key])

    def append(self, key: str, question: str, answer: str) -> None:
        with self._lock:
            messages = self._sessions.get(key, []) + [Message("user", question), Message("assistant", answer)]
            self._sessions[key] = trim_messages(messages, self.token_budget, self.count_tokens)
            self._sessions.move_to_end(key)
            while len(self._sessions) > self.max_sessions:
                self._sessions.popitem(last=False)

    def __len__(self) -> int:
        return len(self._sessions)


def seconds_to_utc_midnight(now: float) -> int:
    return max(1, 86400 - int(now) % 86400)


class TokenLedger:
    """Generation tokens (input + output) spent per API key on the current UTC day."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self._spent: dict[str, tuple[int, int]] = {}  # key -> (UTC day number, tokens)
        self._lock = threading.Lock()

    def spent(self, key: str) -> int:
        day, tokens = self._spent.get(key, (-1, 0))
        return tokens if day == int(self.clock()) // 86400 else 0

    def charge(self, key: str, tokens: int) -> int:
        """Add `tokens` to today's count of `key`; return the new count."""
        with self._lock:
            today = int(self.clock()) // 86400
            day, spent = self._spent.get(key, (-1, 0))
            total = (spent if day == today else 0) + max(0, int(tokens))
            self._spent[key] = (today, total)
            return total
