import pytest

from llmframe_ray.generate.base import Message
from llmframe_ray.generate.sessions import SessionStore, estimate_tokens


def words(text):
    return len(text.split())


def test_history_keeps_the_newest_whole_turns_within_budget():
    store = SessionStore(token_budget=10, max_sessions=5, count_tokens=words)
    store.append("s1", "one two three", "four five")          # 5 tokens
    store.append("s1", "six seven", "eight nine ten")          # 5 tokens
    store.append("s1", "eleven twelve", "thirteen")            # 3 tokens
    assert store.history("s1") == [
        Message("user", "six seven"), Message("assistant", "eight nine ten"),
        Message("user", "eleven twelve"), Message("assistant", "thirteen"),
    ]
    assert store.history("other") == []


def test_zero_budget_and_a_turn_larger_than_the_budget():
    store = SessionStore(token_budget=0, max_sessions=5, count_tokens=words)
    store.append("s", "a", "b")
    assert store.history("s") == []
    store = SessionStore(token_budget=3, max_sessions=5, count_tokens=words)
    store.append("s", "a b", "c")
    store.append("s", "a b c d", "e")  # 5 tokens: too large, and it hides the older turn
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


@pytest.mark.parametrize("bad", ["", "has space", "x" * 129, "semi;colon"])
def test_session_ids_are_checked(bad):
    with pytest.raises(ValueError, match="must be 1-128 characters"):
        SessionStore(10, 10).history(bad)


def test_estimate_tokens():
    assert [estimate_tokens(t) for t in ("", "abc", "abcd", "abcde")] == [1, 1, 1, 2]
