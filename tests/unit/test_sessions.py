import pytest

from llmframe_ray.generate.base import Message
from llmframe_ray.generate.sessions import SessionStore, check_session_id, estimate_tokens, trim_messages


def words(text):
    return len(text.split())


def test_history_keeps_the_newest_messages_within_budget_and_starts_with_the_user():
    store = SessionStore(token_budget=10, max_sessions=5, count_tokens=words)
    store.append("s1", "one two three", "four five")          # 3 + 2
    store.append("s1", "six seven", "eight nine ten")          # 2 + 3
    store.append("s1", "eleven twelve", "thirteen")            # 2 + 1
    # newest first: 1 + 2 + 3 + 2 = 8 fits, + "four five" (2) = 10 fits, + "one two three" would not;
    # the kept list may not open with an assistant message, so "four five" goes too
    assert store.history("s1") == [
        Message("user", "six seven"), Message("assistant", "eight nine ten"),
        Message("user", "eleven twelve"), Message("assistant", "thirteen"),
    ]
    assert store.history("other") == []


def test_a_session_never_holds_more_than_the_budget():
    store = SessionStore(token_budget=4, max_sessions=5, count_tokens=words)
    for i in range(100):
        store.append("s", f"q{i}", f"a{i}")
    assert store.history("s") == [Message("user", "q98"), Message("assistant", "a98"), Message("user", "q99"), Message("assistant", "a99")]
    assert len(store._sessions["s"]) == 4


def test_zero_budget_keeps_nothing():
    store = SessionStore(token_budget=0, max_sessions=5, count_tokens=words)
    store.append("s", "a", "b")
    assert store.history("s") == []


def test_least_recently_used_session_is_forgotten():
    store = SessionStore(token_budget=100, max_sessions=2, count_tokens=words)
    store.append("a", "qa", "ra")
    store.append("b", "qb", "rb")
    store.history("a")  # touch a
    store.append("c", "qc", "rc")
    assert len(store) == 2
    assert store.history("b") == []
    assert store.history("a") == [Message("user", "qa"), Message("assistant", "ra")]


def test_trim_messages_of_a_chat_that_does_not_alternate():
    chat = [Message("assistant", "hello there"), Message("user", "hi"), Message("user", "tides?"), Message("assistant", "the moon")]
    assert trim_messages(chat, 100, words) == chat[1:]
    assert trim_messages(chat, 3, words) == chat[2:]  # "the moon" + "tides?"
    assert trim_messages(chat, 2, words) == []  # only "the moon" fits: no opening user message


@pytest.mark.parametrize("bad", ["", "has space", "x" * 129, "semi;colon"])
def test_session_ids_are_checked(bad):
    with pytest.raises(ValueError, match="must be 1-128 characters"):
        check_session_id(bad)


def test_estimate_tokens():
    assert [estimate_tokens(t) for t in ("", "abc", "abcd", "abcde")] == [1, 1, 1, 2]
