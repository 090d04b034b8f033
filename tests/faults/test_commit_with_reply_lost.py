"""``commit="with_reply"``: a complete whose one commit was lost stores the turn once.

The complete of this mode stores the new messages, the reply and the request record in
one ``commit_if_unchanged`` (the ``window`` script). A :class:`FaultProxy` between the
store and a private server drops that command before Redis sees it ("refuse") or lets
Redis run it and closes the connection before the reply ("drop_reply"); the store
retries it, or (one attempt) the caller repeats the complete with the same request and
reply. Either way the messages and the record are stored once, with the turn, the
usage and the recorded ids of the request as sent, and the session goes on. Guard and
AsyncGuard.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from ctxguard import AsyncGuard, Guard
from ctxguard.errors import StoreConnectionError
from ctxguard.stores import open_async_store, open_store
from ctxguard.stores.redis import RetryPolicy
from ctxguard.stores.redis_protocol import SCRIPT_NAMES, load_script
from tests.conftest import recorded_ids
from tests.guard.with_reply_env import SID, SYSTEM, Awaitable, answer, ids_of, user

from .helpers import RecordingPolicy
from .servers import FaultProxy, RedisServer

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]
NS = "lostwr"


@pytest.fixture
def proxy(private_redis: RedisServer) -> Iterator[FaultProxy]:
    admin = private_redis.client()
    for name in SCRIPT_NAMES:  # cached: an EVALSHA then runs at once, no NOSCRIPT round
        admin.script_load(load_script(name))
    admin.close()
    proxy = FaultProxy(private_redis.port).start()
    yield proxy
    proxy.stop()


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("retried_by", ["store", "caller"])
@pytest.mark.parametrize("fault", ["drop_reply", "refuse"])
async def test_a_complete_whose_commit_was_lost_stores_the_turn_once(
    proxy: FaultProxy, mode: str, retried_by: str, fault: str
) -> None:
    policy = RecordingPolicy() if retried_by == "store" else RetryPolicy(attempts=1)
    opener = open_store if mode == "sync" else open_async_store
    store = opener(proxy.url, namespace=NS, retry=policy)
    cls = Guard if mode == "sync" else AsyncGuard
    raw = cls(store, counter="approx", limit=4000, max_tokens=100, commit="with_reply")
    g = Awaitable(raw)
    reader = open_store(proxy.url, namespace=NS)
    try:
        first = await g.prepare(SID, [SYSTEM, user(1)])
        await g.complete(SID, answer(1), prepared=first)
        prepared = await g.prepare(SID, [user(2)])  # on the cached window
        usage = {"prompt_tokens": prepared.tokens + 1, "completion_tokens": 4}
        proxy.arm(store._scripts["window"].sha, fault)
        if retried_by == "store":
            await g.complete(SID, answer(2), prepared=prepared, usage=usage)
            assert policy.used  # type: ignore[attr-defined]
        else:
            with pytest.raises(StoreConnectionError):
                await g.complete(SID, answer(2), prepared=prepared, usage=usage)
            await g.complete(SID, answer(2), prepared=prepared, usage=usage)
        assert proxy.fired == [fault]

        assert [s.message.id for s in reader.read(SID)] == ["m-sys", "u1", "a1", "u2", "a2"]
        audit = reader.read_audit(SID)
        assert [(r["kind"], r["turn"]) for r in audit] == [("request", 1), ("request", 2)]
        assert len({r["rid"] for r in audit}) == 2
        record: dict[str, Any] = audit[-1]
        assert record["completed"] is True and record["drift"] == 1
        assert recorded_ids(reader, SID, record) == ids_of(prepared)

        nxt = await g.prepare(SID, [user(3)])  # and the session goes on
        await g.complete(SID, answer(3), prepared=nxt)
        assert [s.message.id for s in reader.read(SID)][-2:] == ["u3", "a3"]
        assert [r["turn"] for r in reader.read_audit(SID)] == [1, 2, 3]
    finally:
        done = raw.aclose() if isinstance(raw, AsyncGuard) else raw.close()
        if done is not None:
            await done
        closed = store.close()
        if closed is not None:
            await closed
        reader.close()
