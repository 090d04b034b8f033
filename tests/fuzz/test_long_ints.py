"""An int too long for JSON text Python can read back is refused where it is given.

Before, the JSON walk took an int of any size: a message whose extra field or metadata
held an int of 5000 digits was stored by append() and complete() (and by prepare(),
which then raised a bare ValueError "Exceeds the limit (4300 digits) for integer
string conversion" with the message already stored), and from then on every read of
the session was a CorruptRecordError; such an int in ``usage`` was stored in the audit
record, and the session's audit trail could no longer be read. Now each is an
InvalidInputError naming the place, and nothing is stored.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from ctxguard import Guard, InvalidInputError, InvalidMessageError, Message
from ctxguard._validate import MAX_JSON_INT_DIGITS
from tests.conftest import private_memory_url

LONG = 10**5000
HI = [{"role": "user", "content": "hi"}]
WITH_EXTRA = {"role": "user", "content": "x", "extra_field": LONG}
WITH_METADATA = {"role": "user", "content": "x", "metadata": {"n": -LONG}}
REPLY = {"role": "assistant", "content": "x", "extra_field": LONG}
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"max": LONG}}}]

CALLS: dict[str, Callable[[Guard], Any]] = {
    "prepare, an extra field": lambda g: g.prepare("s", [WITH_EXTRA], max_tokens=50),
    "prepare, metadata": lambda g: g.prepare("s", [WITH_METADATA], max_tokens=50),
    "append": lambda g: g.append("s", [WITH_EXTRA]),
    "replace_tail": lambda g: g.replace_tail("s", 0, [WITH_METADATA]),
    "complete": lambda g: g.complete("s", REPLY),
    "prepare, tools": lambda g: g.prepare("s", HI, max_tokens=50, tools=TOOLS),
    "complete, usage": lambda g: g.complete(
        "s", {"role": "assistant", "content": "x"}, usage={"prompt_tokens": LONG}
    ),
}


@pytest.mark.redis
@pytest.mark.parametrize("call", CALLS.values(), ids=list(CALLS))
def test_an_int_too_long_to_read_back_is_refused_and_nothing_is_stored(
    call: Callable[[Guard], Any], redis_url: str, namespace: str
) -> None:
    for url in (private_memory_url(), redis_url):
        guard = Guard(url, namespace=namespace, counter="approx", limit=4096)
        try:
            with pytest.raises(InvalidInputError, match="digits"):
                call(guard)
            assert guard.store.read("s") == []
            assert guard.store.read_audit("s") == []
        finally:
            guard.close()


def test_a_message_is_refused_when_made() -> None:
    with pytest.raises(InvalidMessageError, match=r"extra\['extra_field'\]"):
        Message.from_openai(WITH_EXTRA)


def test_a_long_int_inside_the_bound_is_kept_whole() -> None:
    guard = Guard(private_memory_url(), counter="approx", limit=4096)
    near = 10**MAX_JSON_INT_DIGITS - 1
    guard.append("s", [{"role": "user", "content": "x", "metadata": {"n": near, "m": 2**64}}])
    (stored,) = guard.store.read("s")
    assert stored.message.metadata == {"n": near, "m": 2**64}
