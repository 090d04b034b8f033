"""A session store the caller wrote: what it raises that is not a CtxGuardError is a
StoreError (the original its ``__cause__``), one line, redacted; a CtxGuardError it
raises passes as it is.

Before, a ``RuntimeError`` (or ``KeyError``...) from a store passed to ``Guard`` /
``AsyncGuard`` escaped ``prepare`` and ``complete`` bare, as the counters and limit
sources the caller writes did (``test_foreign_counter``, ``test_foreign_limit``).
ctxguard's own stores raise only typed errors and are not checked (no cost on a turn).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from ctxguard import AsyncGuard, ConflictError, Guard, StoreError, open_store
from ctxguard.stores import open_async_store
from tests.conftest import private_memory_url

HI = [{"role": "user", "content": "hi"}]
SECRET = "s3cretPW"


class Breaking:
    """ctxguard's memory store, with one method raising what the test chose."""

    def __init__(self, inner: Any, method: str, exc: Exception) -> None:
        self._inner, self._method, self._exc = inner, method, exc

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if name != self._method:
            return attr
        exc = self._exc
        if asyncio.iscoroutinefunction(attr):

            async def failing_async(*_: Any, **__: Any) -> Any:
                raise exc

            return failing_async

        def failing(*_: Any, **__: Any) -> Any:
            raise exc

        return failing


def _boom() -> RuntimeError:
    return RuntimeError(f"lost redis://:{SECRET}@db:6379/0 on the way")


def _checked(caught: pytest.ExceptionInfo[StoreError], method: str) -> None:
    text = str(caught.value)
    assert type(caught.value) is StoreError, type(caught.value)
    assert "raised RuntimeError: lost redis://" in text and f"in {method}()" in text
    assert "\n" not in text and SECRET not in text
    assert isinstance(caught.value.__cause__, RuntimeError)


@pytest.mark.parametrize("method", ["fetch_window", "append", "append_with_audit"])
def test_a_sync_store_s_own_exception_is_a_store_error(method: str) -> None:
    store = Breaking(open_store(private_memory_url()), method, _boom())
    guard = Guard(store, counter="approx", limit=4096)
    if method == "fetch_window":
        with pytest.raises(StoreError) as caught:
            guard.prepare("s", HI)
    else:
        prepared = guard.prepare("s", HI)
        usage = {"prompt_tokens": 5} if method == "append_with_audit" else None
        with pytest.raises(StoreError) as caught:
            guard.complete(
                "s", {"role": "assistant", "content": "yo"}, prepared=prepared, usage=usage
            )
    _checked(caught, method)


@pytest.mark.parametrize("method", ["fetch_window", "append", "append_with_audit"])
def test_an_async_store_s_own_exception_is_a_store_error(method: str) -> None:
    async def main() -> None:
        store = Breaking(open_async_store(private_memory_url()), method, _boom())
        guard = AsyncGuard(store, counter="approx", limit=4096)
        if method == "fetch_window":
            with pytest.raises(StoreError) as caught:
                await guard.prepare("s", HI)
        else:
            prepared = await guard.prepare("s", HI)
            usage = {"prompt_tokens": 5} if method == "append_with_audit" else None
            with pytest.raises(StoreError) as caught:
                await guard.complete(
                    "s", {"role": "assistant", "content": "yo"}, prepared=prepared, usage=usage
                )
        _checked(caught, method)

    asyncio.run(main())


def test_a_ctxguard_error_a_store_raises_passes_as_it_is() -> None:
    conflict = ConflictError("someone else wrote")
    store = Breaking(open_store(private_memory_url()), "append", conflict)
    guard = Guard(store, counter="approx", limit=4096)
    prepared = guard.prepare("s", HI)
    with pytest.raises(ConflictError) as caught:
        guard.complete("s", {"role": "assistant", "content": "yo"}, prepared=prepared)
    assert caught.value is conflict
