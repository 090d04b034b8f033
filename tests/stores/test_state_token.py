"""The per-session state token, ``stop_tokens`` and ``commit_if_unchanged``, run
against every backend (memory, fakeredis, Redis, Redis Cluster), sync and async,
through the ``store`` / ``store_factory`` fixtures of tests/conftest.py."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

import pytest

from ctxguard.errors import ConflictError, SessionFullError
from ctxguard.messages import Message
from ctxguard.stores import AppendResult, NewMessage, StoredMessage, Summary, WriteOptions
from ctxguard.stores.base import RecordWrite, WindowFetch, WindowHit

if TYPE_CHECKING:
    from tests.conftest import StoreFacade, StoreFactory

COUNTED = WriteOptions(counter="c")
BIG = 10_000


def new(
    content: str = "hi", role: str = "user", tokens: int | None = None, **kw: Any
) -> NewMessage:
    return NewMessage(Message(role=role, content=content, **kw), tokens=tokens)


def seqs(stored: Sequence[StoredMessage]) -> list[int]:
    return [s.seq for s in stored]


def request(n: int) -> RecordWrite:
    """A request audit record: the store numbers it with the session's next turn."""
    return RecordWrite(audit={"turn": 0, "kind": "request", "n": n})


async def token_of(store: StoreFacade, session_id: str = "s") -> str:
    token = (await store.fetch_window(session_id, BIG)).token
    assert isinstance(token, str)
    return token


# -- the token: present, stable under reads and non-window writes -------------------


async def test_token_is_given_for_an_existing_session_only(store: StoreFacade) -> None:
    missing = await store.fetch_window("s", BIG, COUNTED)
    assert missing.token is None and missing.stop_tokens is None

    virtual = await store.fetch_window("s", BIG, COUNTED, [new("a", tokens=1)])
    assert virtual.token is None  # a fetch creates nothing
    created = await store.commit_if_unchanged("s", "", BIG, COUNTED, [new("a", tokens=1)], 1, None)
    assert isinstance(created, WindowHit) and created.token
    assert created.token == await token_of(store)


async def test_the_plain_token_read_is_the_token_a_commit_checks(store: StoreFacade) -> None:
    """``state_token`` (one plain read: how commit="with_reply" checks a cached window)
    says what a fetch says, after every kind of change, and '' for no session."""
    assert await store.state_token("s") == ""
    await store.append("s", [new("a", tokens=1)], COUNTED)
    seen = [await token_of(store)]
    assert await store.state_token("s") == seen[-1]
    fetched = await store.fetch_window("s", BIG, COUNTED)
    hit = await store.commit_if_unchanged(
        "s", fetched.token, BIG, COUNTED, [new("b", tokens=1)], 1, request(1)
    )
    assert isinstance(hit, WindowHit) and await store.state_token("s") == hit.token
    summary = Summary(version=1, text="so far", covers_to=1)
    assert await store.commit_summary("s", summary, 0)
    seen.append(await token_of(store))
    assert await store.state_token("s") == seen[-1]
    await store.retract("s", 1)
    seen.append(await token_of(store))
    assert await store.state_token("s") == seen[-1] and len(set(seen)) == 3
    if hasattr(store.raw, "send_state_token"):  # (Redis: sent ahead where the client can)
        sent = await store.send_state_token("s")
        assert await store.state_token_reply(sent, "s") == seen[-1]
    await store.delete("s")
    assert await store.state_token("s") == ""


async def test_token_is_stable_across_reads_and_writes_a_window_cannot_see(
    store: StoreFacade,
) -> None:
    a, b = new("a", tokens=3), new("b", tokens=4)
    await store.append("s", [new("be brief", role="system", tokens=2), a, b], COUNTED)
    assert await store.commit_summary("s", Summary(version=1, text="t", covers_to=1), 0)
    token = await token_of(store)

    async def unchanged(step: str) -> None:
        assert await token_of(store) == token, f"the token moved after {step}"

    await store.read("s")
    await store.read_last("s", 2)
    await store.info("s")
    await store.get_summary("s")
    await store.read_audit("s")
    await store.list_sessions()
    for budget, options in ((0, COUNTED), (5, COUNTED), (BIG, WriteOptions()), (1, COUNTED)):
        assert (await store.fetch_window("s", budget, options)).token == token
    # a fetch with another counter reads the counts as unknown but switches nothing
    assert (await store.fetch_window("s", BIG, WriteOptions(counter="other"))).token == token
    await unchanged("reads")

    assert await store.add_audit("s", {"event": "note"}, 0) == 0
    assert await store.add_audit("s", {"turn": 0, "kind": "request"}, 0) == 1
    assert await store.record("s", RecordWrite(audit={"turn": 0, "kind": "request"})) == 2
    await unchanged("audit records")

    assert (await store.append("s", [a, b], COUNTED)).all_duplicates
    dup_fetch = await store.fetch_window("s", BIG, COUNTED, [b])
    assert dup_fetch.appended is not None and dup_fetch.appended.all_duplicates
    assert dup_fetch.token == token
    await unchanged("duplicate-only appends")

    for summary, expected_version in (
        (Summary(version=1, text="stale", covers_to=1), 0),  # the version moved on
        (Summary(version=3, text="skips", covers_to=1), 1),  # must be expected + 1
        (Summary(version=2, text="beyond", covers_to=99), 1),  # covers more than exists
    ):
        assert await store.commit_summary("s", summary, expected_version) is False
    assert (await store.get_summary("s")).text == "t"
    await unchanged("failed commit_summary")

    with pytest.raises(ConflictError):
        await store.retract("s", 1, expected_count=99)
    assert await store.retract("s", 0) == []
    assert (await store.restore("s", 10, Summary(version=5, text="x", covers_to=0))) == (10, 1)
    await unchanged("retract/restore that changed no message or summary")
    assert len(await store.read("s")) == 3


async def test_token_moves_on_with_every_change_a_window_can_see(store: StoreFacade) -> None:
    seen: list[str] = []

    async def moved(step: str) -> None:
        token = await token_of(store)
        assert token not in seen, f"the token did not move after {step}"
        seen.append(token)

    await store.append("s", [new("a", tokens=3), new("b", tokens=4)], COUNTED)
    await moved("the first append")
    await store.append("s", [new("c", tokens=5)], COUNTED)
    await moved("an append")
    await store.append("s", [new("c2", tokens=1), new("c3", tokens=1)], COUNTED)
    await moved("an append of two")
    old = new("d", tokens=1)
    await store.fetch_window("s", BIG, COUNTED, [old])  # writes nothing
    assert await token_of(store) == seen[-1]
    assert isinstance(
        await store.commit_if_unchanged("s", seen[-1], BIG, COUNTED, [old], 0, None), WindowHit
    )
    await moved("an append by commit_if_unchanged")
    await store.append_with_audit("s", [new("e", tokens=1)], COUNTED, request(1))
    await moved("append_with_audit")
    await store.append("s", [old, new("f", tokens=1)], COUNTED)
    await moved("an append with one duplicate and one new message")

    await store.append("s", [old], WriteOptions(counter="c-next"))
    assert (await store.info("s")).counter == "c-next"
    await moved("a counter switch by a duplicate-only append")
    await store.set_token_counts("s", "c-next", {0: 9})
    await moved("set_token_counts")
    await store.set_token_counts("s", "c-next", {0: 9})
    await moved("set_token_counts writing the same count again")
    await store.set_token_counts("s", "c-third", {1: 2})
    await moved("set_token_counts with another counter")
    await store.record("s", RecordWrite(counter="c-third", counts={2: 7}))
    await moved("record writing counts")

    imported = Summary(version=1, text="imported", covers_to=2)
    assert (await store.restore("s", 0, imported))[1] == 1
    await moved("restore setting a summary")
    assert await store.commit_summary("s", Summary(version=2, text="next", covers_to=3), 1)
    await moved("commit_summary")

    assert len(await store.retract("s", 1)) == 1
    await moved("retract")
    assert len(await store.retract("s", 2, expected_count=7)) == 2
    await moved("retract with the expected count")

    hit = await store.commit_if_unchanged(
        "s", seen[-1], BIG, WriteOptions(counter="c-third"), [new("g", tokens=1)], 0, None
    )
    assert isinstance(hit, WindowHit)
    await moved("commit_if_unchanged")
    assert len(seen) == len(set(seen)) == 16


async def test_a_recreated_session_gets_a_new_token(store: StoreFacade) -> None:
    async def build() -> str:
        await store.append("s", [new("sys", role="system", tokens=1)], COUNTED)
        await store.append("s", [new("q", id="q1", tokens=2)], COUNTED)
        await store.set_token_counts("s", "c", {1: 3})
        assert await store.commit_summary("s", Summary(version=1, text="t", covers_to=1), 0)
        return await token_of(store)

    first = await build()
    assert await store.delete("s") is True
    assert (await store.fetch_window("s", BIG)).token is None
    second = await build()
    assert second != first

    # the old session's token does not commit on the new one
    stale = await store.commit_if_unchanged(
        "s", first, BIG, COUNTED, [new("late", tokens=1)], 0, request(1)
    )
    assert isinstance(stale, WindowFetch)
    assert await store.read_audit("s") == []


async def test_sessions_have_tokens_of_their_own(store: StoreFacade) -> None:
    for sid in ("a", "b"):
        await store.append(sid, [new("same", id="m0", tokens=1)], COUNTED)
    token_a, token_b = await token_of(store, "a"), await token_of(store, "b")
    assert token_a != token_b
    miss = await store.commit_if_unchanged(
        "a", token_b, BIG, COUNTED, [new("x", tokens=1)], 0, request(1)
    )
    assert isinstance(miss, WindowFetch)
    assert await store.read_audit("a") == []


# -- stop_tokens ---------------------------------------------------------------------


async def test_stop_tokens_is_the_count_of_the_message_before_recent(store: StoreFacade) -> None:
    await store.append("s", [new(f"m{i}", tokens=11 + i) for i in range(5)], COUNTED)  # 11..15

    win = await store.fetch_window("s", 29, COUNTED)  # 15 + 14 fit, 13 does not
    assert (seqs(win.recent), win.reached_start, win.stop_tokens) == ([3, 4], False, 13)
    assert (await store.fetch_window("s", 29)).stop_tokens == 13  # no counter: stored counts hold

    nothing = await store.fetch_window("s", 0, COUNTED)
    assert (nothing.recent, nothing.stop_tokens) == ((), 15)

    at_least = await store.fetch_window("s", 0, COUNTED, min_messages=2)
    assert (seqs(at_least.recent), at_least.stop_tokens) == ([3, 4], 13)

    wide = await store.fetch_window("s", 56, COUNTED)
    assert (seqs(wide.recent), wide.stop_tokens) == ([1, 2, 3, 4], 11)


async def test_stop_tokens_is_none_at_the_start(store: StoreFacade) -> None:
    await store.append("s", [new(f"m{i}", tokens=10) for i in range(3)], COUNTED)
    for budget in (30, BIG):
        win = await store.fetch_window("s", budget, COUNTED)
        assert win.reached_start and seqs(win.recent) == [0, 1, 2]
        assert win.stop_tokens is None
    grown = await store.fetch_window("s", BIG, COUNTED, [new("more", tokens=10)])
    assert grown.reached_start and grown.stop_tokens is None


async def test_stop_tokens_is_none_when_that_count_is_unknown(store: StoreFacade) -> None:
    await store.append("s", [new(f"m{i}", tokens=10 + i) for i in range(4)], COUNTED)  # 10..13
    assert (await store.fetch_window("s", 25, COUNTED)).stop_tokens == 11

    other = await store.fetch_window("s", 2, WriteOptions(counter="other"))
    assert seqs(other.recent) == [2, 3]  # every count unknown to this counter: estimated as 1
    assert other.stop_tokens is None  # 11 is stored for seq 1, but by counter "c"

    await store.set_token_counts("s", "c", {1: -1})  # forgotten: estimated as 1 by the walk
    forgot = await store.fetch_window("s", 25, COUNTED)
    assert seqs(forgot.recent) == [2, 3] and forgot.stop_tokens is None

    await store.append("u", [new(f"u{i}") for i in range(4)])  # no counter: no counts at all
    uncounted = await store.fetch_window("u", 1, COUNTED)
    assert seqs(uncounted.recent) == [3] and uncounted.stop_tokens is None


# -- AppendResult.token_before / token_after -----------------------------------------


async def test_append_to_a_new_session_has_no_token_before(
    store: StoreFacade,
) -> None:
    for sid, options in (("plain", WriteOptions()), ("counted", COUNTED)):
        first = await store.append(sid, [new("a", tokens=1)], options)
        assert first.token_after == await token_of(store, sid)
        assert first.token_before is None, sid  # the session did not exist


async def test_token_before_of_an_append_that_switches_the_counter(
    store: StoreFacade,
) -> None:
    await store.append("s", [new("a", tokens=1)], COUNTED)
    token = await token_of(store)
    switched = await store.append("s", [new("b", tokens=1)], WriteOptions(counter="c2"))
    assert switched.token_after == await token_of(store) != token
    assert switched.token_before == token


async def test_append_reports_the_tokens_before_and_after(store: StoreFacade) -> None:
    first = await store.append("s", [new("a", tokens=1)], COUNTED)
    token = await token_of(store)
    assert first.token_after == token

    b = new("b", tokens=1)
    second = await store.append("s", [b], COUNTED)
    assert second.token_before == token
    after = await token_of(store)
    assert second.token_after == after != token

    dup = await store.append("s", [b], COUNTED)
    assert dup.all_duplicates
    assert dup.token_before == dup.token_after == after == await token_of(store)

    audited = await store.append_with_audit("s", [new("c", tokens=1)], COUNTED, request(1))
    assert audited.token_before == after
    assert audited.token_after == await token_of(store) != after
    assert [r["turn"] for r in await store.read_audit("s")] == [1]

    # with recounts of stored messages: the token after is the one they left
    audit = request(2).audit
    write = RecordWrite(counter=COUNTED.counter, counts={0: 7}, audit=audit, retention=10)
    recounted = await store.append_with_audit("s", [new("d", tokens=1)], COUNTED, write)
    assert recounted.token_before == audited.token_after
    assert recounted.token_after == await token_of(store) != audited.token_after
    assert [m.tokens for m in await store.read("s")] == [7, 1, 1, 1]
    assert [r["turn"] for r in await store.read_audit("s")] == [1, 2]


# -- commit_if_unchanged on the current token with an id already stored -----------------


async def test_a_current_commit_with_a_stored_or_repeated_id_is_the_fetch_and_writes_nothing(
    store: StoreFacade,
) -> None:
    """On Redis the hit's first new id is not looked up: its HSETNX (the commit's first
    write) says whether it is new. Stored already, it wrote nothing: the answer is the
    fetch a lookup would have given (the same as fetch_window's), nothing is stored."""
    await store.append("s", [new("a", id="m0", tokens=1), new("b", id="m1", tokens=1)], COUNTED)
    token = await token_of(store)
    history = await store.read("s")
    batches = {
        "the first id stored": [new("a", id="m0", tokens=1)],
        "the first stored, the second new": [
            new("b", id="m1", tokens=1),
            new("c", id="m2", tokens=1),
        ],
        "the first new, the second stored": [
            new("c", id="m2", tokens=1),
            new("a", id="m0", tokens=1),
        ],
        "the first new, repeated": [new("c", id="m2", tokens=1), new("c", id="m2", tokens=1)],
        "the first stored, repeated": [new("a", id="m0", tokens=1), new("a", id="m0", tokens=1)],
        "both stored": [new("a", id="m0", tokens=1), new("b", id="m1", tokens=1)],
    }
    for name, batch in batches.items():
        miss = await store.commit_if_unchanged("s", token, BIG, COUNTED, batch, 0, request(1))
        assert isinstance(miss, WindowFetch), name
        assert miss == await store.fetch_window("s", BIG, COUNTED, batch), name
        assert miss.appended is not None and miss.appended.duplicates, name
        assert await token_of(store) == token, name
        assert await store.read("s") == history, f"{name}: a message was stored"
        assert await store.read_audit("s") == [], f"{name}: a record was written"
    # by another counter: the switch would write before the HSETNX, so the id is looked up
    other = WriteOptions(counter="d")
    for name, batch in batches.items():
        miss = await store.commit_if_unchanged("s", token, BIG, other, batch, 0, request(1))
        assert isinstance(miss, WindowFetch), f"{name}, another counter"
        assert await token_of(store) == token, f"{name}, another counter: the switch was written"
        assert await store.read("s") == history, f"{name}, another counter"
    hit = await store.commit_if_unchanged(
        "s", token, BIG, COUNTED, [new("c", id="m2", tokens=1)], 0, request(1)
    )
    assert isinstance(hit, WindowHit)
    assert seqs(await store.read("s")) == [0, 1, 2]


# -- commit_if_unchanged: a hit --------------------------------------------------------


async def test_commit_if_unchanged_hit_appends_and_writes_the_numbered_record(
    store: StoreFacade,
) -> None:
    await store.append(
        "s", [new("be brief", role="system", tokens=2), new("q0", tokens=3)], COUNTED
    )
    token = (await store.fetch_window("s", BIG, COUNTED)).token
    assert token is not None

    batch = [new("a0", role="assistant", tokens=5), new("q1", tokens=7)]
    hit = await store.commit_if_unchanged("s", token, BIG, COUNTED, batch, 0, request(1))
    assert isinstance(hit, WindowHit)
    assert hit.appended == AppendResult(tuple(m.message.id for m in batch), (), 4)
    assert hit.turn == 1
    assert hit.token != token
    assert hit.token == await token_of(store)

    stored = await store.read("s")
    assert [(s.seq, s.message, s.tokens) for s in stored[2:]] == [
        (2, batch[0].message, 5),
        (3, batch[1].message, 7),
    ]
    [record] = await store.read_audit("s")
    assert record.pop("rid") and record == {"turn": 1, "kind": "request", "n": 1}
    info = await store.info("s")
    assert info is not None
    assert (info.message_count, info.token_total, info.audit_count) == (4, 17, 1)

    # the next request commits on the hit's token, numbered on
    q2 = new("q2", tokens=1)
    again = await store.commit_if_unchanged("s", hit.token, BIG, COUNTED, [q2], 0, request(2))
    assert isinstance(again, WindowHit) and again.turn == 2
    assert again.appended == AppendResult((q2.message.id,), (), 5)
    assert [r["turn"] for r in await store.read_audit("s")] == [1, 2]

    # no new message: the record alone, and the token stays
    only_audit = await store.commit_if_unchanged("s", again.token, BIG, COUNTED, [], 0, request(3))
    assert isinstance(only_audit, WindowHit) and only_audit.turn == 3
    assert only_audit.token == again.token == await token_of(store)

    # a record that is not a request is kept as it is, unnumbered; no write, no record
    note = RecordWrite(audit={"kind": "note"})
    noted = await store.commit_if_unchanged("s", only_audit.token, BIG, COUNTED, [], 0, note)
    assert isinstance(noted, WindowHit) and noted.turn == 0
    bare = await store.commit_if_unchanged(
        "s", noted.token, BIG, COUNTED, [new("q3", tokens=1)], 0, None
    )
    assert isinstance(bare, WindowHit) and bare.turn == 0
    assert [r.get("turn") for r in await store.read_audit("s")] == [1, 2, 3, None]
    assert [m.message.text for m in await store.read("s")][-2:] == ["q2", "q3"]
    window = await store.fetch_window("s", BIG, COUNTED)
    assert window.token == bare.token
    assert seqs(window.recent) == list(range(6))


async def test_commit_if_unchanged_hit_on_a_token_from_a_miss(store: StoreFacade) -> None:
    await store.append("s", [new("q0", tokens=1)], COUNTED)
    miss = await store.commit_if_unchanged(
        "s", "no-such-token", BIG, COUNTED, [new("q1", tokens=1)], 0, request(1)
    )
    assert isinstance(miss, WindowFetch) and miss.token is not None
    assert [s.message.text for s in miss.recent] == ["q0", "q1"]  # q1 as if appended
    assert await store.read_audit("s") == []
    hit = await store.commit_if_unchanged(
        "s", miss.token, BIG, COUNTED, [new("q2", tokens=1)], 0, request(1)
    )
    assert isinstance(hit, WindowHit) and hit.turn == 1
    assert [m.message.text for m in await store.read("s")] == ["q0", "q2"]  # a miss stores nothing


async def test_commit_if_unchanged_hit_switches_the_counter_as_an_append_does(
    store: StoreFacade,
) -> None:
    for sid in ("a", "b"):
        await store.append(
            sid, [new("q0", id="q0", tokens=5), new("a0", id="a0", tokens=5)], COUNTED
        )
    recount = WriteOptions(counter="c2")
    token = (await store.fetch_window("a", BIG, recount)).token  # a fetch switches nothing
    assert token is not None and (await store.info("a")).counter == "c"

    q1 = new("q1", id="q1", tokens=7)
    hit = await store.commit_if_unchanged("a", token, BIG, recount, [q1], 0, None)
    assert isinstance(hit, WindowHit)
    await store.append("b", [q1], recount)
    info_a, info_b = await store.info("a"), await store.info("b")
    assert info_a is not None and info_b is not None
    assert (info_b.counter, info_b.token_total) == ("c2", 7)
    assert (info_a.counter, info_a.token_total) == (info_b.counter, info_b.token_total)
    assert [m.tokens for m in await store.read("a")] == [None, None, 7]


# -- commit_if_unchanged: a miss does what fetch_window does -----------------------------

HISTORY = [new("be brief", role="system", tokens=4)]
HISTORY += [new(f"turn {i}", tokens=10) for i in range(1, 6)]
HISTORY += [new("use tools", role="developer", tokens=4)]
HISTORY += [new(f"turn {i}", tokens=10) for i in range(7, 10)]
LATE = new("written by another guard", tokens=10)
FRESH = new("fresh", tokens=10)
SUMMARY = Summary(version=1, text="so far", covers_to=3)


async def _nothing(store: StoreFacade, sid: str) -> None:
    return None


async def _late_append(store: StoreFacade, sid: str) -> None:
    await store.append(sid, [LATE], COUNTED)


async def _recount(store: StoreFacade, sid: str) -> None:
    await store.set_token_counts(sid, "c", {1: 3})


async def _summarize(store: StoreFacade, sid: str) -> None:
    assert await store.commit_summary(sid, SUMMARY, 0)


async def _retract(store: StoreFacade, sid: str) -> None:
    assert len(await store.retract(sid, 1)) == 1


Change = Callable[["StoreFacade", str], Awaitable[None]]

MISSES: list[Any] = [
    pytest.param(_late_append, [FRESH], 0, id="stale-after-append"),
    pytest.param(_recount, [FRESH], 0, id="stale-after-recount"),
    pytest.param(_summarize, [FRESH], 2, id="stale-after-summary"),
    pytest.param(_retract, [FRESH], 0, id="stale-after-retract"),
    pytest.param(_nothing, [HISTORY[-1], FRESH], 0, id="an-id-already-stored"),
    pytest.param(_nothing, [FRESH, FRESH], 0, id="an-id-repeated-in-the-batch"),
    pytest.param(_nothing, [HISTORY[2]], 3, id="only-stored-ids"),
]


@pytest.mark.parametrize(("change", "batch", "min_messages"), MISSES)
async def test_commit_if_unchanged_miss_is_fetch_window(
    store: StoreFacade, change: Change, batch: list[NewMessage], min_messages: int
) -> None:
    # "a" gets commit_if_unchanged, its twin "b" the same history and a plain fetch_window
    for sid in ("a", "b"):
        await store.append(sid, HISTORY, COUNTED)
    token = (await store.fetch_window("a", 35, COUNTED)).token
    assert token is not None
    for sid in ("a", "b"):
        await change(store, sid)

    got = await store.commit_if_unchanged("a", token, 35, COUNTED, batch, min_messages, request(1))
    want = await store.fetch_window("b", 35, COUNTED, batch, min_messages)

    assert isinstance(got, WindowFetch)
    assert not isinstance(got, WindowHit)
    assert got.recent == want.recent and got.recent
    assert got.pinned == want.pinned and got.pinned
    assert got.reached_start == want.reached_start
    assert got.summary == want.summary
    assert got.appended == want.appended
    assert got.stop_tokens == want.stop_tokens
    assert (got.info.message_count, got.info.token_total, got.info.counter) == (
        want.info.message_count,
        want.info.token_total,
        want.info.counter,
    )
    assert got.token is not None and got.token == await token_of(store, "a")
    if change is not _nothing:
        assert got.token != token  # something a window can see changed
    else:
        assert got.token == token  # a miss writes nothing

    stored_a = [(s.seq, s.message, s.tokens) for s in await store.read("a")]
    assert stored_a == [(s.seq, s.message, s.tokens) for s in await store.read("b")]
    ids = [m.id for _, m, _ in stored_a]
    assert len(ids) == len(set(ids))
    assert not {m.message.id for m in batch} - {m.message.id for m in HISTORY} & set(ids)
    assert got.appended is not None  # ... but says what a commit would store
    assert set(got.appended.stored) == {m.message.id for m in batch} - set(ids)
    audit = await store.read_audit("a")
    assert not [r for r in audit if r.get("kind") == "request"]  # the record was not written
    assert [r["kind"] for r in audit] == [r["kind"] for r in await store.read_audit("b")]


async def test_commit_if_unchanged_on_a_missing_session_fetches(store: StoreFacade) -> None:
    empty = await store.commit_if_unchanged("s", "anything", BIG, COUNTED, [], 0, request(1))
    assert isinstance(empty, WindowFetch)
    assert (empty.recent, empty.token, empty.reached_start) == ((), None, True)
    assert await store.info("s") is None

    q = new("q", tokens=2)
    virtual = await store.commit_if_unchanged("s", "anything", BIG, COUNTED, [q], 0, request(1))
    assert isinstance(virtual, WindowFetch)
    assert virtual.appended == AppendResult((q.message.id,), (), 1)
    assert seqs(virtual.recent) == [0] and virtual.token is None
    assert await store.info("s") is None and await store.read_audit("s") == []


# -- the cap -------------------------------------------------------------------------------


async def test_commit_if_unchanged_refuses_a_full_session(store: StoreFacade) -> None:
    capped = WriteOptions(counter="c", max_messages=3)
    held = [new(f"m{i}", tokens=1) for i in range(3)]
    await store.append("s", held, capped)
    token = await token_of(store)

    async def refused(with_token: str, batch: list[NewMessage]) -> None:
        before = await token_of(store)
        with pytest.raises(SessionFullError) as caught:
            await store.commit_if_unchanged("s", with_token, BIG, capped, batch, 0, request(1))
        assert (caught.value.session_id, caught.value.held) == ("s", 3)
        assert [s.message for s in await store.read("s")] == [m.message for m in held]
        assert await store.read_audit("s") == []
        assert await token_of(store) == before

    await refused(token, [new("one too many", tokens=1)])
    await refused(token, [held[0], new("one too many", tokens=1)])
    await store.set_token_counts("s", "c", {0: 5})  # the token moves on: a miss
    stale = token
    assert await token_of(store) != stale
    await refused(stale, [new("one too many", tokens=1)])
    await refused("no-such-token", [new("x", tokens=1), new("y", tokens=1)])

    # only stored ids fit, and a miss answers them as fetch_window does
    dups = await store.commit_if_unchanged("s", await token_of(store), BIG, capped, held, 0, None)
    assert isinstance(dups, WindowFetch) and dups.appended is not None
    assert dups.appended.all_duplicates and dups.appended.message_count == 3

    # with room left, the same request is a hit
    roomy = WriteOptions(counter="c", max_messages=4)
    last = new("fits", tokens=1)
    hit = await store.commit_if_unchanged(
        "s", await token_of(store), BIG, roomy, [last], 0, request(1)
    )
    assert isinstance(hit, WindowHit) and hit.appended.message_count == 4
    with pytest.raises(SessionFullError):
        await store.commit_if_unchanged("s", hit.token, BIG, roomy, [new("x")], 0, request(2))
    assert [r["turn"] for r in await store.read_audit("s")] == [1]


# -- two stores over the same sessions --------------------------------------------------------


async def test_two_stores_on_the_same_sessions_share_the_token(
    store_factory: StoreFactory,
) -> None:
    one, two = store_factory.make(), store_factory.make()
    await one.append("s", [new("a", tokens=1)], COUNTED)
    token = await token_of(one)
    assert await token_of(two) == token
    hit = await two.commit_if_unchanged("s", token, BIG, COUNTED, [new("b", tokens=1)], 0, None)
    assert isinstance(hit, WindowHit)
    assert await token_of(one) == hit.token


def test_an_audit_record_that_json_cannot_encode_as_utf8_is_escaped() -> None:
    from ctxguard.stores.base import REQUEST_RECORD_HEAD, decode_audit, encode_audit

    record = {"turn": 0, "kind": "request", "error": "bad \ud800 text", "n": [1, 2]}
    raw = encode_audit(record)
    assert raw.startswith(REQUEST_RECORD_HEAD)
    raw.encode("utf-8")  # storable: no lone surrogate left in the text
    assert decode_audit("s", 0, raw) == record
    plain = {"turn": 0, "kind": "request", "text": "日本 🙂", "ok": True, "none": None}
    assert (
        encode_audit(plain) == '{"turn":0,"kind":"request","text":"日本 🙂","ok":true,"none":null}'
    )
