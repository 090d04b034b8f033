"""A stored message record keeps its creation time as ``"t": <microseconds>`` (last in
the record) when the time is at UTC offset zero, and a plain message is the positional
record ``["u",<content>,"<id>",<time>]`` (tests/test_positional_record.py); records
written the earlier way (``"created_at": "<ISO 8601>"``) read exactly as before, and
sessions mixing the three forms read, retract and audit as one written the earlier way,
through every read path: ``read()``, the window script's fetch, the plain-read fetch
(window_reads.py), retract, audit / repair and the CLI (tests/cli/test_record_time_cli.py).
A damaged positional record is a CorruptRecordError on every backend, nothing written.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from ctxguard.errors import CorruptRecordError
from ctxguard.guard import Guard
from ctxguard.messages import Message, expand_record, iso_record
from ctxguard.stores import NewMessage, WriteOptions, open_store
from ctxguard.stores.integrity import find_problems, plan_repair
from ctxguard.stores.keys import KeySpace
from ctxguard.stores.redis_clients import as_fetch
from tests.conftest import purge_namespace, raw_client

WHEN = datetime(2026, 12, 2, 3, 44, 8, 205652, tzinfo=UTC)
CALL = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}


def samples() -> list[Message]:
    return [
        Message(role="user", content="hello there, how are you today?"),
        Message.from_openai({"role": "assistant", "content": "fine"}),  # the plain path
        Message(role="user", content="x", created_at=WHEN),
        Message(role="user", content="x", created_at=WHEN.replace(microsecond=0)),
        Message(role="user", content='ends like one,"t":5}', metadata={"a": 1, "t": 5}),
        Message(role="user", content="x", extra={"t": 7}),
        Message(role="assistant", content=None, tool_calls=[CALL]),
        Message(role="tool", content="r", tool_call_id="c1", name="f"),
        Message(role="user", content="x", created_at=datetime(1970, 1, 1, tzinfo=UTC)),
        # kept in ISO form: another offset, naive, before 1970
        Message(role="user", content="x", created_at=WHEN.astimezone(timezone(timedelta(hours=2)))),
        Message(role="user", content="x", created_at=WHEN.replace(tzinfo=None)),
        Message(role="user", content="x", created_at=WHEN.replace(tzinfo=None), extra={"t": 5}),
        Message(role="user", content="x", created_at=datetime(1969, 7, 20, 20, 17, tzinfo=UTC)),
    ]


def plain(message: Message) -> bool:
    """Whether the positional record's rules take ``message`` (its time checked apart)."""
    return (
        message.role != "tool"
        and isinstance(message.content, str)
        and message.name is None
        and message.tool_calls is None
        and not message.metadata
        and not message.extra
    )


def same(a: Message, b: Message) -> bool:
    return (
        a.__dict__ == b.__dict__
        and a.created_at.utcoffset() == b.created_at.utcoffset()
        and a.created_at.isoformat() == b.created_at.isoformat()
    )


@pytest.mark.parametrize("message", samples(), ids=lambda m: m.content or "none")
def test_compact_record_reads_as_the_iso_record(message: Message) -> None:
    new, old = message.to_record(), iso_record(message)
    assert json.loads(old)["created_at"]  # the earlier record, as earlier releases wrote it
    read_new, read_old = Message.from_record(new), Message.from_record(old)
    assert same(read_new, read_old)
    assert same(Message.from_record(new.encode()), read_old)  # bytes, as Redis answers
    assert read_new == message
    offset = message.created_at.utcoffset()
    if offset == timedelta(0) and message.created_at >= datetime(1970, 1, 1, tzinfo=UTC):
        micros = (message.created_at - datetime(1970, 1, 1, tzinfo=UTC)) // (
            timedelta(microseconds=1)
        )
        value = json.loads(new)
        if plain(message):
            assert isinstance(value, list) and len(value) == 4 and value[1] == message.content
        else:
            assert value["t"] == micros and "created_at" not in value
        assert len(new) < len(old)
    else:
        assert new == old  # nothing else changes
    assert expand_record(old) == old and expand_record(old.encode()) == old.encode()
    assert read_new.to_record() == new  # and it is written back the same


def test_a_record_not_ending_in_a_time_is_left_to_the_validation() -> None:
    for raw in ['{"role":"user","content":"x","t":-5}', '{"role":"user","content":"x","t":5']:
        assert expand_record(raw) == raw
    with pytest.raises(ValueError):
        Message.from_record('{"role":"user","content":"x","t":99999999999999999999}')


# -- every read path over records written the earlier way -----------------------------


@pytest.fixture(params=["memory", "redis_url", "cluster_url"])
def target(request: pytest.FixtureRequest, namespace: str) -> Iterator[tuple[Any, str]]:
    if request.param == "memory":
        url = f"memory://{namespace}"
    else:
        url = request.getfixturevalue(request.param)
    store = open_store(url, namespace=namespace)
    yield store, url
    store.close()
    if request.param != "memory":
        purge_namespace(url, namespace)


def rewrite(store: Any, url: str, session_id: str, records: dict[int, str]) -> None:
    """Overwrite stored records behind the store's back (the earlier release's writes)."""
    if url.startswith("memory://"):
        inner = getattr(store, "sync", store)
        with inner._lock:
            for seq, raw in records.items():
                inner._sessions[session_id].records[seq] = raw
        return
    key = KeySpace(store.namespace, store.tenant).session_keys(session_id)[1]
    client = raw_client(url)
    try:
        for seq, raw in records.items():
            client.lset(key, seq, raw)
    finally:
        client.close()


def mixed_messages() -> list[Message]:
    """Plain messages (positional records, ULID and other ids), others ("t")."""
    out = [Message(role="system", content="be brief")]
    for i in range(40):
        role = "user" if i % 2 else "assistant"
        text = f'turn {i} "q" \\ ' * 3
        if i % 5 == 1:
            out.append(Message(role=role, content=text, metadata={"i": i}))  # "t"
        elif i % 5 == 2:
            out.append(Message(role=role, content=text, id=f'id-{i}"\\'))  # not a ULID
        elif i % 5 == 3:
            out.append(Message.from_openai({"role": role, "content": text}))  # the plain path
        else:
            out.append(Message(role=role, content=text))
    return out


def forms(records: list[str]) -> set[str]:
    return {
        "array" if r.startswith("[") else "iso" if '"created_at"' in r else "t" for r in records
    }


@pytest.mark.parametrize("which", ["all", "half", "none"])
def test_records_written_the_earlier_way_read_as_before(
    target: tuple[Any, str], which: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, url = target
    messages = mixed_messages()
    options = WriteOptions(counter="c1")
    store.append("s", [NewMessage(m, 5) for m in messages], options)
    assert forms([m.to_record() for m in messages]) == {"array", "t"}
    chosen = {"all": lambda seq: True, "half": lambda seq: seq % 2 == 0}.get(which, lambda s: False)
    old = {seq: iso_record(m) for seq, m in enumerate(messages) if chosen(seq)}
    assert all(json.loads(r)["created_at"] for r in old.values())
    expected = [Message.from_record(iso_record(m)) for m in messages]
    rewrite(store, url, "s", old)

    read = store.read("s")
    assert [s.seq for s in read] == list(range(len(messages)))
    assert all(same(s.message, e) for s, e in zip(read, expected, strict=True))

    def check(window: Any) -> None:
        assert window.token is not None and len(window.recent) > 5
        for stored in [*window.recent, *window.pinned]:
            if stored.seq >= len(expected):
                continue  # the new message
            assert same(stored.message, expected[stored.seq])

    new = [NewMessage(Message(role="user", content="next"), 2)]
    if url.startswith("memory://"):
        check(store.fetch_window("s", 120, options, new))
        return
    # the script's fetch
    call = store.protocol.window_call("s", 120, options, new, 0)
    check(as_fetch(store.protocol.parse_window("s", new, store._run(call), options)))

    # the plain reads (no script may run)
    def no_script(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the plain reads fell back to the script")

    monkeypatch.setattr(store, "_run", no_script)
    check(store.fetch_window("s", 120, options, new))


def seeded(store: Any, url: str) -> list[Message]:
    """A session mixing the three forms: positional, "t" and (every third) ISO records."""
    messages = mixed_messages()
    store.append("s", [NewMessage(m, 5) for m in messages], WriteOptions(counter="c1"))
    rewrite(store, url, "s", {seq: iso_record(m) for seq, m in enumerate(messages) if seq % 3 == 0})
    assert forms(raw_records(store)) == {"array", "t", "iso"}
    return messages


def raw_records(store: Any) -> list[str]:
    raw = store.inspect("s")
    return [r.decode() if isinstance(r, bytes) else r for r in raw.records]


def test_a_mixed_session_retracts_every_form(target: tuple[Any, str]) -> None:
    """retract.lua finds each removed record's id (the array's third element too): the
    record of the retraction names them all and ids forgets them (else its position
    fallback would free the ids but leave them out of the record)."""
    store, url = target
    messages = seeded(store, url)
    removed = store.retract("s", 7)
    gone = [m.id for m in messages[-7:]]
    assert forms(raw_records(store)) == {"array", "t", "iso"}  # what is left, as it was
    assert [r.message.id for r in removed] == gone
    assert forms([iso_record(m) for m in messages[-7:]]) == {"iso"}
    assert forms([m.to_record() for m in messages[-7:]]) == {"array", "t"}
    assert store.read_audit("s")[-1]["ids"] == gone
    raw = store.inspect("s")
    held = {(k.decode() if isinstance(k, bytes) else k) for k in raw.ids}
    assert held == {m.id for m in messages[:-7]}
    again = store.append("s", [NewMessage(messages[-1], 5)], WriteOptions(counter="c1"))
    assert again.stored == (messages[-1].id,)  # its id is free again


def test_a_mixed_session_audits_clean_and_repairs(target: tuple[Any, str]) -> None:
    store, url = target
    messages = seeded(store, url)
    raw = store.inspect("s")
    assert find_problems("s", raw) == []
    plan = plan_repair("s", raw, 1, 0)
    assert plan.ids == [m.id for m in messages]
    # with ids emptied behind the store's back, audit names it and repair rebuilds it
    if url.startswith("memory://"):
        inner = getattr(store, "sync", store)
        with inner._lock:
            inner._sessions["s"].ids.clear()
    else:
        client = raw_client(url)
        try:
            client.delete(KeySpace(store.namespace, store.tenant).session_keys("s")[3])
        finally:
            client.close()
    raw = store.inspect("s")
    assert [p.key for p in find_problems("s", raw)] == ["ids"]
    assert store.repair("s", plan_repair("s", raw, 1, 0), {"kind": "repair", "rid": "r1"})
    assert find_problems("s", store.inspect("s")) == []
    assert [s.message.id for s in store.read("s")] == [m.id for m in messages]


GOOD_ARRAY = Message(role="user", content="fine", id="01M8TPGMZ9096T539X8BKPDQCF").to_record()
DAMAGED_ARRAYS = {
    "truncated": GOOD_ARRAY[:-3],
    "wrong-role-code": GOOD_ARRAY.replace('["u"', '["x"', 1),
    "time-not-int": GOOD_ARRAY[:-1].rsplit(",", 1)[0] + ",1.5]",
    "extra-element": GOOD_ARRAY[:-1] + ",7]",
    "extra-in-the-middle": GOOD_ARRAY.replace('"fine",', '"fine","more",', 1),
}


@pytest.mark.parametrize("raw", DAMAGED_ARRAYS.values(), ids=DAMAGED_ARRAYS.keys())
def test_a_damaged_positional_record_is_corrupt_and_nothing_is_written(
    target: tuple[Any, str], raw: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, url = target
    messages = seeded(store, url)
    rewrite(store, url, "s", {len(messages) - 2: raw})
    before = store.inspect("s")
    new = [NewMessage(Message(role="user", content="next"), 2)]
    options = WriteOptions(counter="c1")
    with pytest.raises(CorruptRecordError) as caught:
        store.read("s")
    assert str(len(messages) - 2) in str(caught.value)
    with pytest.raises(CorruptRecordError):
        store.fetch_window("s", 120, options, new)
    guard = Guard(store, limit=400, max_tokens=60, counter="approx")
    with pytest.raises(CorruptRecordError):
        guard.prepare("s", [{"role": "user", "content": "next"}])
    if not url.startswith("memory://"):
        call = store.protocol.window_call("s", 120, options, new, 0)
        with pytest.raises(CorruptRecordError):
            store.protocol.parse_window("s", new, store._run(call), options)

        def no_script(*args: Any, **kwargs: Any) -> Any:
            raise AssertionError("the plain reads fell back to the script")

        monkeypatch.setattr(store, "_run", no_script)
        with pytest.raises(CorruptRecordError):
            store.fetch_window("s", 120, options, new)
        monkeypatch.undo()
    after = store.inspect("s")
    assert (after.records, after.ids, after.toks, after.meta) == (
        before.records,
        before.ids,
        before.toks,
        before.meta,
    )
