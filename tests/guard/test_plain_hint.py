"""The window cache knows when a cached window holds no tool message (``Plan.plain``,
``WindowCache.get_for_plan``), so a warm turn's plan skips ``policies._plain`` and the
post-check's ``tool_problems`` (issue 16, client CPU); requests stay exactly the
fetched ones, tool turns or not."""

from __future__ import annotations

import random
import uuid
from typing import Any

import pytest

from ctxguard import Guard
from ctxguard.guard import policies
from ctxguard.guard.prepared import PreparedRequest
from ctxguard.messages import Message
from ctxguard.stores.memory import MemoryStore

SYSTEM = {"role": "system", "content": "You answer briefly."}


def make_guard(store: MemoryStore, **settings: Any) -> Guard:
    return Guard(store, counter="approx", limit=400, max_tokens=60, **settings)


def with_ids(batch: list[dict[str, Any]]) -> list[Message]:
    """Messages with ids, so that the oracle's prepare of the same batch appends nothing."""
    return [Message(**m, id="m" + uuid.uuid4().hex[:12]) for m in batch]


def same_request(got: PreparedRequest, want: PreparedRequest) -> None:
    assert [m.id for m in got.messages] == [m.id for m in want.messages]
    assert got.tokens == want.tokens and got.dropped == want.dropped
    assert got.sent_seqs == want.sent_seqs and got.decisions == want.decisions


def words(rng: random.Random) -> str:
    return " ".join(["word"] * rng.randint(1, 40))


def tool_turn(rng: random.Random, index: int) -> list[dict[str, Any]]:
    ids = [f"call{index}x{k}" for k in range(rng.randint(1, 2))]
    calls = [
        {"id": i, "type": "function", "function": {"name": "f", "arguments": "{}"}} for i in ids
    ]
    return [
        {"role": "assistant", "content": None, "tool_calls": calls},
        *({"role": "tool", "tool_call_id": i, "content": words(rng)} for i in ids),
    ]


def test_warm_plain_turns_skip_the_tool_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    guard = make_guard(MemoryStore())
    guard.append("s", [SYSTEM])
    for n in range(4):  # the first turn fetches; the cache then knows the window
        guard.prepare("s", [{"role": "user", "content": f"q{n} " + "word " * 30}])
        guard.complete("s", {"role": "assistant", "content": f"a{n} " + "word " * 30})

    def not_called(*args: Any) -> Any:
        raise AssertionError("a pass the cache's plain flag makes needless")

    monkeypatch.setattr(policies, "_plain", not_called)
    monkeypatch.setattr(policies, "tool_problems", not_called)
    for n in range(6):
        got = guard.prepare("s", [{"role": "user", "content": f"more{n} " + "word " * 30}])
        assert got.dropped  # the window slides
        guard.complete("s", {"role": "assistant", "content": f"r{n}"})


@pytest.mark.parametrize("seed", range(40))
def test_cached_requests_equal_fetched_ones_with_tool_turns(seed: int) -> None:
    """Random sessions of plain and tool turns (tool calls kept or slid out of the window,
    sent as the turn's new messages or stored as the reply): the cached guard's request is
    the fetching guard's, and its flag is never True over a window with a tool message."""
    rng = random.Random(seed)
    store = MemoryStore()
    guard, oracle = make_guard(store), make_guard(store, window_cache_size=0)
    sid = "s" + uuid.uuid4().hex[:8]
    guard.append(sid, [SYSTEM])
    for index in range(rng.randint(5, 30)):
        new: list[dict[str, Any]] = []
        if rng.random() < 0.3:
            new += tool_turn(rng, index)
            new.append({"role": "assistant", "content": words(rng)})
        new.append({"role": "user", "content": words(rng)})
        batch = with_ids(new)
        got = guard.prepare(sid, batch)
        same_request(got, oracle.prepare(sid, batch))
        found = guard.core.cache.get_for_plan(sid)
        if found is not None and found[2]:
            assert not any(
                s.message.role == "tool" or s.message.tool_calls for s in found[0].recent
            )
        if rng.random() < 0.2:
            reply: dict[str, Any] = tool_turn(rng, 1000 + index)[0]
            guard.complete(sid, reply)
            results = tool_turn(rng, 1000 + index)[1:]
            for r, c in zip(results, reply["tool_calls"], strict=False):
                r["tool_call_id"] = c["id"]
            user = {"role": "user", "content": words(rng)}
            batch = with_ids([*results[: len(reply["tool_calls"])], user])
            got = guard.prepare(sid, batch)
            same_request(got, oracle.prepare(sid, batch))
        else:
            guard.complete(sid, {"role": "assistant", "content": words(rng)})
        found = guard.core.cache.get_for_plan(sid)
        if found is not None and found[2]:
            assert not any(
                s.message.role == "tool" or s.message.tool_calls for s in found[0].recent
            )
