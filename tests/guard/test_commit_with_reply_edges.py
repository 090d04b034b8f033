"""``commit="with_reply"`` at its edges: the cap, and one request completed twice.

With ``max_stored_messages``, a turn that could not store its reply is refused at
``prepare``, before the model is called, and stores nothing (the default mode stores the
user message at prepare and finds the cap full only at the reply's append; a prepare that
stores nothing must say it before the request is sent, or the model's answer is lost).

A request completed again with the same reply (a retry) stores nothing twice; completed
with another reply (a second choice), that reply is stored with a record of its own, as
the default mode stores a second reply, not dropped as a retry.
"""

from __future__ import annotations

import pytest

from ctxguard import Guard
from ctxguard.errors import SessionFullError
from ctxguard.guard.replay import replay_records
from ctxguard.messages import Message
from ctxguard.stores import open_store
from tests import store_diff


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
