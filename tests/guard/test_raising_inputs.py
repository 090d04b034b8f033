"""Inputs of the caller's that raise while the guard reads them (a generator that
fails part way, a mapping whose reading raises) are an InvalidInputError naming what
was raised (redacted), and nothing is stored.

Before, the caller's RuntimeError escaped prepare/append/replace_tail/complete bare:
from a batch's iterator, from a message or reply mapping, from ``tools`` or ``usage``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from ctxguard import Guard, InvalidInputError, Message
from tests.conftest import private_memory_url

HI = {"role": "user", "content": "hi"}


class Unreadable(dict[str, Any]):
    """A mapping that holds a message but raises when read (a lazy proxy gone bad)."""

    def items(self) -> Any:
        raise RuntimeError("the proxy's backend is gone (token=abc123secret)")

    def __iter__(self) -> Any:
        raise RuntimeError("the proxy's backend is gone (token=abc123secret)")

    def get(self, key: str, default: Any = None) -> Any:
        raise RuntimeError("the proxy's backend is gone (token=abc123secret)")


def _fails_part_way() -> Iterator[dict[str, Any]]:
    yield HI
    raise RuntimeError("the upstream iterator broke (token=abc123secret)")


def _reply() -> Unreadable:
    return Unreadable(role="assistant", content="x")


CALLS: dict[str, Callable[[Guard], Any]] = {
    "prepare, a batch that raises part way": lambda g: g.prepare(
        "s", _fails_part_way(), max_tokens=50
    ),
    "append, a batch that raises part way": lambda g: g.append("s", _fails_part_way()),
    "replace_tail, a batch that raises part way": lambda g: g.replace_tail(
        "s", 0, _fails_part_way()
    ),
    "prepare, a message that raises": lambda g: g.prepare("s", [HI, Unreadable(HI)], max_tokens=50),
    "complete, a reply that raises": lambda g: g.complete("s", _reply()),
    "prepare, tools that raise": lambda g: g.prepare(
        "s", [HI], max_tokens=50, tools=[Unreadable(type="function")]
    ),
    "complete, usage that raises": lambda g: g.complete(
        "s", {"role": "assistant", "content": "x"}, usage=Unreadable(prompt_tokens=1)
    ),
}


@pytest.mark.redis
@pytest.mark.parametrize("call", CALLS.values(), ids=list(CALLS))
def test_an_input_that_raises_when_read_is_typed_and_nothing_is_stored(
    call: Callable[[Guard], Any], redis_url: str, namespace: str
) -> None:
    for url in (private_memory_url(), redis_url):
        guard = Guard(url, namespace=namespace, counter="approx", limit=4096)
        try:
            with pytest.raises(InvalidInputError, match="raised RuntimeError") as caught:
                call(guard)
            assert "abc123secret" not in str(caught.value)
            assert "\n" not in str(caught.value)
            assert guard.store.read("s") == []
        finally:
            guard.close()


def test_message_from_a_mapping_that_raises_is_typed() -> None:
    with pytest.raises(InvalidInputError, match="reading the message raised"):
        Message.from_openai(Unreadable(HI))
