"""The store contract, run against every backend (memory, fakeredis, Redis, Redis
Cluster), sync and async: ``store_factory`` in tests/conftest.py hands each test
an awaitable facade, so every behaviour is written once."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import pytest

from ctxguard.errors import (
    CorruptRecordError,
    CtxGuardError,
    InvalidIdError,
    InvalidInputError,
    InvalidMessageError,
    MessageIdReusedError,
)
from ctxguard.messages import Message, to_messages
from ctxguard.stores import AppendResult, NewMessage, StoredMessage, Summary, WriteOptions
from ctxguard.stores.base import estimate_unknown_tokens

if TYPE_CHECKING:
    from tests.conftest import StoreFacade, StoreFactory


def new(
    content: str = "hi", role: str = "user", tokens: int | None = None, **kw: Any
) -> NewMessage:
    return NewMessage(Message(role=role, content=content, **kw), tokens=tokens)


def texts(stored: list[StoredMessage] | tuple[StoredMessage, ...]) -> list[str]:
    return [s.message.text for s in stored]


def seqs(stored: list[StoredMessage] | tuple[StoredMessage, ...]) -> list[int]:
    return [s.seq for s in stored]


# -- append and read -------------------------------------------------------------


async def test_append_one_reads_back_equal(store: StoreFacade) -> None:
    m = new("hello", name="ann", metadata={"k": [1, "two"]})
    result = await store.append("s", [m])
    assert result == AppendResult((m.message.id,), (), 1)
    [stored] = await store.read("s")
    assert stored == StoredMessage(0, m.message, None)


async def test_append_many_keeps_order(store: StoreFacade) -> None:
    batch = [new(f"m{i}") for i in range(5)]
    result = await store.append("s", batch)
    assert result.stored == tuple(m.message.id for m in batch)
    assert result.message_count == 5
    assert (await store.append("s", [new("m5")])).message_count == 6
    stored = await store.read("s")
    assert texts(stored) == [f"m{i}" for i in range(6)]
    assert seqs(stored) == list(range(6))


async def test_empty_append_creates_nothing(store: StoreFacade) -> None:
    assert (await store.append("s", [])).message_count == 0
    assert await store.info("s") is None
    await store.append("s", [new("a")])
    assert await store.append("s", []) == AppendResult((), (), 1)


async def test_duplicate_ids_are_stored_once(store: StoreFacade) -> None:
    a, b, c, d = new("a"), new("b"), new("c"), new("d")
    await store.append("s", [a, b])
    result = await store.append("s", [b, c])
    assert result == AppendResult((c.message.id,), (b.message.id,), 3)

    retry = await store.append("s", [a])
    assert retry.all_duplicates and retry.message_count == 3

    twice_in_one_call = await store.append("s", [d, d])
    assert twice_in_one_call == AppendResult((d.message.id,), (d.message.id,), 4)

    same_id_new_time = NewMessage(Message(role="user", content="a", id=a.message.id))
    assert (await store.append("s", [same_id_new_time])).duplicates == (a.message.id,)
    same_id_new_text = NewMessage(Message(role="user", content="changed", id=a.message.id))
    with pytest.raises(MessageIdReusedError):  # one id, one message (test_id_reuse.py)
        await store.append("s", [same_id_new_text])

    assert texts(await store.read("s")) == ["a", "b", "c", "d"]
    info = await store.info("s")
    assert info is not None and info.message_count == 4


async def test_read_slices_and_last(store: StoreFacade) -> None:
    await store.append("s", [new(f"m{i}") for i in range(10)])
    assert seqs(await store.read("s", 2, 5)) == [2, 3, 4]
    assert seqs(await store.read("s", 7)) == [7, 8, 9]
    assert seqs(await store.read("s", -3)) == [7, 8, 9]
    assert seqs(await store.read("s", 0, -8)) == [0, 1]
    assert seqs(await store.read("s", 8, 100)) == [8, 9]
    assert await store.read("s", 0, 0) == []
    assert await store.read("s", 20) == []
    assert seqs(await store.read_last("s", 3)) == [7, 8, 9]
    assert texts(await store.read_last("s", 3)) == ["m7", "m8", "m9"]
    assert len(await store.read_last("s", 50)) == 10
    assert await store.read_last("s", 0) == []
    assert await store.read("missing") == []
    assert await store.read_last("missing", 5) == []
    with pytest.raises(InvalidInputError):
        await store.read_last("s", -1)


async def test_info_reports_counts_and_times(store: StoreFacade) -> None:
    assert await store.info("s") is None
    before = datetime.now(UTC) - timedelta(seconds=5)
    counted = WriteOptions(counter="c1")
    await store.append("s", [new("a", tokens=5), new("b", tokens=7)], counted)
    info = await store.info("s")
    assert info is not None
    assert (info.session_id, info.message_count, info.token_total) == ("s", 2, 12)
    assert info.counter == "c1"
    assert info.ttl_seconds is None
    assert (info.summary_version, info.audit_count) == (0, 0)
    assert before <= info.created_at <= info.updated_at <= datetime.now(UTC) + timedelta(seconds=5)

    await asyncio.sleep(0.02)
    await store.append("s", [new("c", tokens=1)], counted)
    later = await store.info("s")
    assert later is not None
    assert later.created_at == info.created_at
    assert later.updated_at > info.updated_at
    assert (later.message_count, later.token_total) == (3, 13)


async def test_counts_given_without_a_counter_are_not_kept(store: StoreFacade) -> None:
    await store.append("s", [new("a", tokens=5)])
    info = await store.info("s")
    assert info is not None and info.token_total == 0 and info.counter is None
    assert [m.tokens for m in await store.read("s")] == [None]


async def test_delete(store: StoreFacade) -> None:
    await store.append("s", [new("a")])
    await store.append("other", [new("b")])
    await store.add_audit("s", {"event": "x"}, 10)
    assert await store.delete("s") is True
    assert await store.info("s") is None
    assert await store.read("s") == []
    assert await store.read_audit("s") == []
    assert await store.delete("s") is False
    assert await store.list_sessions() == ["other"]
    await store.append("s", [new("again")])
    assert texts(await store.read("s")) == ["again"]


async def test_list_sessions_with_prefix(store: StoreFacade) -> None:
    for sid in ("alpha-1", "alpha-2", "beta"):
        await store.append(sid, [new(sid)])
    assert sorted(await store.list_sessions()) == ["alpha-1", "alpha-2", "beta"]
    assert sorted(await store.list_sessions("alpha")) == ["alpha-1", "alpha-2"]
    assert await store.list_sessions("beta") == ["beta"]
    assert await store.list_sessions("gamma") == []


GLOBBY_IDS = ("*", "a?c", "[x]", "%", "{}", "a%3Fc", "{a}:b", "日本語 セッション", "abc", "x")


async def test_glob_and_tag_characters_in_session_ids_mean_only_themselves(
    store: StoreFacade,
) -> None:
    for sid in GLOBBY_IDS:
        await store.append(sid, [new(f"in {sid}")])
    assert sorted(await store.list_sessions()) == sorted(GLOBBY_IDS)
    assert await store.list_sessions("*") == ["*"]
    assert await store.list_sessions("a?") == ["a?c"]
    assert await store.list_sessions("[") == ["[x]"]
    assert await store.list_sessions("%") == ["%"]
    assert await store.list_sessions("a%") == ["a%3Fc"]
    assert sorted(await store.list_sessions("{")) == ["{a}:b", "{}"]
    assert await store.list_sessions("日本") == ["日本語 セッション"]

    for sid in ("*", "a?c", "[x]", "%", "{}"):
        assert await store.delete(sid) is True
    assert sorted(await store.list_sessions()) == [
        "a%3Fc",
        "abc",
        "x",
        "{a}:b",
        "日本語 セッション",
    ]
    for sid in ("a%3Fc", "{a}:b", "日本語 セッション", "abc", "x"):
        assert texts(await store.read(sid)) == [f"in {sid}"]


async def test_sliding_ttl_is_refreshed_on_write(store: StoreFacade) -> None:
    await store.append("short", [new("x")], WriteOptions(ttl_seconds=1))
    await store.append("slide", [new("x")], WriteOptions(ttl_seconds=2))
    await store.append("forever", [new("x")])
    first = await store.info("slide")
    assert first is not None and first.ttl_seconds is not None and 1.5 < first.ttl_seconds <= 2
    forever = await store.info("forever")
    assert forever is not None and forever.ttl_seconds is None

    await asyncio.sleep(1.2)
    assert await store.info("short") is None
    assert await store.read("short") == []
    aged = await store.info("slide")
    assert aged is not None and aged.ttl_seconds is not None and aged.ttl_seconds <= 1.5

    await store.append("slide", [new("y")], WriteOptions(ttl_seconds=2))
    refreshed = await store.info("slide")
    assert refreshed is not None and refreshed.ttl_seconds is not None
    assert refreshed.ttl_seconds > 1.5
    assert refreshed.message_count == 2
    assert sorted(await store.list_sessions()) == ["forever", "slide"]


# -- the window ------------------------------------------------------------------


async def test_fetch_window_walks_back_within_budget(store: StoreFacade) -> None:
    counted = WriteOptions(counter="c")
    history = [new("be brief", role="system", tokens=10)]
    history += [new(f"turn {i}", tokens=10) for i in range(1, 5)]
    history += [new("use tools", role="developer", tokens=10)]
    history += [new(f"turn {i}", tokens=10) for i in range(6, 11)]
    await store.append("s", history, counted)

    win = await store.fetch_window("s", 35, counted)
    assert seqs(win.recent) == [8, 9, 10]
    assert [m.tokens for m in win.recent] == [10, 10, 10]
    assert [(p.seq, p.message.role, p.tokens) for p in win.pinned] == [
        (0, "system", 10),
        (5, "developer", 10),
    ]
    assert not win.reached_start
    assert win.appended is None and win.summary is None
    assert (win.info.message_count, win.info.token_total) == (11, 110)

    assert seqs((await store.fetch_window("s", 30, counted)).recent) == [8, 9, 10]

    everything = await store.fetch_window("s", 10_000, counted)
    assert seqs(everything.recent) == list(range(11))
    assert everything.pinned == ()
    assert everything.reached_start

    nothing = await store.fetch_window("s", 0, counted)
    assert nothing.recent == ()
    assert seqs(nothing.pinned) == [0, 5]
    assert not nothing.reached_start

    missing = await store.fetch_window("missing", 100, counted)
    assert (missing.recent, missing.pinned, missing.reached_start) == ((), (), True)
    assert missing.info.message_count == 0
    assert await store.info("missing") is None

    with pytest.raises(InvalidInputError):
        await store.fetch_window("s", -1, counted)


async def test_fetch_window_with_new_messages_writes_nothing(store: StoreFacade) -> None:
    counted = WriteOptions(counter="c")
    await store.append("s", [new("q1", tokens=4), new("a1", role="assistant", tokens=4)], counted)
    before = await store.info("s")
    q2 = new("q2", tokens=4)
    win = await store.fetch_window("s", 100, counted, [q2])
    # the window as if q2 were appended, at the position it would get
    assert win.appended == AppendResult((q2.message.id,), (), 3)
    assert win.appended.token_after is None
    assert texts(win.recent) == ["q1", "a1", "q2"] and seqs(win.recent) == [0, 1, 2]
    assert win.recent[-1].tokens == 4
    assert win.info.message_count == 3 and win.info.token_total == 12
    assert texts(await store.read("s")) == ["q1", "a1"]  # nothing stored
    assert await store.info("s") == before

    # an id already stored is history, not new; a repeated id counts once
    a1_again = NewMessage(Message(role="assistant", content="a1", id=win.recent[1].message.id))
    twice = await store.fetch_window("s", 100, counted, [a1_again, q2, q2])
    assert twice.appended == AppendResult((q2.message.id,), (a1_again.message.id, q2.message.id), 3)
    assert texts(twice.recent) == ["q1", "a1", "q2"]

    # the new messages count in the walk, newest first; the budget cuts the stored ones
    tight = await store.fetch_window("s", 8, counted, [q2], 1)
    assert seqs(tight.recent) == [1, 2] and tight.stop_tokens == 4 and not tight.reached_start

    fresh = await store.fetch_window("new", 100, counted, [new("hello", tokens=2)])
    assert fresh.appended is not None and fresh.appended.message_count == 1
    assert [m.tokens for m in fresh.recent] == [2] and seqs(fresh.recent) == [0]
    assert fresh.reached_start and fresh.token is None
    assert await store.info("new") is None
    assert await store.list_sessions() == ["s"]


async def test_commit_creates_a_session_on_the_empty_token(store: StoreFacade) -> None:
    from ctxguard.stores.base import RecordWrite, WindowHit

    counted = WriteOptions(counter="c")
    hello = new("hello", tokens=2)
    win = await store.fetch_window("new", 100, counted, [hello])
    record = RecordWrite(audit={"turn": 0, "kind": "request"})
    hit = await store.commit_if_unchanged("new", win.token or "", 100, counted, [hello], 1, record)
    assert isinstance(hit, WindowHit) and hit.turn == 1
    assert hit.appended.stored == (hello.message.id,) and hit.appended.token_before is None
    assert texts(await store.read("new")) == ["hello"]
    assert [r["turn"] for r in await store.read_audit("new")] == [1]
    # "" on a session that exists now is a miss: the window as if appended, nothing written
    late = new("late", tokens=1)
    miss = await store.commit_if_unchanged("new", "", 100, counted, [late], 1, record)
    assert not isinstance(miss, WindowHit) and texts(miss.recent) == ["hello", "late"]
    assert texts(await store.read("new")) == ["hello"]


async def test_commit_writes_the_recounted_tokens_in_the_same_step(store: StoreFacade) -> None:
    from ctxguard.stores.base import RecordWrite, WindowHit

    counted = WriteOptions(counter="c")
    await store.append("s", [new("a"), new("b")])  # no counter: counts unknown
    win = await store.fetch_window("s", 1000, counted)
    q = new("q", tokens=3)
    write = RecordWrite(counter="c", counts={0: 5, 1: 6, 99: 1})
    hit = await store.commit_if_unchanged("s", win.token or "", 1000, counted, [q], 1, write)
    assert isinstance(hit, WindowHit)
    assert [m.tokens for m in await store.read("s")] == [5, 6, 3]
    info = await store.info("s")
    assert info is not None and (info.counter, info.token_total) == ("c", 14)
    assert (await store.fetch_window("s", 1000, counted)).token == hit.token


async def test_unknown_counts_are_estimated_then_filled_lazily(store: StoreFacade) -> None:
    batch = [new("x" * 800) for _ in range(4)]
    await store.append("s", batch)  # no counter: every count is unknown
    estimates = [estimate_unknown_tokens(len(m.encoded().encode())) for m in batch]
    assert min(estimates) > 50

    counted = WriteOptions(counter="c")
    win = await store.fetch_window("s", estimates[2] + estimates[3], counted)
    assert seqs(win.recent) == [2, 3]
    assert [m.tokens for m in win.recent] == [None, None]

    await store.set_token_counts("s", "c", {2: 3, 3: 3, 99: 1})
    assert [m.tokens for m in await store.read("s")] == [None, None, 3, 3]
    info = await store.info("s")
    assert info is not None and (info.counter, info.token_total) == ("c", 6)

    wider = await store.fetch_window("s", estimates[1] + 6, counted)
    assert seqs(wider.recent) == [1, 2, 3]
    assert [m.tokens for m in wider.recent] == [None, 3, 3]

    await store.set_token_counts("s", "c", {3: -1})  # -1 forgets a count
    info = await store.info("s")
    assert info is not None and info.token_total == 3

    await store.set_token_counts("missing", "c", {0: 1})
    assert await store.info("missing") is None


async def test_counter_change_makes_old_counts_unknown(store: StoreFacade) -> None:
    await store.append("s", [new("a", tokens=5), new("b", tokens=5)], WriteOptions(counter="old"))
    await store.append("s", [new("c", tokens=4)], WriteOptions(counter="new"))
    assert [m.tokens for m in await store.read("s")] == [None, None, 4]
    info = await store.info("s")
    assert info is not None and (info.counter, info.token_total) == ("new", 4)

    asked_with_other = await store.fetch_window("s", 1000, WriteOptions(counter="old"))
    assert [m.tokens for m in asked_with_other.recent] == [None, None, None]

    await store.set_token_counts("s", "third", {0: 1})
    assert [m.tokens for m in await store.read("s")] == [1, None, None]
    info = await store.info("s")
    assert info is not None and (info.counter, info.token_total) == ("third", 1)


# -- summary and audit -------------------------------------------------------------


async def test_commit_summary_is_compare_and_set(store: StoreFacade) -> None:
    first = Summary(version=1, text="so far", covers_to=2, from_id="m0", to_id="m1", tokens=3)
    assert await store.get_summary("s") is None
    assert await store.commit_summary("s", first, 0) is False  # no session yet

    await store.append("s", [new(f"m{i}") for i in range(4)])
    assert await store.commit_summary("s", first, 0) is True
    assert await store.get_summary("s") == first
    info = await store.info("s")
    assert info is not None and info.summary_version == 1

    stale = Summary(version=1, text="stale", covers_to=3)
    assert await store.commit_summary("s", stale, 0) is False  # expected version is old
    skipping = Summary(version=3, text="skips", covers_to=3)
    assert await store.commit_summary("s", skipping, 1) is False  # version must be expected + 1
    beyond = Summary(version=2, text="beyond", covers_to=5)
    assert await store.commit_summary("s", beyond, 1) is False  # covers more than exists
    assert await store.get_summary("s") == first

    second = Summary(version=2, text="all of it", covers_to=4)
    assert await store.commit_summary("s", second, 1) is True
    win = await store.fetch_window("s", 100)
    assert win.summary == second
    assert win.info.summary_version == 2


async def test_audit_keeps_the_newest_records(store: StoreFacade) -> None:
    await store.add_audit("s", {"n": -1}, 3)  # no session: nothing kept
    assert await store.read_audit("s") == []
    assert await store.info("s") is None

    await store.append("s", [new("a")])
    for n in range(5):
        await store.add_audit("s", {"n": n, "note": "é ✓"}, 3)
    audit = await store.read_audit("s")
    assert [{k: v for k, v in r.items() if k != "rid"} for r in audit] == [
        {"n": n, "note": "é ✓"} for n in (2, 3, 4)
    ]
    assert all(next(iter(r)) == "rid" for r in audit)  # every record gets its id, first
    info = await store.info("s")
    assert info is not None and info.audit_count == 3

    for n in range(5, 8):
        await store.add_audit("s", {"n": n}, 0)  # 0 keeps everything
    assert [r["n"] for r in await store.read_audit("s")] == [2, 3, 4, 5, 6, 7]


# -- damage, isolation, bad input -------------------------------------------------------


async def test_corrupt_record_names_session_and_position(store_factory: StoreFactory) -> None:
    store = store_factory.make()
    await store.append("broken", [new("ok 0"), new("ok 1")])
    await store.append("healthy", [new("fine")])
    store_factory.plant_record(store, "broken", b"\x00{not json")

    with pytest.raises(CorruptRecordError) as caught:
        await store.read("broken")
    assert isinstance(caught.value, CtxGuardError)
    assert (caught.value.session_id, caught.value.position) == ("broken", 2)
    assert "'broken'" in str(caught.value) and "position 2" in str(caught.value)
    for call in (store.read_last("broken", 1), store.fetch_window("broken", 10_000)):
        with pytest.raises(CorruptRecordError):
            await call
    assert texts(await store.read("broken", 0, 2)) == ["ok 0", "ok 1"]

    assert texts(await store.read("healthy")) == ["fine"]
    assert sorted(await store.list_sessions()) == ["broken", "healthy"]

    store_factory.plant_record(store, "healthy", b'{"role": "wizard", "content": "boo"}')
    with pytest.raises(CorruptRecordError) as caught:
        await store.read("healthy")
    assert (caught.value.session_id, caught.value.position) == ("healthy", 1)


async def test_namespaces_never_see_each_other(store_factory: StoreFactory, namespace: str) -> None:
    a = store_factory.make(namespace=namespace)
    b = store_factory.make(namespace=namespace + "-b")
    await _check_isolated(a, b)


async def test_tenants_never_see_each_other(store_factory: StoreFactory) -> None:
    a = store_factory.make(tenant="acme")
    b = store_factory.make(tenant="globex")
    await _check_isolated(a, b)
    default = store_factory.make()
    assert await default.list_sessions() == []


async def _check_isolated(a: StoreFacade, b: StoreFacade) -> None:
    await a.append("same", [new("from a")])
    await b.append("same", [new("from b")])
    await a.append("only-a", [new("a alone")])
    assert texts(await a.read("same")) == ["from a"]
    assert texts(await b.read("same")) == ["from b"]
    assert sorted(await a.list_sessions()) == ["only-a", "same"]
    assert await b.list_sessions() == ["same"]
    assert await b.info("only-a") is None

    assert await b.delete("same") is True
    assert await b.delete("only-a") is False
    assert texts(await a.read("same")) == ["from a"]
    assert sorted(await a.list_sessions()) == ["only-a", "same"]


BAD_SESSION_IDS = ("", "x" * 257, "é" * 129, "a\nb", "tab\there", "nul\x00", "del\x7f", "\x1b[0m")


async def test_bad_session_ids_are_refused(store: StoreFacade) -> None:
    summary = Summary(version=1, text="t", covers_to=0)
    for bad in BAD_SESSION_IDS:
        calls = [
            store.append(bad, [new("a")]),
            store.append(bad, []),
            store.read(bad),
            store.read_last(bad, 1),
            store.info(bad),
            store.delete(bad),
            store.fetch_window(bad, 10, WriteOptions(), [new("a")]),
            store.set_token_counts(bad, "c", {0: 1}),
            store.get_summary(bad),
            store.commit_summary(bad, summary, 0),
            store.add_audit(bad, {"a": 1}, 5),
            store.read_audit(bad),
        ]
        for call in calls:
            with pytest.raises(InvalidIdError):
                await call
    assert await store.list_sessions() == []

    for longest in ("x" * 256, "é" * 128):
        await store.append(longest, [new("fits")])
    assert sorted(await store.list_sessions()) == sorted(["x" * 256, "é" * 128])


BAD_MESSAGES = (
    ({"role": "wizard", "content": "hi"}, "role must be one of"),
    ({"role": "tool", "content": "42"}, "tool_call_id"),
    (
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{no"}}
            ],
        },
        "JSON",
    ),
    ({"role": "user", "content": 42}, "content must be"),
    ({"role": "user", "content": {"text": "hi"}}, "content must be"),
    ({"role": "user", "content": None}, "needs content"),
    ({"role": "user", "content": "hi", "id": ""}, "empty"),
    ({"role": "user", "content": "hi", "id": "x" * 257}, "257 bytes"),
    ({"role": "user", "content": "hi", "id": "a\nb"}, "control character"),
    ("just text", "must be a dict"),
)


async def test_bad_messages_are_refused_and_nothing_is_stored(store: StoreFacade) -> None:
    await store.append("s", [new("before")])
    for data, hint in BAD_MESSAGES:
        with pytest.raises(InvalidMessageError, match=hint):
            batch = to_messages([{"role": "user", "content": "good"}, data])
            await store.append("s", [NewMessage(m) for m in batch])
    assert texts(await store.read("s")) == ["before"]
    assert await store.list_sessions() == ["s"]
