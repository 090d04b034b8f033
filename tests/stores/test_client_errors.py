"""Whatever redis-py raises from its own internals reaches the caller as a
StoreConnectionError (retried first when the call is idempotent), never raw;
an error in ctxguard's own code is never disguised as one."""

from __future__ import annotations

import warnings
from collections.abc import Awaitable, Callable
from typing import Any

import fakeredis
import pytest
import redis
from redis.asyncio.connection import Connection

from ctxguard.errors import StoreConnectionError
from ctxguard.stores.redis import (
    CLIENT_INTERNAL_ERRORS,
    AsyncRedisStore,
    RedisStore,
    RetryPolicy,
)
from ctxguard.stores.urls import parse_store_url

URL = parse_store_url("redis://:S3cretPw@127.0.0.1:1/0", "ns")
FAST = RetryPolicy(attempts=3, first_delay=0.0, max_delay=0.0)


def _inside_redis_py(exc_type: type[BaseException]) -> Callable[[], Any]:
    """A function whose frame belongs to a ``redis.*`` module, raising ``exc_type``."""
    namespace: dict[str, Any] = {"__name__": "redis._ctxguard_test", "exc_type": exc_type}
    exec("def fail():\n    raise exc_type('broken inside the client')\n", namespace)
    fail: Callable[[], Any] = namespace["fail"]
    return fail


def _sync_store() -> RedisStore:
    return RedisStore(URL, client=fakeredis.FakeRedis(), retry=FAST)


def _async_store() -> AsyncRedisStore:
    return AsyncRedisStore(URL, client=fakeredis.FakeAsyncRedis(), retry=FAST)


@pytest.mark.parametrize("exc_type", CLIENT_INTERNAL_ERRORS)
@pytest.mark.parametrize("idempotent", [True, False])
def test_sync_client_internal_errors_are_connection_errors(
    exc_type: type[BaseException], idempotent: bool
) -> None:
    calls = []
    fail = _inside_redis_py(exc_type)

    def op() -> Any:
        calls.append(1)
        return fail()

    with pytest.raises(StoreConnectionError, match="append failed") as info:
        _sync_store()._io("append", op, idempotent)
    assert isinstance(info.value.__cause__, exc_type)
    assert "S3cretPw" not in str(info.value)
    assert len(calls) == (FAST.attempts if idempotent else 1)


@pytest.mark.parametrize("exc_type", CLIENT_INTERNAL_ERRORS)
@pytest.mark.parametrize("idempotent", [True, False])
async def test_async_client_internal_errors_are_connection_errors(
    exc_type: type[BaseException], idempotent: bool
) -> None:
    calls = []
    fail = _inside_redis_py(exc_type)

    async def op() -> Any:
        calls.append(1)
        return fail()

    with pytest.raises(StoreConnectionError, match="append failed") as info:
        await _async_store()._io("append", op, idempotent)
    assert isinstance(info.value.__cause__, exc_type)
    assert len(calls) == (FAST.attempts if idempotent else 1)


async def test_the_reported_writelines_error_is_a_connection_error() -> None:
    """The error of issue 12 item 17, raised by redis-py itself: a connection whose
    stream writer was closed under a command that was being written on it (redis-py
    before 8.2 fails on the missing writer, an AttributeError naming ``writelines``; 8.2
    and later check for it and raise its own ConnectionError: a connection error either
    way, retried when the call is idempotent)."""
    closed = Connection(host="127.0.0.1", port=1)  # never connected: no writer
    calls = []

    async def op() -> Any:
        calls.append(1)
        await closed._send_packed_command([b"*1\r\n$4\r\nPING\r\n"])

    with pytest.raises(StoreConnectionError, match=r"lost (its|the) connection") as info:
        await _async_store()._io("append", op, True)
    cause = info.value.__cause__
    if isinstance(cause, AttributeError):
        assert "writelines" in str(cause)
    else:
        assert isinstance(cause, redis.exceptions.ConnectionError), cause
    assert info.value.phase in ("write", "lost")  # it may have run
    assert len(calls) == FAST.attempts  # an idempotent call was retried first


@pytest.mark.parametrize("exc_type", CLIENT_INTERNAL_ERRORS)
def test_errors_of_our_own_code_stay_raw_sync(exc_type: type[BaseException]) -> None:
    def ours() -> Any:
        raise exc_type("a bug in ctxguard")

    with pytest.raises(exc_type, match="a bug in ctxguard"):
        _sync_store()._io("append", ours, True)


@pytest.mark.parametrize("exc_type", CLIENT_INTERNAL_ERRORS)
async def test_errors_of_our_own_code_stay_raw_async(exc_type: type[BaseException]) -> None:
    async def ours() -> Any:
        raise exc_type("a bug in ctxguard")

    op: Callable[[], Awaitable[Any]] = ours
    with pytest.raises(exc_type, match="a bug in ctxguard"):
        await _async_store()._io("append", op, True)


@pytest.mark.parametrize(
    "url", ["redis://127.0.0.1:1/0", "rediss://127.0.0.1:1/0", "redis+cluster://127.0.0.1:1"]
)
def test_opening_a_client_warns_of_nothing(url: str) -> None:
    """redis-py 8.2 warns when an asyncio client is given the sync Retry class (under
    warnings-as-errors, a user's first AsyncGuard call raised it)."""
    from ctxguard.stores.redis_clients import async_client

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        client = async_client(parse_store_url(url))
    assert client is not None
