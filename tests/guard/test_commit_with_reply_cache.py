"""``commit="with_reply"`` at its edges: a cached window another writer moved on, the
cap, and one request completed twice.

A prepare that writes nothing has no commit to tell it that its cached window is stale:
it reads the session's state token (one plain read on ctxguard's stores, the contract's
``read_with_token`` on a store the caller wrote) and plans on a fetch when another writer
came first, so the request it returns holds that writer's messages.

With ``max_stored_messages``, a turn that could not store its reply is refused at
``prepare``, before the model is called, and stores nothing (the default mode stores the
user message at prepare and finds the cap full only at the reply's append; a prepare that
stores nothing must say it before the request is sent, or the model's answer is lost).

A request completed again with the same reply (a retry) stores nothing twice; completed
with another reply (a second choice), that reply is stored with a record of its own, as
the default mode stores a second reply, not dropped as a retry.
"""

from __future__ import annotations

from typing import Any

import pytest

from ctxguard import AsyncGuard, Guard
from ctxguard.errors import SessionFullError
from ctxguard.guard.replay import replay_records
from ctxguard.messages import Message
from ctxguard.stores import open_async_store, open_store
from tests import store_diff
from tests.conftest import private_memory_url

SENT = ["send_state_token", "state_token_reply"]


class Foreign:
    """A store the caller wrote (ctxguard's, behind a wrapper, without its token read)."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        if name == "state_token":
            raise AttributeError(name)
        return getattr(self._inner, name)


def _turn(guard: Guard, index: int) -> None:
    prepared = guard.prepare("s", [Message(role="user", content=f"q{index}", id=f"q{index}")])
    reply = Message(role="assistant", content=f"a{index}", id=f"a{index}")
    guard.complete("s", reply, prepared=prepared)


@pytest.mark.parametrize("cache", [0, 64], ids=["fetched", "cached"])
def test_a_turn_whose_reply_would_not_fit_is_refused_at_prepare(
    backend: str, namespace: str, cache: int
) -> None:
    store = open_store(backend, namespace=namespace)
    guard = Guard(
        store,
        counter="approx",
        limit=400,
        max_tokens=60,
        commit="with_reply",
        max_stored_messages=5,
        window_cache_size=cache,
    )
    _turn(guard, 0)
    _turn(guard, 1)  # four messages: one more turn needs two
    before = store_diff.take(store, backend)
    with pytest.raises(SessionFullError) as caught:
        guard.prepare("s", [Message(role="user", content="q2", id="q2")])
    assert caught.value.held == 4
    assert (
        "this turn would store 2 more (its reply included), over the configured maximum of 5"
        in (str(caught.value))
    )
    assert len(str(caught.value).splitlines()) == 1
    assert store_diff.changes(before, store_diff.take(store, backend)) == []
    guard.close()


def test_a_request_completed_again_stores_a_new_reply_once_and_a_retry_not_at_all(
    backend: str, namespace: str
) -> None:
    store = open_store(backend, namespace=namespace)
    guard = Guard(store, counter="approx", limit=400, max_tokens=60, commit="with_reply")
    system = Message(role="system", content="be brief", id="sys")
    prepared = guard.prepare("s", [system, Message(role="user", content="hi", id="u0")])
    first = Message(role="assistant", content="one", id="r1")
    guard.complete("s", first, prepared=prepared, usage={"prompt_tokens": 9})
    before = store_diff.take(store, backend)
    guard.complete("s", first, prepared=prepared, usage={"prompt_tokens": 9})  # a retry
    assert store_diff.changes(before, store_diff.take(store, backend)) == []
    second = Message(role="assistant", content="two", id="r2")
    result = guard.complete("s", second, prepared=prepared)
    assert result.stored == ("r2",)
    assert [s.message.id for s in store.read("s")] == ["sys", "u0", "r1", "r2"]
    records = [r for r in store.read_audit("s") if r.get("kind") == "request"]
    assert len(records) == 2 and records[0]["rid"] != records[1]["rid"]
    assert records[0]["message_count"] == 2 and "unseen" not in records[0]
    assert records[1]["message_count"] == 3 and records[1]["unseen"] == [2, 3]  # r1: not seen
    turns = replay_records(guard.core, store.read("s"), store.read_audit("s"))
    assert [t.recorded_ids for t in turns] == [("sys", "u0")] * 2
    assert all(t.replayed_ids == t.recorded_ids for t in turns)
    guard.close()


def _message(role: str, name: str) -> Message:
    return Message(role=role, content=f"{role} {name}", id=name)  # type: ignore[arg-type]


@pytest.mark.parametrize("wrap", [False, True], ids=["own", "foreign"])
def test_a_cached_window_another_writer_moved_on_is_not_sent(
    backend: str, namespace: str, wrap: bool
) -> None:
    store = open_store(backend, namespace=namespace)
    settings: dict[str, Any] = {"counter": "approx", "limit": 400, "max_tokens": 60}
    mine = Guard(Foreign(store) if wrap else store, commit="with_reply", **settings)
    other = Guard(store, commit="with_reply", **settings)  # (another process, its own cache)
    _turn(mine, 0)
    _turn(mine, 1)  # mine caches the session's window
    request = other.prepare("s", [_message("user", "theirs")])
    other.complete("s", _message("assistant", "their-reply"), prepared=request)
    request = mine.prepare("s", [_message("user", "q2")])
    assert [m.id for m in request.messages][-3:] == ["theirs", "their-reply", "q2"]
    mine.complete("s", _message("assistant", "a2"), prepared=request)
    newest = store.read_audit("s")[-1]
    assert "unseen" not in newest and newest["message_count"] == 7
    again = mine.prepare("s", [_message("user", "q3")])  # the fetch left a cache: a hit now
    assert [m.id for m in again.messages][-3:] == ["q2", "a2", "q3"]
    mine.close()
    other.close()


@pytest.mark.parametrize(
    "url",
    ["memory", pytest.param("redis", marks=pytest.mark.redis)],
)
async def test_async_a_cached_window_another_writer_moved_on_is_not_sent(
    url: str, request: pytest.FixtureRequest, namespace: str
) -> None:
    where = private_memory_url() if url == "memory" else request.getfixturevalue("redis_url")
    store = open_async_store(where, namespace=namespace)
    settings: dict[str, Any] = {"counter": "approx", "limit": 400, "max_tokens": 60}
    mine = AsyncGuard(store, commit="with_reply", **settings)
    other = AsyncGuard(store, commit="with_reply", **settings)
    for index in range(2):
        asked = await mine.prepare("s", [_message("user", f"q{index}")])
        await mine.complete("s", _message("assistant", f"a{index}"), prepared=asked)
    asked = await other.prepare("s", [_message("user", "theirs")])
    await other.complete("s", _message("assistant", "their-reply"), prepared=asked)
    asked = await mine.prepare("s", [_message("user", "q2")])
    assert [m.id for m in asked.messages][-3:] == ["theirs", "their-reply", "q2"]
    await mine.aclose()
    await other.aclose()


def test_a_warm_turn_is_a_token_read_and_one_commit_and_a_stale_copy_is_reported(
    backend: str, namespace: str
) -> None:
    """What each operation sent to the store, as an observer sees it (one event each)."""
    events: list[Any] = []
    store = open_store(backend, namespace=namespace)
    settings: dict[str, Any] = {"counter": "approx", "limit": 400, "max_tokens": 60}
    mine = Guard(store, commit="with_reply", observer=events.append, **settings)
    _turn(mine, 0)  # a fetch, then the commit
    _turn(mine, 1)
    calls = [(e.kind, e.cache, [c.method for c in e.store_calls]) for e in events]
    # the plain Redis client sends the read before the plan and takes its reply after
    read = ["state_token"] if backend.startswith("memory") else SENT
    assert calls == [
        ("prepare", "miss", ["fetch_window"]),
        ("complete", None, ["commit_if_unchanged"]),
        ("prepare", "hit", read),
        ("complete", None, ["commit_if_unchanged"]),
    ]
    Guard(store, **settings).append("s", [_message("user", "elsewhere")])
    events.clear()
    _turn(mine, 2)
    assert [(e.kind, e.cache, [c.method for c in e.store_calls]) for e in events] == [
        ("prepare", "stale", [*read, "fetch_window"]),
        ("complete", None, ["commit_if_unchanged"]),
    ]
    mine.close()


def test_a_request_another_counter_prepared_stores_none_of_its_counts(
    backend: str, namespace: str
) -> None:
    """A ``PreparedRequest`` completed by a guard of another counter (copied, pickled):
    its messages are stored with their counts unknown and its recounts are not written,
    or the session would hold one counter's numbers under the other's name."""
    store = open_store(backend, namespace=namespace)
    approx = Guard(store, counter="approx", limit=100_000, max_tokens=60)
    approx.append("s", [_message("user", f"m{i}") for i in range(3)])
    before = [s.tokens for s in store.read("s")]
    tiktoken = Guard(
        store,
        counter="tiktoken:cl100k_base",
        limit=100_000,
        max_tokens=60,
        commit="with_reply",
        window_cache_size=0,
    )
    request = tiktoken.prepare("s", [_message("user", "q")])
    assert request.unstored is not None and request.unstored.counts  # (recounted)
    approx.complete("s", _message("assistant", "r"), prepared=request)
    stored = store.read("s")
    assert [s.message.id for s in stored] == ["m0", "m1", "m2", "q", "r"]
    assert [s.tokens for s in stored[:4]] == [*before, None]
    assert stored[4].tokens == approx.core.counter.count_message(_message("assistant", "r"))
    approx.close()
    tiktoken.close()


@pytest.mark.redis
def test_the_token_read_is_sent_before_the_plan_and_a_failed_plan_gives_its_connection_back(
    redis_url: str, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The read's round trip overlaps the plan (its packet is out when the plan starts);
    a plan that raises takes the read's reply, so the connection goes back in step."""
    import redis.connection

    sent: list[bytes] = []
    send = redis.connection.AbstractConnection.send_packed_command

    def counted(conn: Any, command: Any, *args: Any, **kwargs: Any) -> Any:
        sent.append(b"".join(command) if isinstance(command, list) else bytes(command))
        return send(conn, command, *args, **kwargs)

    store = open_store(redis_url, namespace=namespace)
    guard = Guard(store, counter="approx", limit=400, max_tokens=60, commit="with_reply")
    _turn(guard, 0)
    _turn(guard, 1)
    monkeypatch.setattr(redis.connection.AbstractConnection, "send_packed_command", counted)
    plan = guard.core.speculate
    seen_at_plan: list[list[bytes]] = []

    def watched(*args: Any, **kwargs: Any) -> Any:
        seen_at_plan.append(list(sent))
        return plan(*args, **kwargs)

    monkeypatch.setattr(guard.core, "speculate", watched)
    _turn(guard, 2)
    assert len(seen_at_plan) == 1 and len(seen_at_plan[0]) == 1 and b"HMGET" in seen_at_plan[0][0]

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a bug in the plan")

    monkeypatch.setattr(guard.core, "speculate", broken)
    for _ in range(3):  # (a connection left out of step would answer the next call wrongly)
        with pytest.raises(RuntimeError):
            guard.prepare("s", [_message("user", "lost")])
    monkeypatch.setattr(guard.core, "speculate", plan)
    _turn(guard, 3)
    assert [s.message.id for s in store.read("s")][-2:] == ["q3", "a3"]
    pool = store.client.connection_pool
    assert len(pool._in_use_connections) == 0  # every connection given back
    guard.close()


@pytest.mark.redis
@pytest.mark.parametrize("failure", ["lost", "error-reply"])
def test_a_sent_token_read_whose_reply_fails_is_read_again_whole(
    redis_url: str, namespace: str, failure: str
) -> None:
    """A reply lost (the connection dropped) or an error reply: the read goes again the
    whole way (retried, under the deadline), and the connection is dropped or given back."""
    import redis as redis_py

    store = open_store(redis_url, namespace=namespace)
    guard = Guard(store, counter="approx", limit=400, max_tokens=60, commit="with_reply")
    _turn(guard, 0)
    want = store.state_token("s")
    sent = store.send_state_token("s")
    assert sent is not None
    conn = sent.conn
    original = conn.read_response
    exc = redis_py.ConnectionError("lost") if failure == "lost" else redis_py.ResponseError("x")

    def failing(*args: Any, **kwargs: Any) -> Any:
        conn.read_response = original  # (once: the whole read may take this connection)
        original(*args, **kwargs)  # (the reply is read: a ResponseError leaves it in step)
        raise exc

    conn.read_response = failing
    assert store.state_token_reply(sent, "s") == want
    assert sent.conn is None  # taken once
    assert len(store.client.connection_pool._in_use_connections) == 0
    assert store.state_token_reply(None, "s") == want  # (no send: a whole read)
    guard.close()
