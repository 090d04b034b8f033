"""A counter the caller wrote is held to the contract: its failures are typed, its
nonsense counts refused, and nothing is stored.

Before, the guard trusted any object shaped like a TokenCounter: a ``RuntimeError``
from ``count_message`` escaped bare, a ``None`` count became a ``TypeError`` in the
budget sum, and a count of -5 (or 2.5, or ``True``) was stored as the message's size
(on Redis, where the memory store refused it as the caller's fault), so the budget was
wrong for every later turn of the session.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest

from ctxguard import ConfigError, Guard, TemplateRefusedError, TokenizerError
from ctxguard.messages import Message
from tests.conftest import private_memory_url

HI = [{"role": "user", "content": "hi"}]


def _three(_: Any) -> Any:
    return 3


def _one() -> Any:
    return 1


def _boom(*_: Any) -> Any:
    raise RuntimeError("counter exploded (api_key=sk-secret-value)")


class Foreign:
    """A counter of the caller's, each answer chosen by the test."""

    def __init__(
        self,
        *,
        message: Callable[[Any], Any] = _three,
        overhead: Callable[[], Any] = _one,
        request: Callable[[Any], Any] = _three,
        additive: Any = False,
        fingerprint: Any = "foreign",
    ) -> None:
        self.message, self.overhead, self.request = message, overhead, request
        self.fingerprint, self.exact, self.additive = fingerprint, True, additive

    def count_message(self, message: Message) -> int:
        return self.message(message)  # type: ignore[no-any-return]

    def request_overhead(self, *, tools: Any = None) -> int:
        return self.overhead()  # type: ignore[no-any-return]

    def count_request(self, messages: Sequence[Message], *, tools: Any = None) -> int:
        return self.request(messages)  # type: ignore[no-any-return]


BAD_COUNTS = [-5, 2.5, float("nan"), True, None, "3", 2**63]
CASES = (
    [("count_message raises", {"message": _boom})]
    + [("request_overhead raises", {"overhead": _boom})]
    + [("count_request raises", {"request": _boom})]
    + [(f"count_message -> {c!r}", {"message": lambda _, c=c: c}) for c in BAD_COUNTS]
    + [(f"request_overhead -> {c!r}", {"overhead": lambda c=c: c}) for c in BAD_COUNTS]
    + [(f"count_request -> {c!r}", {"request": lambda _, c=c: c}) for c in BAD_COUNTS]
)


def _stores(redis_url: str | None) -> list[str]:
    return [private_memory_url()] + ([redis_url] if redis_url else [])


@pytest.mark.redis
@pytest.mark.parametrize(("name", "answers"), CASES, ids=[c[0] for c in CASES])
def test_a_foreign_counters_failure_is_a_tokenizer_error_and_nothing_is_stored(
    name: str, answers: dict[str, Any], redis_url: str, namespace: str
) -> None:
    for url in _stores(redis_url):
        guard = Guard(url, namespace=namespace, counter=Foreign(**answers), limit=1000)
        try:
            with pytest.raises(TokenizerError) as caught:
                guard.prepare("s", HI, max_tokens=50)
            text = str(caught.value)
            assert "counter Foreign" in text and "\n" not in text
            assert "sk-secret-value" not in text  # what it raised is redacted
            assert guard.store.read("s") == []
            assert guard.store.info("s") is None
        finally:
            guard.close()


def test_an_int_subclass_count_is_taken_as_its_value() -> None:
    import enum

    class Three(enum.IntEnum):
        N = 3

    guard = Guard(
        private_memory_url(), counter=Foreign(message=lambda _: Three.N, additive=True), limit=99
    )
    guard.append("s", HI)
    (stored,) = guard.store.read("s")
    assert type(stored.tokens) is int and stored.tokens == 3


def test_the_counters_own_refusal_passes_as_it_is() -> None:
    def refuse(_: Any) -> Any:
        raise TemplateRefusedError("the template refuses this conversation")

    guard = Guard(private_memory_url(), counter=Foreign(request=refuse), limit=1000)
    with pytest.raises(TemplateRefusedError, match="template refuses"):
        guard.prepare("s", HI, max_tokens=50)
    assert guard.store.read("s") == []


@pytest.mark.parametrize(
    "attrs",
    [{"fingerprint": 5}, {"fingerprint": ""}, {"fingerprint": "x" * 5000}, {"additive": "yes"}],
)
def test_a_counter_with_a_bad_fingerprint_or_flag_is_refused_at_construction(
    attrs: dict[str, Any],
) -> None:
    with pytest.raises(ConfigError, match="counter Foreign"):
        Guard(private_memory_url(), counter=Foreign(**attrs), limit=1000)


def test_the_guard_still_shows_the_counter_it_was_given() -> None:
    counter = Foreign(additive=True)
    guard = Guard(private_memory_url(), counter=counter, limit=1000)
    assert guard.counter is counter
    assert guard.prepare("s", HI, max_tokens=50).tokens > 0
