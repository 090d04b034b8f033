"""An adapter session used from many event loops keeps nothing for loops that closed.

Frameworks call one session from a new loop per call (``asyncio.run``, the Agents SDK's
``Runner.run_sync``). Each loop needs its own async guard (an async Redis connection
belongs to its loop) and its own ``asyncio.Lock``; once the loop has closed, both must be
let go. Kept in a WeakKeyDictionary they never were: the guard's connections and the lock
refer to their loop, so every call left a guard and an open socket behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os

import pytest

from ctxguard.adapters.openai_agents import CtxGuardSession

pytestmark = pytest.mark.redis

CALLS = 60


def open_sockets() -> int:
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the listing's own descriptor, closed by now
            count += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
    return count


def test_a_session_called_from_a_new_loop_each_time_keeps_one_guard(
    redis_url: str, namespace: str
) -> None:
    session = CtxGuardSession("loops", f"{redis_url}?namespace={namespace}", limit=4096)
    asyncio.run(session.add_items([{"role": "user", "content": "first"}]))
    gc.collect()
    before = open_sockets()
    for i in range(CALLS):
        asyncio.run(session.add_items([{"role": "user", "content": f"turn {i}"}]))
    gc.collect()
    assert len(session.ref._by_loop) == 1 and len(session._locks) == 1
    assert open_sockets() <= before + 2  # not one more per call
    items = asyncio.run(session.get_items())
    assert [i["content"] for i in items][-2:] == [f"turn {CALLS - 2}", f"turn {CALLS - 1}"]
    assert len(items) == CALLS + 1
