"""Fixtures shared by the guard's store-diff tests (refusal matrix, held records, the
``commit="with_reply"`` mode's world)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.conftest import private_memory_url, purge_namespace
from tests.guard.with_reply_env import Env


@pytest.fixture(
    params=[
        "memory",
        pytest.param("redis", marks=pytest.mark.redis),
        pytest.param("cluster", marks=pytest.mark.cluster),
    ]
)
def backend(request: pytest.FixtureRequest, namespace: str) -> str:
    """A store URL: a private memory:// store, the test Redis or the test Cluster."""
    if request.param == "memory":
        return private_memory_url()
    url: str = request.getfixturevalue(f"{request.param}_url")
    return url


@pytest.fixture(
    params=[
        pytest.param((backend, mode), id=f"{backend}-{mode}", marks=marks)
        for backend, marks in (
            ("memory", []),
            ("redis", [pytest.mark.redis]),
            ("cluster", [pytest.mark.cluster]),
        )
        for mode in ("sync", "async")
    ]
)
async def with_reply(request: pytest.FixtureRequest, namespace: str) -> AsyncIterator[Env]:
    """A ``commit="with_reply"`` guard's world (tests/guard/with_reply_env.py): memory://,
    Redis and Redis Cluster, Guard and AsyncGuard."""
    backend, mode = request.param
    url = private_memory_url() if backend == "memory" else request.getfixturevalue(f"{backend}_url")
    env = Env(backend, mode, url, namespace)
    try:
        yield env
    finally:
        await env.close()
        if backend != "memory":
            purge_namespace(url, namespace)
