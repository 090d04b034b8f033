"""``commit="with_reply"`` with ``max_stored_messages``: a turn that could not store its
reply is refused at ``prepare``, before the model is called, and stores nothing.

The default mode stores the user message at prepare and finds the cap full only at the
reply's append (the session keeps a user turn without a reply); a prepare that stores
nothing must say it before the request is sent, or the model's answer is lost at complete.
"""

from __future__ import annotations

import pytest

from ctxguard import Guard
from ctxguard.errors import SessionFullError
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
