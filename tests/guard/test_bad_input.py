"""Bad input to the guard: a typed error that says what to do, and nothing stored."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from ctxguard import (
    BudgetError,
    ConfigError,
    Guard,
    InvalidMessageError,
    MessageTooLongError,
    TokenizerError,
    load_counter,
)
from ctxguard.guard.truncate import MARKER
from ctxguard.messages import Message


class Refuses:
    """A counter that cannot count one particular message (e.g. an image part)."""

    def __init__(self) -> None:
        self.inner = load_counter("approx")
        self.fingerprint, self.exact, self.additive = "refuses", False, True

    def count_message(self, message: Message) -> int:
        if "poison" in message.text:
            raise TokenizerError("this tokenizer cannot count that content")
        return self.inner.count_message(message)

    def request_overhead(self, *, tools: Any = None) -> int:
        return self.inner.request_overhead(tools=tools)

    def count_request(self, messages: Any, *, tools: Any = None) -> int:
        return self.inner.request_overhead(tools=tools) + sum(map(self.count_message, messages))


def fresh(**settings: Any) -> Guard:
    settings.setdefault("counter", "approx")
    settings.setdefault("limit", 500)
    return Guard(f"memory://{uuid.uuid4().hex}", **settings)


def test_a_batch_that_cannot_be_counted_stores_nothing() -> None:
    guard = fresh(counter=Refuses())
    batch = [{"role": "user", "content": "fine"}, {"role": "assistant", "content": "poison"}]
    with pytest.raises(TokenizerError):
        guard.append("s", batch)
    with pytest.raises(TokenizerError):
        guard.prepare("s", batch)
    assert guard.store.info("s") is None


def test_an_invalid_message_in_a_batch_stores_nothing() -> None:
    guard = fresh()
    guard.append("s", [{"role": "user", "content": "kept"}])
    with pytest.raises(InvalidMessageError, match="message 1"):
        guard.prepare("s", [{"role": "user", "content": "ok"}, {"role": "robot", "content": "x"}])
    assert [m.message.text for m in guard.store.read("s")] == ["kept"]


def test_oversized_message_is_rejected_or_truncated_visibly() -> None:
    big = "lorem ipsum dolor " * 400
    strict = fresh(max_message_tokens=100)
    with pytest.raises(MessageTooLongError) as info:
        strict.prepare("s", [{"role": "user", "content": big}])
    assert info.value.limit == 100 and info.value.needed > 100
    assert strict.store.info("s") is None

    lenient = fresh(max_message_tokens=100, oversized="truncate", limit=2000)
    req = lenient.prepare("s", [{"role": "user", "content": big}])
    stored = lenient.store.read("s")[0]
    assert stored.tokens is not None and stored.tokens <= 100
    assert MARKER.split("{n}")[0].strip() in stored.message.text
    assert stored.message.metadata["ctxguard_truncated"]["original_chars"] == len(big)
    assert req.tokens + req.reserved_output <= req.limit


def test_admission_error_carries_the_numbers() -> None:
    guard = fresh(limit=200, max_tokens=50)
    guard.append("s", [{"role": "system", "content": "rules " * 40}])
    with pytest.raises(BudgetError) as info:
        guard.prepare("s", [{"role": "user", "content": "question " * 60}])
    err = info.value
    assert err.limit == 200 and err.reserved == 50 and err.needed > err.limit
    assert "needed" in str(err) and "limit 200" in str(err)


@pytest.mark.parametrize(
    "settings",
    [
        {"max_tokens": -1},
        {"oversized": "shrug"},
        {"summary_mode": "later"},
        {"audit_mode": "never"},
        {"max_window_messages": 0},
        {"window_cache_size": -1},
        {"window_cache_bytes": "64MB"},
        {"limit": True},
        {"limit": "8k"},
        {"counter": "gpt-4"},
    ],
)
def test_bad_settings_are_config_errors(settings: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        fresh(**settings)


def test_reserving_more_than_the_limit_is_a_budget_error() -> None:
    with pytest.raises(BudgetError):
        fresh(limit=100).prepare("s", [{"role": "user", "content": "hi"}], max_tokens=100)


def test_a_store_of_the_wrong_kind_is_refused_up_front() -> None:
    from ctxguard import AsyncGuard, open_async_store, open_store

    with pytest.raises(ConfigError, match="open_store"):
        Guard(open_async_store("memory://kinds"), limit=100)
    with pytest.raises(ConfigError, match="open_async_store"):
        AsyncGuard(open_store("memory://kinds"), limit=100)
