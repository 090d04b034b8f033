"""A new message's stored record is the JSON its validation made (``messages.record_of``:
made once, not twice), and exactly what ``to_record()`` gives at the time of the append:
a Message the caller built and changed since is serialised again."""

from __future__ import annotations

import json
import uuid

from ctxguard import Guard
from ctxguard.messages import Message, record_of
from tests.conftest import private_memory_url


def stored_records(guard: Guard, session: str) -> list[dict[str, object]]:
    return [json.loads(s.message.to_record()) for s in guard.store.read(session)]


def test_a_dict_message_is_stored_as_its_record() -> None:
    guard = Guard(private_memory_url(), counter="approx", limit=4000, max_tokens=100)
    new = guard.core.encode_new([{"role": "user", "content": "hi", "metadata": {"k": [1]}}])
    assert new[0].record == new[0].message.to_record()
    assert json.loads(new[0].record)["metadata"] == {"k": [1]}


def test_a_message_changed_after_it_was_made_is_stored_as_it_is_now() -> None:
    sid = uuid.uuid4().hex
    guard = Guard(private_memory_url(), counter="approx", limit=4000, max_tokens=100)
    message = Message(role="user", content="hi", metadata={"step": 1})
    message.metadata["step"] = 2  # frozen model, mutable dict: what is stored is what it holds
    new = guard.core.encode_new([message])
    assert json.loads(new[0].record)["metadata"] == {"step": 2}
    guard.prepare(sid, [message])
    assert stored_records(guard, sid)[0]["metadata"] == {"step": 2}


def test_record_of_gives_the_validation_json_once_then_serialises_again() -> None:
    message = Message(role="user", content="hi")
    first = record_of(message)
    assert first == message.to_record()
    other = Message(role="user", content="other")
    assert record_of(message) == message.to_record()  # not the newer message's JSON
    assert record_of(other) == other.to_record()


def test_a_reply_is_stored_as_its_record_and_a_shrunk_one_as_shrunk() -> None:
    sid = uuid.uuid4().hex  # memory:// is one store per process
    guard = Guard(private_memory_url(), counter="approx", limit=4000, max_tokens=100,
                  max_message_tokens=20, oversized="truncate")  # fmt: skip
    req = guard.prepare(sid, [{"role": "user", "content": "hi"}])
    guard.complete(
        sid, {"role": "assistant", "content": "fine", "metadata": {"n": 1}}, prepared=req
    )
    guard.complete(sid, {"role": "assistant", "content": "word " * 400})  # over the cap
    stored = guard.store.read(sid)
    assert json.loads(stored[1].message.to_record())["metadata"] == {"n": 1}
    shrunk = stored[2].message
    assert len(shrunk.text) < 400 * 5
    assert stored[2].tokens == guard.counter.count_message(shrunk)


def test_a_reply_message_changed_after_it_was_made_is_stored_as_it_is_now() -> None:
    sid = uuid.uuid4().hex
    guard = Guard(private_memory_url(), counter="approx", limit=4000, max_tokens=100)
    guard.prepare(sid, [{"role": "user", "content": "hi"}])
    reply = Message(role="assistant", content="ok", metadata={"step": 1})
    reply.metadata["step"] = 2
    guard.complete(sid, reply)
    assert stored_records(guard, sid)[1]["metadata"] == {"step": 2}
