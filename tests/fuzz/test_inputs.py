"""Fuzzing every caller input: only CtxGuardError ever escapes, other sessions stay intact.

Inputs go through ``Message.from_openai``, the stores (memory and a real
Redis, sync) and ``Guard.prepare``. A canary session written first must be
byte-identical afterwards.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctxguard.errors import CtxGuardError
from ctxguard.guard import Guard
from ctxguard.messages import Message
from ctxguard.stores import NewMessage, WriteOptions, open_store
from ctxguard.stores.keys import KeySpace

from .strategies import SESSION_IDS, message_dicts

FUZZ = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
CANARY = "canary"


def raw_state(store: Any, url: str | None, session_id: str) -> Any:
    """Everything stored for a session, as raw bytes (memory: the record list)."""
    if url is None:
        session = store._sessions.get(session_id)
        return None if session is None else (list(session.records), list(session.tokens))
    import redis

    client = redis.Redis.from_url(url)
    try:
        keys = KeySpace(store.namespace, store.tenant).session_keys(session_id)
        return [client.dump(k) for k in keys]
    finally:
        client.close()


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.redis)])
def backend(request: pytest.FixtureRequest, namespace: str) -> Iterator[tuple[Any, str | None]]:
    if request.param == "memory":
        yield open_store(f"memory://{namespace}", namespace=namespace), None
        return
    url: str = request.getfixturevalue("redis_url")
    request.getfixturevalue("purge_after")(url)
    store = open_store(url, namespace=namespace)
    yield store, url
    store.close()


def with_canary(store: Any, url: str | None) -> Any:
    store.append(CANARY, [NewMessage(Message(role="user", content="keep me"), 3)], WriteOptions())
    return raw_state(store, url, CANARY)


@FUZZ
@given(data=message_dicts())
def test_from_openai_raises_only_typed_errors(data: dict[str, Any]) -> None:
    try:
        message = Message.from_openai(data)
    except CtxGuardError:
        return
    assert Message.from_record(message.to_record()) == message


@FUZZ
@given(session_id=SESSION_IDS, data=message_dicts(), start=st.integers(-5, 5))
def test_store_raises_only_typed_errors(
    backend: tuple[Any, str | None], session_id: Any, data: dict[str, Any], start: int
) -> None:
    store, url = backend
    before = with_canary(store, url)
    try:
        new = NewMessage(Message.from_openai(data))
        store.append(session_id, [new], WriteOptions(counter="c"))
        assert new.message in [m.message for m in store.read(session_id, start)] or start
        store.fetch_window(session_id, 100, WriteOptions(counter="c"), [new], 1)
        store.info(session_id)
    except CtxGuardError:
        pass
    if session_id != CANARY:
        assert raw_state(store, url, CANARY) == before


@FUZZ
@given(session_id=SESSION_IDS, batch=st.lists(message_dicts(), max_size=3))
def test_guard_prepare_raises_only_typed_errors(
    backend: tuple[Any, str | None], session_id: Any, batch: list[dict[str, Any]]
) -> None:
    store, url = backend
    before = with_canary(store, url)
    guard = Guard(store, counter="approx", limit=2048, max_tokens=64)
    try:
        req = guard.prepare(session_id, batch)
        assert req.tokens + req.reserved_output <= req.limit
    except CtxGuardError:
        pass
    if session_id != CANARY:
        assert raw_state(store, url, CANARY) == before
