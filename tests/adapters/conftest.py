"""Adapter tests run over memory:// and a real Redis, each test in its own namespace."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

import pytest

from ctxguard.guard import AsyncGuard, Guard
from ctxguard.guard.policies import tool_problems
from ctxguard.guard.prepared import PreparedRequest
from ctxguard.messages import Message

LIMIT = 400
RESERVE = 64


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.redis)])
def store_url(request: pytest.FixtureRequest, namespace: str) -> str:
    """A store URL: a private memory:// store, or the test Redis (keys purged afterwards)."""
    if request.param == "memory":
        return f"memory://{namespace}"
    url: str = request.getfixturevalue("redis_url")
    request.getfixturevalue("redis_namespace")  # deletes the namespace's keys after the test
    return url


@pytest.fixture
def guard(store_url: str, namespace: str) -> Iterator[Guard]:
    guard = Guard(store_url, namespace=namespace, limit=LIMIT, counter="approx")
    yield guard
    guard.close()


@pytest.fixture
async def aguard(store_url: str, namespace: str) -> AsyncIterator[AsyncGuard]:
    guard = AsyncGuard(store_url, namespace=namespace, limit=LIMIT, counter="approx")
    yield guard
    await guard.aclose()


def assert_fits(
    guard: Guard | AsyncGuard,
    window: Sequence[Message],
    reserved: int,
    tools: Sequence[dict[str, object]] | None = None,
) -> int:
    """The window, recounted by the guard's counter, fits with the reserve; tool pairs valid."""
    assert window, "the window is empty"
    assert tool_problems(window) == []
    tokens = guard.counter.count_request(list(window), tools=tools)
    limit = guard.limit_source.resolve().tokens
    assert tokens + reserved <= limit, (tokens, reserved, limit)
    return tokens


def assert_prepared_fits(prepared: PreparedRequest) -> None:
    assert prepared.tokens + prepared.reserved_output + prepared.safety_margin <= prepared.limit
    assert tool_problems(prepared.messages) == []


def assert_starts_on_user(window: Sequence[Message], history: Sequence[Message]) -> None:
    """A window that leaves older messages out opens on a user turn after its pinned
    messages and summary (system/developer); ``history`` is the whole conversation."""
    rest = [m for m in window if m.role not in ("system", "developer")]
    whole = [m for m in history if m.role not in ("system", "developer")]
    assert rest, "the window holds no turn"
    if len(rest) < len(whole):  # messages were left out
        assert rest[0].role == "user", [m.role for m in window]


@pytest.fixture
async def with_reply_guardrail(store_url: str, namespace: str) -> AsyncIterator[Any]:
    """The LiteLLM guardrail under commit="with_reply" (its guards are the gateway's)."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    pytest.importorskip("litellm")
    from .test_litellm import from_config

    g = from_config(
        url=store_url,
        namespace=namespace,
        counter="approx",
        limit=LIMIT,
        max_tokens=RESERVE,
        commit="with_reply",
    )
    assert g.gateway.guard(None).config.commit == "with_reply"
    yield g
    await g.aclose()
