"""A limit source the caller wrote: what it raises or wrongly answers is a ConfigError,
and nothing is stored.

Before, ``limit=`` took any object with ``resolve``; its ``RuntimeError`` escaped
``prepare`` bare, and an int (or ``None``) returned in place of a ``ContextLimit`` was
an ``AttributeError: 'int' object has no attribute 'tokens'``, from Guard and AsyncGuard.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from ctxguard import AsyncGuard, ConfigError, ContextLimit, Guard, ServerBusyError
from tests.conftest import private_memory_url

HI = [{"role": "user", "content": "hi"}]


def _boom() -> Any:
    raise RuntimeError("limit source exploded (password=hunter2)")


def _busy() -> Any:
    raise ServerBusyError("busy", kv_usage=0.99, waiting=9, kv_threshold=0.9, waiting_threshold=4)


class Source:
    def __init__(self, answer: Callable[[], Any]) -> None:
        self.answer = answer

    def resolve(self) -> ContextLimit:
        return self.answer()  # type: ignore[no-any-return]

    async def aresolve(self) -> ContextLimit:
        return self.answer()  # type: ignore[no-any-return]


ANSWERS: dict[str, Callable[[], Any]] = {
    "raises": _boom,
    "an int": lambda: 4096,
    "None": lambda: None,
    "a dict": lambda: {"tokens": 4096},
}


@pytest.mark.parametrize("answer", ANSWERS.values(), ids=list(ANSWERS))
def test_a_foreign_limit_sources_failure_is_a_config_error(answer: Callable[[], Any]) -> None:
    guard = Guard(private_memory_url(), limit=Source(answer), max_tokens=50)
    with pytest.raises(ConfigError, match="the limit source") as caught:
        guard.prepare("s", HI)
    assert "hunter2" not in str(caught.value)
    assert guard.store.read("s") == []


@pytest.mark.parametrize("answer", ANSWERS.values(), ids=list(ANSWERS))
async def test_an_async_guard_says_the_same(answer: Callable[[], Any]) -> None:
    guard = AsyncGuard(private_memory_url(), limit=Source(answer), max_tokens=50)
    with pytest.raises(ConfigError, match="the limit source") as caught:
        await guard.prepare("s", HI)
    assert "hunter2" not in str(caught.value)
    assert await guard.store.read("s") == []


def test_a_sources_own_ctxguard_error_passes_as_it_is() -> None:
    guard = Guard(private_memory_url(), limit=Source(_busy), max_tokens=50)
    with pytest.raises(ServerBusyError):
        guard.prepare("s", HI)
    assert guard.store.read("s") == []
