"""Two tool calls with one id in one new assistant message are refused at every door
that stores new messages (append, prepare, complete), on memory, Redis and Redis
Cluster, with the window cache and without: a one-line ``InvalidMessageError`` naming
the id, and nothing stored.

Why refuse: no result can say which of the two calls it answers, and OpenAI-style
servers reject such a request ("Duplicate value for 'tool_call_id'"); stored, it
would make every later request of the session fail (models that number their calls
per response emit it). An id may still recur in a *later* call message
(``test_tool_edges.test_a_tool_call_id_may_recur_in_a_later_call``).

One stored all the same (an import, or a write through the store) is left out of every
request with its results: its group is never whole (``policies._repair``), and a new
result for it is refused.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from ctxguard import Guard
from ctxguard.errors import InvalidMessageError
from ctxguard.messages import Message
from ctxguard.stores.contract import NewMessage
from tests.guard.test_refusals import call, guard_on, open_one, result, said, snapshot
from tests.guard.test_tool_edges import CACHED, refused, well_formed

__all__ = ["open_one"]  # the fixture: memory, Redis, cluster


def twice(call_id: str, *more: str) -> Message:
    """An assistant message whose tool_calls give ``call_id`` to two calls."""
    return call(call_id, *more, call_id)


def started(store: Any, cached: bool) -> Guard:
    guard = guard_on(store, cached, limit=2000)
    guard.prepare("s", [said("weather in two cities?")])
    guard.complete("s", said("which cities?", "assistant"))
    return guard


def refuses(error: pytest.ExceptionInfo[InvalidMessageError], call_id: str) -> None:
    text = str(error.value)
    assert "\n" not in text and "internal error" not in text
    assert f"the id {call_id!r}" in text and "its own id" in text


@CACHED
def test_prepare_refuses_a_batch_with_a_call_id_twice_in_one_message(
    open_one: Callable[[], Any], cached: bool
) -> None:
    """Stores nothing, leaves a ``refused`` record; the session goes on."""
    store = open_one()
    guard = started(store, cached)
    batch = [said("Paris and Rome"), twice("c1", "c2"), result("c1"), result("c2")]
    error = refused(guard, store, "s", batch, InvalidMessageError)
    assert "the id 'c1'" in str(error)
    ok = guard.prepare("s", [said("Paris and Rome"), call("c1", "c2"), result("c1"), result("c2")])
    well_formed(ok.messages)
    guard.close()


@CACHED
def test_complete_refuses_a_reply_with_a_call_id_twice_and_stores_nothing(
    open_one: Callable[[], Any], cached: bool
) -> None:
    store = open_one()
    guard = started(store, cached)
    prepared = guard.prepare("s", [said("Paris and Rome")])
    before = snapshot(store, "s")
    with pytest.raises(InvalidMessageError) as caught:
        guard.complete("s", twice("c7"), prepared=prepared, usage={"prompt_tokens": 9})
    refuses(caught, "c7")
    assert snapshot(store, "s") == before
    # the held request record (if any) and the session are as they were: a good reply goes in
    guard.complete("s", call("c7", "c8"), prepared=prepared)
    ok = guard.prepare("s", [result("c7"), result("c8")])
    well_formed(ok.messages)
    assert [m.role for m in ok.messages][-3:] == ["assistant", "tool", "tool"]
    guard.close()


@CACHED
def test_append_refuses_a_call_id_twice_and_stores_nothing_of_the_batch(
    open_one: Callable[[], Any], cached: bool
) -> None:
    store = open_one()
    guard = started(store, cached)
    before = snapshot(store, "s")
    with pytest.raises(InvalidMessageError) as caught:
        guard.append("s", [said("fine"), twice("c1"), result("c1")])
    refuses(caught, "c1")
    assert snapshot(store, "s") == before
    guard.close()


@pytest.mark.parametrize("calls", [("a", "b", "a"), ("a", "a"), ("x", "y", "z", "y")])
def test_every_position_of_the_repeat_is_found(calls: tuple[str, ...]) -> None:
    from ctxguard.stores import MemoryStore

    guard = started(MemoryStore("dup"), True)
    with pytest.raises(InvalidMessageError) as caught:
        guard.append("s", [call(*calls)])
    repeated = next(c for i, c in enumerate(calls) if c in calls[:i])
    refuses(caught, repeated)
    guard.append("s", [call(*dict.fromkeys(calls))])  # the same calls, each id once: stored
    guard.close()


@CACHED
def test_a_stored_call_message_repeating_an_id_is_left_out_and_not_answered(
    open_one: Callable[[], Any], cached: bool
) -> None:
    """An assistant message giving two of its calls one id, stored by an import or
    through the store (new ones are refused): strict servers refuse the repeated id, so
    it is left out with its result (a tool_integrity decision) and every request is
    well-formed; a new result for such a message is a typed refusal that stores
    nothing, and the session goes on with a new user message."""
    store = open_one()
    guard = guard_on(store, cached, limit=2000)
    options = guard.core.write_options
    guard.prepare("s", [said("weather?")])
    repeated, answer = twice("c1"), result("c1", "sunny")
    store.append("s", [NewMessage(repeated), NewMessage(answer)], options)
    got = guard.prepare("s", [said("and tomorrow?")])
    well_formed(got.messages)
    sent = [m.id for m in got.messages]
    assert repeated.id not in sent and answer.id not in sent
    assert any(d["policy"] == "tool_integrity" for d in got.decisions)
    guard.complete("s", said("rain", "assistant"))
    again = twice("c2", "c3")
    store.append("s", [NewMessage(again)], options)
    error = refused(guard, store, "s", [result("c2"), result("c3")], InvalidMessageError)
    assert repr(again.id) in str(error) and "one id" in str(error)
    ok = guard.prepare("s", [said("thanks")])
    well_formed(ok.messages)
    assert again.id not in [m.id for m in ok.messages]
    guard.close()
