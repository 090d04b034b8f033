"""``RedisProtocol.parse_append`` answers a one-message append without the general
pass (a turn's user message and reply); what it answers, or raises, must be what the
general pass (the reference below, the parser as it was) answers for every reply."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import pytest

from ctxguard.errors import SessionFullError
from ctxguard.messages import Message
from ctxguard.stores import NewMessage
from ctxguard.stores.base import AppendResult
from ctxguard.stores.keys import KeySpace
from ctxguard.stores.redis_protocol import RedisProtocol


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _reference(session_id: str, messages: Sequence[NewMessage], reply: Any) -> AppendResult:
    count, flags = reply[0], reply[1]
    if int(count) < 0:
        raise SessionFullError(session_id, int(flags))
    stored = tuple(m.message.id for m, f in zip(messages, flags, strict=True) if int(f) != 0)
    dups = tuple(m.message.id for m, f in zip(messages, flags, strict=True) if int(f) == 0)
    before = _text(reply[2]) or None if len(reply) > 3 else None
    after = _text(reply[3]) or None if len(reply) > 3 else None
    return AppendResult(stored, dups, int(count), before, after)


def _outcome(fn: Any, *args: Any) -> tuple[str, Any]:
    try:
        result = fn(*args)
    except Exception as exc:  # the same error, in the same words
        return type(exc).__name__, str(exc)
    fields = (result.token_before, result.token_after)  # (compare=False fields)
    return "result", (result, fields, [type(x) for x in (result.message_count, *fields)])


def _reply(rng: random.Random, n: int) -> list[Any]:
    count: Any = rng.choice([0, 1, 5, 10**6, -1, b"7", "8"])
    flags: Any = [
        rng.choice([0, 1, 2, b"1", b"0", "2"]) for _ in range(n + rng.choice([0, 0, 0, 1, -1]))
    ]
    if count == -1:
        flags = rng.choice([3, b"4"])
    reply: list[Any] = [count, flags]
    if rng.random() < 0.8:
        reply += [rng.choice([b"", b"1:2:3", "x", 5]), rng.choice([b"", b"1:3:4", "y"])]
    elif rng.random() < 0.5:
        reply += [b"1:2:3"]  # three elements: no tokens read
    return reply


@pytest.mark.parametrize("seed", range(4))
def test_parse_append_answers_as_the_general_pass(seed: int) -> None:
    rng = random.Random(seed)
    protocol = RedisProtocol(KeySpace("ns", "t"))
    for _ in range(500):
        n = rng.choice([0, 1, 1, 1, 2, 3])
        messages = [
            NewMessage(Message(role="user", content=f"m{i}", id=f"id-{i}-{rng.randrange(99)}"), 1)
            for i in range(n)
        ]
        reply = _reply(rng, n)
        assert _outcome(protocol.parse_append, "s", messages, reply) == _outcome(
            _reference, "s", messages, reply
        ), (messages, reply)
