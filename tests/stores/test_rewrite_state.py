"""retract and replace_tail: the exact precondition (``expected_state``), and a removed
record that does not decode, on every backend, sync and async.

A caller that chose what to remove from a read checked the message COUNT only: another
writer that retracted one message and appended another between the read and the
rewrite (ABA) left the count as it was, and the rewrite removed the wrong message.
The state token of the read (``read_with_token``) moves on with every write.

A removed record that does not decode made the Redis parse raise AFTER the script had
written (the caller saw an error for a write that happened, and may retry it): the
script now refuses it before its first write, as the memory store always did; a
record that is JSON with an id but not a message this version reads is removed and
returned flagged, never an error after the write.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from ctxguard import ConflictError, InvalidInputError, Message
from ctxguard.errors import CorruptRecordError
from ctxguard.stores import NewMessage, WriteOptions
from ctxguard.stores.keys import KeySpace
from tests.conftest import raw_client

if TYPE_CHECKING:
    from tests.conftest import StoreFacade, StoreFactory

OPTIONS = WriteOptions(counter="c1")


def batch(n: int, start: int = 0) -> list[NewMessage]:
    return [
        NewMessage(Message(role="user", content=f"m{i}", id=f"id{i}"), 3)
        for i in range(start, start + n)
    ]


async def ids(store: StoreFacade) -> list[str]:
    return [s.message.id for s in await store.read("s")]


async def aba(store: StoreFacade) -> str:
    """Four messages read with their token; then another writer retracts the newest
    and appends another: the count is 4 again, the token is not."""
    await store.append("s", batch(4), OPTIONS)
    found, token = await store.read_with_token("s", 0)
    assert [s.message.id for s in found] == ["id0", "id1", "id2", "id3"]
    await store.retract("s", 1)
    await store.append("s", batch(1, start=50), OPTIONS)
    assert (await store.info("s")).message_count == 4
    return str(token)


async def test_a_retract_based_on_a_read_is_refused_after_an_aba(store: StoreFacade) -> None:
    token = await aba(store)
    with pytest.raises(ConflictError, match="written since it was read"):
        await store.retract("s", 1, 4, expected_state=token)  # the count still matches
    assert await ids(store) == ["id0", "id1", "id2", "id50"]
    _, fresh = await store.read_with_token("s", -1)
    assert [r.message.id for r in await store.retract("s", 1, 4, expected_state=fresh)] == ["id50"]


async def test_a_replace_based_on_a_read_is_refused_after_an_aba(store: StoreFacade) -> None:
    token = await aba(store)
    rest = batch(2, start=2)  # delete_message(1) as read: id2, id3 put back
    with pytest.raises(ConflictError, match="written since it was read"):
        await store.replace_tail("s", 1, rest, 4, OPTIONS, token)
    assert await ids(store) == ["id0", "id1", "id2", "id50"]
    tail, fresh = await store.read_with_token("s", 1)
    again = [NewMessage(s.message, s.tokens) for s in tail[1:]]
    await store.replace_tail("s", 1, again, 4, OPTIONS, expected_state=fresh)
    assert await ids(store) == ["id0", "id2", "id50"]


async def test_the_read_token_is_the_windows_and_no_session_is_empty(
    store: StoreFacade,
) -> None:
    assert await store.read_with_token("s") == ([], "")
    assert await store.retract("s", 1, expected_state="") == []
    with pytest.raises(ConflictError):
        await store.retract("s", 1, expected_state="m1:0")
    with pytest.raises(ConflictError):
        await store.replace_tail("s", 0, batch(1), None, OPTIONS, "m1:0")
    assert await store.info("s") is None
    await store.replace_tail("s", 0, batch(2), None, OPTIONS, "")  # a new session
    found, token = await store.read_with_token("s", -1)
    assert [s.message.id for s in found] == ["id1"] and token
    assert token == (await store.fetch_window("s", 1000, OPTIONS)).token


async def test_a_bad_expected_state_is_refused_before_the_store(store: StoreFacade) -> None:
    await store.append("s", batch(2), OPTIONS)
    for bad in (1, b"tok", ["tok"]):
        with pytest.raises(InvalidInputError, match="expected_state"):
            await store.retract("s", 1, None, 0, bad)
        with pytest.raises(InvalidInputError, match="expected_state"):
            await store.replace_tail("s", 0, batch(1), None, OPTIONS, bad)
    assert await ids(store) == ["id0", "id1"]


# -- a removed record that does not decode ------------------------------------------------


def damage_newest(factory: StoreFactory, store: StoreFacade, raw: bytes) -> None:
    """Overwrite the newest record of session "s" behind the store's back (the lengths
    stay consistent: only the record is damaged)."""
    if factory.backend == "memory":
        inner = getattr(store.raw, "sync", store.raw)
        with inner._lock:
            inner._sessions["s"].records[-1] = raw.decode("utf-8", "replace")
        return
    key = KeySpace(store.raw.namespace, store.raw.tenant).session_keys("s")[1]
    if factory.backend == "fakeredis":
        import fakeredis

        fakeredis.FakeRedis(server=factory._fake_server).lset(key, -1, raw)
        return
    client = raw_client(factory.url)
    try:
        client.lset(key, -1, raw)
    finally:
        client.close()


async def snapshot(store: StoreFacade) -> Any:
    """What a write would change: the state token (every write moves it on), the
    counts, the trail's length, the undamaged records."""
    head, token = await store.read_with_token("s", 0, 2)
    info = await store.info("s")
    counts = (info.message_count, info.token_total, info.audit_count)
    return token, counts, [(s.message.id, s.tokens) for s in head]


REMOVALS = {
    "retract": lambda store: store.retract("s", 2),
    "replace": lambda store: store.replace_tail("s", 1, batch(1, start=9), None, OPTIONS),
}


@pytest.mark.parametrize("op", sorted(REMOVALS))
async def test_an_undecodable_record_to_remove_is_refused_before_any_write(
    store_factory: StoreFactory, op: str
) -> None:
    store = store_factory.make()
    await store.append("s", batch(3), OPTIONS)
    damage_newest(store_factory, store, b"\x00{not json")
    before = await snapshot(store)
    with pytest.raises(CorruptRecordError) as caught:
        await REMOVALS[op](store)
    assert (caught.value.session_id, caught.value.position) == ("s", 2)
    assert await snapshot(store) == before  # nothing written: meta's version included


@pytest.mark.parametrize("op", sorted(REMOVALS))
async def test_a_record_this_version_cannot_read_never_raises_after_the_write(
    store_factory: StoreFactory, op: str
) -> None:
    """JSON with an id but not a message (a newer ctxguard's role): the script removes it
    and the parse returns it flagged; the memory store, which decodes every record
    before it writes, refuses it with nothing written. Never an error after a write."""
    store = store_factory.make()
    await store.append("s", batch(3), OPTIONS)
    damage_newest(store_factory, store, b'{"role":"wizard","content":"boo","id":"w"}')
    before = await snapshot(store)
    try:
        result = await REMOVALS[op](store)
    except CorruptRecordError:
        assert store_factory.backend == "memory"
        assert await snapshot(store) == before
        return
    removed = result if op == "retract" else result.removed
    assert [(r.seq, r.message.id) for r in removed] == [(1, "id1"), (2, "w")]
    assert "ctxguard_undecodable" in removed[1].message.metadata
    assert "ctxguard_undecodable" not in removed[0].message.metadata
    assert (await store.info("s")).message_count == (1 if op == "retract" else 2)
