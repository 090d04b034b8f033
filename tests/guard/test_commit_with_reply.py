"""``commit="with_reply"``: a prepare stores nothing; complete stores the whole turn at once.

On memory://, Redis and Redis Cluster, with Guard and AsyncGuard (the ``with_reply``
fixture, tests/guard/with_reply_env.py): a prepare, cold or on the cached window,
changes nothing stored (tests/store_diff.py); a warm turn is one store call (one
``commit_if_unchanged``, one round trip to Redis) and a cold one a fetch and that
commit; a prepare never completed leaves nothing behind; another writer between
prepare and complete puts its messages before ours, and the request record then names
our messages where they landed and the other writer's as ``unseen``, which
``ctxguard replay`` and ``ctxguard audit`` leave out. The refusals, retries, usage,
conflicts and summaries of this mode are in test_commit_with_reply_edges.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from ctxguard.guard.sent import sent_seqs
from ctxguard.stores import redis_async
from tests import store_diff
from tests.conftest import recorded_ids
from tests.guard.with_reply_env import (
    SID,
    SYSTEM,
    CallLog,
    Env,
    answer,
    cached,
    ids_of,
    seeded,
    turn,
    user,
)


class Packets:
    """Counts the commands (or pipelines) a store sends Redis, one per round trip: the
    sync client's sends, the async store's own ``asend`` and redis-py's async sends
    outside it (the cluster client's)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        import redis.asyncio.connection as async_connection
        import redis.connection as sync_connection

        self.count = 0
        inside = [False]
        sync_send = sync_connection.AbstractConnection.send_packed_command
        async_send = async_connection.AbstractConnection.send_packed_command
        own_send = redis_async.asend

        def counted_sync(conn: Any, *args: Any, **kwargs: Any) -> Any:
            self.count += 1
            return sync_send(conn, *args, **kwargs)

        async def counted_async(conn: Any, *args: Any, **kwargs: Any) -> Any:
            if not inside[0]:
                self.count += 1
            return await async_send(conn, *args, **kwargs)

        async def counted_own(conn: Any, packed: Any) -> None:
            self.count += 1
            inside[0] = True
            try:
                await own_send(conn, packed)
            finally:
                inside[0] = False

        monkeypatch.setattr(sync_connection.AbstractConnection, "send_packed_command", counted_sync)
        monkeypatch.setattr(
            async_connection.AbstractConnection, "send_packed_command", counted_async
        )
        monkeypatch.setattr(redis_async, "asend", counted_own)


# -- 1. a prepare stores nothing --------------------------------------------------------


async def test_a_prepare_creates_no_session(with_reply: Env) -> None:
    guard = with_reply.guard()
    before = with_reply.snap()
    prepared = await guard.prepare(SID, [SYSTEM, user(1)])
    assert with_reply.snap() == before
    assert with_reply.reader.info(SID) is None
    assert ids_of(prepared) == ["m-sys", "u1"] and prepared.unstored is not None


@pytest.mark.parametrize("window", ["cold", "warm"])
async def test_a_prepare_changes_nothing_stored(with_reply: Env, window: str) -> None:
    size = 0 if window == "cold" else 1024
    guard = await seeded(with_reply, window_cache_size=size)
    assert cached(guard) is (window == "warm")  # (the warm prepare plans on the cache)
    before = with_reply.snap()
    prepared = await guard.prepare(SID, [user(2)])
    after = with_reply.snap()
    assert after == before, "\n".join(store_diff.changes(before, after))
    assert ids_of(prepared) == ["m-sys", "u1", "a1", "u2"]


# -- 2. a warm turn is one store call, one round trip; a cold one a fetch and the commit ----


async def test_a_warm_turn_is_a_token_read_and_one_store_call(with_reply: Env) -> None:
    log = CallLog(with_reply.store())  # (a store the caller wrote: the contract's read)
    guard = with_reply.guard(log)
    first = await guard.prepare(SID, [SYSTEM, user(1)])
    await guard.complete(SID, answer(1), prepared=first)
    assert log.calls == ["fetch_window", "commit_if_unchanged"]  # a new session: cold
    for i in (2, 3, 4):
        log.calls.clear()
        prepared = await guard.prepare(SID, [user(i)])
        assert log.calls == ["read_with_token"]  # is the cached window still the session?
        await guard.complete(SID, answer(i), prepared=prepared)
        assert log.calls == ["read_with_token", "commit_if_unchanged"], i
        assert recorded_ids(with_reply.reader, SID, with_reply.requests()[-1]) == ids_of(prepared)
    assert with_reply.ids() == ["m-sys", "u1", "a1", "u2", "a2", "u3", "a3", "u4", "a4"]


async def test_a_warm_turn_is_a_token_read_and_one_script_call(
    with_reply: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    if with_reply.backend == "memory":
        pytest.skip("no round trips: the in-process store")
    guard = await seeded(with_reply)
    await turn(guard, 2)  # (connections opened, scripts loaded, slots known)
    packets = Packets(monkeypatch)
    prepared = await guard.prepare(SID, [user(3)])
    assert packets.count == 1  # the state token's HMGET (ctxguard's own store)
    await guard.complete(SID, answer(3), prepared=prepared)
    assert packets.count == 2
    assert with_reply.ids()[-2:] == ["u3", "a3"]


async def test_a_cold_turn_is_a_fetch_and_the_commit(with_reply: Env) -> None:
    log = CallLog(with_reply.store())
    guard = with_reply.guard(log, window_cache_size=0)
    await guard.append(SID, [SYSTEM])
    for i in (1, 2, 3):
        log.calls.clear()
        prepared = await guard.prepare(SID, [user(i)])
        assert log.calls == ["fetch_window"]
        await guard.complete(SID, answer(i), prepared=prepared)
        assert log.calls == ["fetch_window", "commit_if_unchanged"]
    assert [r["turn"] for r in with_reply.requests()] == [1, 2, 3]


async def test_a_warm_turn_sends_what_a_cold_guard_sends(with_reply: Env) -> None:
    """The window cache moves on to the state each commit leaves: a guard that fetches
    every time (and, in this mode, stores nothing at prepare) plans the same request."""
    guard = await seeded(with_reply, limit=300)  # small: older messages drop out
    oracle = with_reply.guard(window_cache_size=0, limit=300)
    for i in range(2, 12):
        want = await oracle.prepare(SID, [user(i, words=20)])
        assert cached(guard)
        got = await guard.prepare(SID, [user(i, words=20)])
        assert (ids_of(got), got.tokens, got.sent_seqs) == (
            ids_of(want),
            want.tokens,
            want.sent_seqs,
        ), i
        await guard.complete(SID, answer(i), prepared=got)
    assert any(r.get("dropped") for r in with_reply.requests())


# -- 3. a prepare never completed ----------------------------------------------------------


@pytest.mark.parametrize("window", ["cold", "warm"])
async def test_a_prepare_never_completed_leaves_nothing(with_reply: Env, window: str) -> None:
    guard = await seeded(with_reply, window_cache_size=0 if window == "cold" else 1024)
    before = with_reply.snap()
    await guard.prepare(SID, [user(2)])  # the model call failed: no complete
    assert with_reply.snap() == before
    prepared = await guard.prepare(SID, [user(3)])
    assert "u2" not in ids_of(prepared)
    await guard.complete(SID, answer(3), prepared=prepared)
    assert with_reply.ids() == ["m-sys", "u1", "a1", "u3", "a3"]
    records = with_reply.requests()
    assert len(records) == 2 and records[-1]["completed"] is True
    assert recorded_ids(with_reply.reader, SID, records[-1]) == ["m-sys", "u1", "a1", "u3"]
    assert "unseen" not in records[-1]


# -- 4. another writer between prepare and complete ------------------------------------------


def replayed(env: Env, turn_number: int) -> dict[str, Any]:
    turns = env.cli_json("replay", SID)
    found = [t for t in turns if t["turn"] == turn_number]
    assert len(found) == 1, turns
    return dict(found[0])


def audited(env: Env) -> dict[str, Any]:
    data = env.cli_json("audit", SID)
    assert isinstance(data, dict)
    return data


@pytest.mark.parametrize("window", ["cold", "warm"])
async def test_another_writer_between_goes_first_and_is_unseen(
    with_reply: Env, window: str
) -> None:
    guard = await seeded(with_reply, window_cache_size=0 if window == "cold" else 1024)
    prepared = await guard.prepare(SID, [user(2)])
    with_reply.other().append(SID, [user("o"), answer("o")])  # stored at 3 and 4
    usage = {"prompt_tokens": prepared.tokens, "completion_tokens": 2}
    await guard.complete(SID, answer(2), prepared=prepared, usage=usage)

    assert with_reply.ids() == ["m-sys", "u1", "a1", "uo", "ao", "u2", "a2"]
    record = with_reply.requests()[-1]
    assert sent_seqs(record) == [0, 1, 2, 5]  # ours where it landed
    assert record["unseen"] == [3, 5]
    assert record["message_count"] == 6  # what the request saw ends before its reply
    assert record["completed"] is True and record["prompt_tokens"] == prepared.tokens
    assert recorded_ids(with_reply.reader, SID, record) == ids_of(prepared)
    again = replayed(with_reply, record["turn"])
    assert again["same"] and again["replayed_ids"] == ids_of(prepared), again
    found = audited(with_reply)
    assert found["ok"] is True and found["violations"] == [], found

    # the next turn plans on the session as it is (other writer's messages included)
    oracle = with_reply.guard(window_cache_size=0)
    want = await oracle.prepare(SID, [user(3)])
    got = await turn(guard, 3)
    assert ids_of(got) == ids_of(want) == [*with_reply.ids()[:-2], "u3"]
    last = with_reply.requests()[-1]
    assert "unseen" not in last and replayed(with_reply, last["turn"])["same"]


async def test_another_writer_between_a_prepare_of_no_new_message(with_reply: Env) -> None:
    guard = await seeded(with_reply)
    prepared = await guard.prepare(SID, [])  # (the model answers again: no new message)
    assert ids_of(prepared) == ["m-sys", "u1", "a1"]
    with_reply.other().append(SID, [user("o"), answer("o")])
    await guard.complete(SID, answer(2), prepared=prepared)

    assert with_reply.ids() == ["m-sys", "u1", "a1", "uo", "ao", "a2"]
    record = with_reply.requests()[-1]
    assert sent_seqs(record) == [0, 1, 2]
    assert record["unseen"] == [3, 5] and record["message_count"] == 5
    assert recorded_ids(with_reply.reader, SID, record) == ids_of(prepared)
    assert replayed(with_reply, record["turn"])["same"]
    found = audited(with_reply)
    assert found["ok"] is True and found["violations"] == [], found


async def test_a_warm_prepare_sees_a_write_since_the_last_turn(with_reply: Env) -> None:
    """A warm prepare reads the session's state token: what another writer stored since
    this guard's last turn is in the request (planned on a fetch), and the record has no
    ``unseen``; replay and audit agree."""
    guard = await seeded(with_reply)
    with_reply.other().append(SID, [user("o")])  # before the prepare
    assert cached(guard)
    prepared = await guard.prepare(SID, [user(2)])
    assert ids_of(prepared) == ["m-sys", "u1", "a1", "uo", "u2"]
    await guard.complete(SID, answer(2), prepared=prepared)
    assert with_reply.ids() == ["m-sys", "u1", "a1", "uo", "u2", "a2"]
    record = with_reply.requests()[-1]
    assert "unseen" not in record and sent_seqs(record) == [0, 1, 2, 3, 4]
    assert replayed(with_reply, record["turn"])["same"]
    assert audited(with_reply)["ok"] is True
