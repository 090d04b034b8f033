"""Fixtures shared by the guard's store-diff tests (refusal matrix, held records)."""

from __future__ import annotations

import pytest

from tests.conftest import private_memory_url


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
