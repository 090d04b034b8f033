"""replace_tail: the tail from a position replaced by new messages in one atomic step,
on every backend, sync and async (memory, fakeredis, Redis, Cluster)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from ctxguard import ConflictError, InvalidMessageError, Message, SessionFullError
from ctxguard.stores import NewMessage, Summary, WriteOptions
from tests.stores import test_corrupt_keys as corrupt_keys

if TYPE_CHECKING:
    from tests.conftest import StoreFacade

OPTIONS = WriteOptions(counter="c1")


def batch(n: int, start: int = 0, tokens: int = 3) -> list[NewMessage]:
    return [
        NewMessage(
            Message(role="user" if i % 2 == 0 else "assistant", content=f"m{i}", id=f"id{i}"),
            tokens,
        )
        for i in range(start, start + n)
    ]


def system(msg_id: str) -> NewMessage:
    return NewMessage(Message(role="system", content=msg_id, id=msg_id), 2)


async def snapshot(store: StoreFacade, session_id: str) -> tuple[Any, ...]:
    """Everything a reader can see of a session (the update time aside)."""
    info = await store.info(session_id)
    seen = None
    if info is not None:
        seen = (info.message_count, info.token_total, info.counter, info.summary_version)
    stored = [
        (m.seq, m.message.id, m.message.content, m.tokens) for m in await store.read(session_id)
    ]
    window = await store.fetch_window(session_id, 10_000, OPTIONS)
    pinned = [m.seq for m in window.pinned] + [
        m.seq for m in window.recent if m.message.role == "system"
    ]
    return (
        seen,
        stored,
        pinned,
        await store.get_summary(session_id),
        await store.read_audit(session_id),
        window.token,
    )


async def test_replace_from_zero_replaces_everything(store: StoreFacade) -> None:
    await store.append("s", [system("sys"), *batch(3)], OPTIONS)
    result = await store.replace_tail("s", 0, batch(2, start=10, tokens=5), 4, OPTIONS)
    assert [(r.seq, r.message.id, r.tokens) for r in result.removed] == [
        (0, "sys", 2),
        (1, "id0", 3),
        (2, "id1", 3),
        (3, "id2", 3),
    ]
    assert result.appended.stored == ("id10", "id11") and result.appended.duplicates == ()
    assert result.appended.message_count == 2
    assert result.appended.token_before != result.appended.token_after
    stored = await store.read("s")
    assert [(m.seq, m.message.id, m.tokens) for m in stored] == [(0, "id10", 5), (1, "id11", 5)]
    info = await store.info("s")
    assert info.message_count == 2 and info.token_total == 10
    window = await store.fetch_window("s", 1000, OPTIONS)
    assert window.pinned == () and window.token == result.appended.token_after
    audit = await store.read_audit("s")
    assert len(audit) == 1
    record = audit[0]
    assert record["kind"] == "replace" and record["start"] == 0 and record["count"] == 4
    assert record["ids"] == ["sys", "id0", "id1", "id2"] and record["stored"] == ["id10", "id11"]


async def test_replace_from_a_position_keeps_the_head(store: StoreFacade) -> None:
    await store.append("s", [system("sys"), *batch(4)], OPTIONS)
    # delete_message(2): the tail from 2 replaced by the messages after it
    tail = await store.read("s", 2)
    again = [NewMessage(s.message, s.tokens) for s in tail[1:]]
    result = await store.replace_tail("s", 2, again, 5, OPTIONS)
    assert [r.message.id for r in result.removed] == ["id1", "id2", "id3"]
    assert result.appended.stored == ("id2", "id3") and result.appended.message_count == 4
    assert [(m.seq, m.message.id) for m in await store.read("s")] == [
        (0, "sys"),
        (1, "id0"),
        (2, "id2"),
        (3, "id3"),
    ]
    info = await store.info("s")
    assert info.message_count == 4 and info.token_total == 2 + 3 * 3
    window = await store.fetch_window("s", 1000, OPTIONS)
    assert [m.message.id for m in window.recent][:1] == ["sys"]
    # the freed id may come back; a kept one is a duplicate
    more = await store.append("s", [*batch(1, start=1), *batch(1, start=0)], OPTIONS)
    assert more.stored == ("id1",) and more.duplicates == ("id0",)
    record = (await store.read_audit("s"))[-1]
    assert record["kind"] == "replace" and record["start"] == 2 and record["count"] == 3
    assert record["ids"] == ["id1", "id2", "id3"] and record["stored"] == ["id2", "id3"]


async def test_replace_with_nothing_retracts(store: StoreFacade) -> None:
    await store.append("s", batch(3), OPTIONS)
    result = await store.replace_tail("s", 2, [], 3, OPTIONS)
    assert [r.message.id for r in result.removed] == ["id2"]
    assert result.appended.stored == () and result.appended.message_count == 2
    assert (await store.info("s")).message_count == 2
    assert (await store.read_audit("s"))[-1]["stored"] == []


async def test_replace_on_a_missing_session_is_an_append_unaudited(store: StoreFacade) -> None:
    result = await store.replace_tail("new", 0, batch(2), 0, OPTIONS)
    assert result.removed == () and result.appended.stored == ("id0", "id1")
    assert result.appended.token_before is None
    assert [m.message.id for m in await store.read("new")] == ["id0", "id1"]
    assert await store.read_audit("new") == []  # nothing removed: nothing to record
    # nothing to remove, nothing to add: nothing written
    empty = await store.replace_tail("none", 0, [], None, OPTIONS)
    assert empty.removed == () and empty.appended.message_count == 0
    assert await store.info("none") is None


async def test_replace_keeps_turns_and_trail_and_drops_a_summary_it_cuts(
    store: StoreFacade,
) -> None:
    await store.append("s", batch(4), OPTIONS)
    await store.add_audit("s", {"kind": "note"}, 0)
    assert await store.commit_summary("s", Summary(version=1, text="t", covers_to=2), 0)
    await store.replace_tail("s", 2, batch(1, start=7), None, OPTIONS)
    assert (await store.get_summary("s")) is not None  # covers [0, 2): kept
    await store.replace_tail("s", 1, [], None, OPTIONS)
    assert await store.get_summary("s") is None  # covered a removed message
    kinds = [r["kind"] for r in await store.read_audit("s")]
    assert kinds == ["note", "replace", "replace"]


async def test_replace_with_a_duplicate_inside_the_batch_stores_it_once(
    store: StoreFacade,
) -> None:
    await store.append("s", batch(2), OPTIONS)
    twice = [*batch(1, start=5), *batch(1, start=5)]
    result = await store.replace_tail("s", 0, twice, None, OPTIONS)
    assert result.appended.stored == ("id5",) and result.appended.duplicates == ("id5",)
    assert [m.message.id for m in await store.read("s")] == ["id5"]


async def test_replace_moves_to_the_callers_counter(store: StoreFacade) -> None:
    await store.append("s", batch(3), OPTIONS)
    other = WriteOptions(counter="c2")
    await store.replace_tail("s", 2, batch(1, start=9, tokens=7), None, other)
    stored = await store.read("s")
    assert [(m.message.id, m.tokens) for m in stored] == [("id0", None), ("id1", None), ("id9", 7)]
    info = await store.info("s")
    assert info.counter == "c2" and info.token_total == 7


# -- refusals: nothing written ---------------------------------------------------


@pytest.mark.parametrize(
    ("start", "new", "expected", "error"),
    [
        (2, batch(1, start=0), None, InvalidMessageError),  # id0 is kept at 0
        (2, [*batch(1, start=8), *batch(1, start=0)], 4, InvalidMessageError),
        (0, batch(1), 3, ConflictError),  # someone appended since the read
        (5, [], None, ConflictError),  # past the end
        (1, batch(4, start=20), None, SessionFullError),  # 1 + 4 > 4
    ],
    ids=["kept-id", "kept-id-later-in-batch", "moved-count", "past-end", "over-cap"],
)
async def test_a_refused_replace_changes_nothing(
    store: StoreFacade,
    start: int,
    new: list[NewMessage],
    expected: int | None,
    error: type[Exception],
) -> None:
    await store.append("s", [system("sys"), *batch(3)], OPTIONS)
    assert await store.commit_summary("s", Summary(version=1, text="t", covers_to=2), 0)
    before = await snapshot(store, "s")
    capped = WriteOptions(counter="c1", max_messages=4)
    with pytest.raises(error):
        await store.replace_tail("s", start, new, expected, capped)
    assert await snapshot(store, "s") == before


async def test_a_bad_argument_is_refused_before_the_store(store: StoreFacade) -> None:
    from ctxguard import InvalidInputError

    await store.append("s", batch(2), OPTIONS)
    before = await snapshot(store, "s")
    for start, expected in ((-1, None), (0, -1), ("0", None), (True, None)):
        with pytest.raises(InvalidInputError):
            await store.replace_tail("s", start, batch(1, start=5), expected, OPTIONS)
    with pytest.raises(InvalidInputError):
        await store.replace_tail("s", 0, ["not a NewMessage"], None, OPTIONS)
    assert await snapshot(store, "s") == before


async def test_a_concurrent_append_between_read_and_replace_is_refused(
    store_factory: Any,
) -> None:
    """The read-modify-write of delete_message: another writer appends after the read;
    the replace with the count it read is refused and the other's message survives."""
    first, second = store_factory.make(), store_factory.make()
    await first.append("s", batch(4), OPTIONS)
    tail = await first.read("s", 1)
    await second.append("s", batch(1, start=50), OPTIONS)  # the other writer
    again = [NewMessage(s.message, s.tokens) for s in tail[1:]]
    with pytest.raises(ConflictError):
        await first.replace_tail("s", 1, again, 1 + len(tail), OPTIONS)
    assert [m.message.id for m in await first.read("s")] == ["id0", "id1", "id2", "id3", "id50"]
    tail = await first.read("s", 1)  # read again, retry: it goes through
    again = [NewMessage(s.message, s.tokens) for s in tail[1:]]
    await first.replace_tail("s", 1, again, 1 + len(tail), OPTIONS)
    assert [m.message.id for m in await first.read("s")] == ["id0", "id2", "id3", "id50"]


# -- every check before the first write (Redis keeps a failed script's writes) ----------

_LATE = [
    # the last check replace.lua makes (after meta, lengths, pins and the batch's counts):
    # an id mapped to something that is not a position; nothing may be written before it
    pytest.param(lambda c, k: c.hset(k["ids"], "stray", "x"), "ids", id="ids-not-a-position"),
]


@pytest.fixture(
    params=[
        pytest.param("redis", marks=pytest.mark.redis),
        pytest.param("cluster", marks=pytest.mark.cluster),
    ]
)
def server(request: pytest.FixtureRequest) -> str:
    url: str = request.getfixturevalue(f"{request.param}_url")
    return url


def _dump(client: Any, keys: dict[str, str]) -> dict[str, Any]:
    return {suffix: (client.dump(key), client.pttl(key) > 0) for suffix, key in keys.items()}


@pytest.mark.parametrize(("corrupt", "suffix"), [*_LATE, *corrupt_keys.CORRUPTIONS])
def test_a_damaged_key_is_found_before_anything_is_written(
    server: str, purge_after: Any, namespace: str, corrupt: Any, suffix: str
) -> None:
    """Every key replace reads or writes, damaged in turn: the script answers CORRUPT
    and every key of the session is byte for byte (and TTL) as it was."""
    from ctxguard.errors import CorruptRecordError
    from ctxguard.stores import open_store
    from ctxguard.stores.keys import SUFFIXES, KeySpace
    from tests.conftest import raw_client

    purge_after(server)
    store = open_store(server, namespace=namespace)
    client = raw_client(server)
    try:
        store.append("s", [system("sys"), *batch(4)], WriteOptions(counter="c1", ttl_seconds=600))
        assert store.commit_summary("s", Summary(version=1, text="t", covers_to=2), 0)
        store.add_audit("s", {"kind": "note"}, 0)
        keys = dict(zip(SUFFIXES, KeySpace(namespace, "default").session_keys("s"), strict=True))
        corrupt(client, keys)
        before = _dump(client, keys)
        new = [system("sys2"), *batch(2, start=10)]  # a pinned one: pins are written too
        with pytest.raises(CorruptRecordError):
            store.replace_tail("s", 2, new, None, WriteOptions(counter="c2", ttl_seconds=900))
        assert _dump(client, keys) == before
    finally:
        client.close()
        store.close()
