"""A stored message record keeps its creation time as ``"t": <microseconds>`` (last in
the record) when the time is at UTC offset zero; records written the earlier way
(``"created_at": "<ISO 8601>"``) read exactly as before, through every read path:
``read()``, the window script's fetch, the plain-read fetch (window_reads.py) and the
CLI (tests/cli/test_record_time_cli.py).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from ctxguard.messages import Message, expand_record, iso_record
from ctxguard.stores import NewMessage, WriteOptions, open_store
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
        assert json.loads(new)["t"] == (message.created_at - datetime(1970, 1, 1, tzinfo=UTC)) // (
            timedelta(microseconds=1)
        )
        assert "created_at" not in json.loads(new) and len(new) < len(old)
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


@pytest.mark.parametrize("which", ["all", "half"])
def test_records_written_the_earlier_way_read_as_before(
    target: tuple[Any, str], which: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, url = target
    messages = [Message(role="system", content="be brief")] + [
        Message(role="user" if i % 2 else "assistant", content=f"turn {i} " * 3) for i in range(40)
    ]
    options = WriteOptions(counter="c1")
    store.append("s", [NewMessage(m, 5) for m in messages], options)
    old = {seq: iso_record(m) for seq, m in enumerate(messages) if which == "all" or seq % 2 == 0}
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
