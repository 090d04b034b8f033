"""A lease's duration must be given to acquire one, on every backend.

Before, ``acquire_lease(sid, name, holder, None)`` on Redis built the release call (a
``None`` duration is how ``lease_call`` says release): the holder's lease was dropped
and the call answered True, as if it had been taken; on ``memory://`` it was a bare
TypeError. A duration whose repr raises, or a retract count whose repr raises, was that
object's own exception (the error message repr'd it)."""

from __future__ import annotations

from typing import Any

import pytest

from ctxguard.errors import ConfigError, CtxGuardError


class NoRepr:
    def __repr__(self) -> str:
        raise RuntimeError("no repr")

    __str__ = __repr__


@pytest.mark.parametrize("seconds", [None, NoRepr(), "5", 2e6])
async def test_acquire_without_a_usable_duration_is_refused_and_keeps_the_lease(
    store: Any, seconds: Any
) -> None:
    assert await store.acquire_lease("s1", "k", "a", 5) is True
    with pytest.raises(ConfigError, match="a lease lasts"):
        await store.acquire_lease("s1", "k", "a", seconds)
    assert await store.acquire_lease("s1", "k", "b", 5) is False  # still a's
    assert await store.release_lease("s1", "k", "a") is True


async def test_a_retract_count_whose_repr_raises_is_typed(store: Any) -> None:
    with pytest.raises(CtxGuardError):
        await store.retract("s1", NoRepr())
