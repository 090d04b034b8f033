"""fetch_window on Redis is served by plain reads in one MULTI/EXEC (stores/window_reads.py):
its answer must be window.lua's fetch answer for every session and every argument.

Random sessions (pinned messages anywhere, summaries, unknown counts, other counters,
raw damage a script would refuse or walk around) are fetched both ways on the same
server, standalone and cluster, with random budgets, counters, caps, min_messages and
new messages (some ids stored already, some repeated), and with the first read sized
anywhere from a few rows to all of them (so the second read and the script fallback
run too): answers and errors must be equal.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctxguard.errors import CorruptRecordError, CtxGuardError
from ctxguard.messages import Message
from ctxguard.stores import NewMessage, Summary, WriteOptions, open_async_store, open_store
from ctxguard.stores.redis_clients import as_fetch
from tests.conftest import purge_namespace, raw_client

pytestmark = pytest.mark.redis

ROLES = ["user", "assistant", "user", "assistant", "system", "developer"]
COUNTERS = ["c1", "c1", "c1", "", "c2"]


def said(role: str, words: int, ident: int, tokens: int | None, word: str = "w ") -> NewMessage:
    message = Message(role=role, content=word * words, id=f"m{ident}")  # type: ignore[arg-type]
    return NewMessage(message, tokens)


message = st.builds(
    said,
    st.sampled_from(ROLES),
    st.integers(0, 120),  # unknown counts are estimated from the record's size (bytes)
    st.integers(0, 60),
    st.one_of(st.none(), st.integers(0, 40)),
    st.sampled_from(["w ", "w ", "中文 "]),
)
options = st.builds(
    lambda counter, cap: WriteOptions(counter=counter or None, max_messages=cap),
    st.sampled_from(COUNTERS),
    st.one_of(st.none(), st.none(), st.integers(1, 120)),
)
# raw damage: what the script refuses (CORRUPT ...) or walks around (one count per record)
DAMAGE = [
    ("rpush", 2, b"7"),  # toks: one count more than records
    ("rpush", 1, b'{"role":"user","content":"x"}'),  # msgs: a record without its count
    ("rpush", 2, b"x"),  # toks: not a number, and one count too many
    ("rpush", 4, b"999"),  # pins: a position past the history
    ("rpush", 4, b"zero"),  # pins: not a number
    ("hset", 0, b"tokens", b"many"),  # meta: an integer field that is not one
    ("hset", 0, b"count", b"1,2"),  # meta: two integers in one field (one regex reads all)
    ("hset", 0, b"ver", b""),  # meta: an empty integer field
    ("set", 3, b"not a hash"),  # ids: another type
    ("set", 1, b"not a list"),  # msgs: another type
    ("rpush", 5, b"a list"),  # sum: another type (after a DEL)
]
append_step = st.tuples(st.just("append"), st.lists(message, min_size=1, max_size=30), options)
step = st.one_of(
    append_step,
    append_step,
    append_step,
    st.tuples(
        st.just("counts"),
        st.sampled_from(COUNTERS[1:]),
        st.dictionaries(st.integers(0, 80), st.integers(0, 50), max_size=6),
    ),
    st.tuples(st.just("summary"), st.floats(0, 1.2)),
    st.tuples(st.just("damage"), st.sampled_from(range(len(DAMAGE)))),
)
fetch_args = st.tuples(
    st.integers(0, 2500),  # budget
    st.sampled_from(COUNTERS),
    st.one_of(st.none(), st.integers(-2, 3)),  # a cap, as the stored count + this
    st.lists(message, max_size=4),  # new messages (ids may be stored already)
    st.integers(0, 6),  # min_messages
    st.sampled_from([0.0, 0.5, 3.0, 40.0, 400.0, 5000.0]),  # the first read's tokens per row
)


def build(store: Any, session_id: str, steps: list[Any]) -> None:
    client = store.client
    keys = store.protocol.keys(session_id)
    for s in steps:
        try:
            if s[0] == "append":
                store.append(session_id, s[1], s[2])
            elif s[0] == "counts":
                store.set_token_counts(session_id, s[1], s[2])
            elif s[0] == "summary":
                info = store.info(session_id)
                count = 0 if info is None else info.message_count
                version = 0 if info is None else info.summary_version
                covers = int(count * s[1])  # past 1.0: more than the history (corrupt)
                summary = Summary(version=version + 1, text="sum", covers_to=covers, tokens=5)
                if covers <= count:
                    store.commit_summary(session_id, summary, version)
                else:
                    client.set(keys[5], summary.model_dump_json())
            else:
                kind, index, *values = DAMAGE[s[1]]
                if kind == "rpush" and index == 5:
                    client.delete(keys[5])
                if kind == "set":
                    client.delete(keys[index])
                getattr(client, kind)(keys[index], *values)
        except (CtxGuardError, redis.ResponseError):
            pass  # a damaged session refuses later writes: it is fetched as it is


def whole(window: Any) -> Any:
    """A fetch with the fields its == leaves out (the state token, the stop count)."""
    return window, window.token, window.stop_tokens


def stored_count(store: Any, session_id: str) -> int:
    try:
        return int(store.client.llen(store.protocol.keys(session_id)[1]))
    except redis.ResponseError:
        return 0


def outcome(fetch: Callable[[], Any]) -> Any:
    try:
        window = fetch()
        if window.token is None:  # no session: its info is made up now, times included
            info = dataclasses.replace(window.info, created_at=None, updated_at=None)
            window = dataclasses.replace(window, info=info)
        return ("ok", *whole(window))
    except CtxGuardError as exc:
        return ("error", type(exc).__name__, str(exc))


def by_script(store: Any, session_id: str, *args: Any) -> Any:
    call = store.protocol.window_call(session_id, *args)
    return as_fetch(store.protocol.parse_window(session_id, args[2], store._run(call), args[1]))


@pytest.fixture(params=["redis_url", "cluster_url"])
def server(request: pytest.FixtureRequest, namespace: str) -> Iterator[str]:
    url: str = request.getfixturevalue(request.param)
    yield url
    purge_namespace(url, namespace)


@settings(
    max_examples=400,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(steps=st.lists(step, max_size=6), fetches=st.lists(fetch_args, min_size=1, max_size=6))
def test_reads_answer_as_the_window_script(
    server: str, namespace: str, steps: list[Any], fetches: list[Any]
) -> None:
    store = open_store(server, namespace=namespace, tenant=uuid.uuid4().hex[:8])
    try:
        build(store, "s", steps)
        for budget, counter, cap, new, least, per_row in fetches:
            store._rows.per_row = per_row
            if cap is not None:  # near the stored count, where the cap's edge is
                cap = max(1, cap + stored_count(store, "s"))
            opts = WriteOptions(counter=counter or None, max_messages=cap)
            args = (budget, opts, new, least)
            ours = outcome(lambda: store.fetch_window("s", *args))  # noqa: B023
            theirs = outcome(lambda: by_script(store, "s", *args))  # noqa: B023
            assert ours == theirs, args
    finally:
        store.delete("s")
        store.close()


class Sent:
    """Records the script calls and the transactions a store sends."""

    def __init__(self, store: Any) -> None:
        self.scripts: list[str] = []
        self.rows: list[int] = []
        run, multi = store._run, store._multi

        def recorded_run(call: Any, *a: Any) -> Any:
            self.scripts.append(call.script)
            return run(call, *a)

        def recorded_multi(commands: Any) -> Any:
            self.rows.append(next(-c[2] for c in commands if c[0] == "LRANGE"))
            return multi(commands)

        store._run, store._multi = recorded_run, recorded_multi


def history(n: int, pinned_at: tuple[int, ...] = (0,)) -> list[NewMessage]:
    return [
        said("system" if i in pinned_at else ("user", "assistant")[i % 2], 20, i, 25)
        for i in range(n)
    ]


def test_a_plain_session_is_read_without_the_script(server: str, namespace: str) -> None:
    store = open_store(server, namespace=namespace)
    sent = Sent(store)
    opts = WriteOptions(counter="c1")
    try:
        store.append("s", history(300, pinned_at=(0, 150)), opts)
        new = [said("user", 3, 999, 4)]
        sent.scripts.clear()
        # first read: 64 rows (nothing learned yet); the pin at 150 is older than them
        # and than the window: a second read takes twice the rows and that position
        fetch = store.fetch_window("s", 2000, opts, new, 1)
        assert sent.scripts == [] and sent.rows == [64, 128]
        assert whole(fetch) == whole(by_script(store, "s", 2000, opts, new, 1))
        assert [m.seq for m in fetch.pinned] == [0, 150]
        assert fetch.recent[0].seq == 300 - 79 and fetch.recent[-1].message.id == "m999"
        # the window seen sizes the next first read (~25 tokens a row, x1.3 + 8): one
        # read, with the system message at position 0 read beside the rows
        store.append("t", history(300), opts)
        sent.rows.clear()
        sent.scripts.clear()
        fetch = store.fetch_window("t", 2000, opts, new, 1)
        assert sent.scripts == [] and sent.rows == [114]
        assert whole(fetch) == whole(by_script(store, "t", 2000, opts, new, 1))
        assert [m.seq for m in fetch.pinned] == [0] and fetch.recent[0].seq == 221
    finally:
        store.close()


def test_a_window_the_two_reads_miss_goes_to_the_script(server: str, namespace: str) -> None:
    store = open_store(server, namespace=namespace)
    sent = Sent(store)
    opts = WriteOptions(counter="c1")
    try:
        store.append("s", history(1000), opts)
        sent.scripts.clear()
        fetch = store.fetch_window("s", 20_000, opts)  # 800 messages: past 64, then 128
        assert sent.rows == [64, 128] and sent.scripts == ["window"]
        assert len(fetch.recent) == 800
        assert whole(fetch) == whole(by_script(store, "s", 20_000, opts, (), 0))
    finally:
        store.close()


def test_a_damaged_session_is_the_scripts_to_answer(server: str, namespace: str) -> None:
    store = open_store(server, namespace=namespace)
    sent = Sent(store)
    opts = WriteOptions(counter="c1")
    try:
        store.append("s", history(200), opts)  # more than a read's rows: only LLEN tells
        raw = raw_client(server)
        try:
            raw.rpush(store.protocol.keys("s")[2], "5")  # one count more than records
        finally:
            raw.close()
        sent.scripts.clear()
        with pytest.raises(CorruptRecordError, match="holds 201 counts for 200 messages"):
            store.fetch_window("s", 1000, opts)
        assert sent.scripts == ["window"]  # the script names the damage (a write would too)
    finally:
        store.close()


async def test_the_async_store_reads_the_same_window(server: str, namespace: str) -> None:
    sync = open_store(server, namespace=namespace)
    store = open_async_store(server, namespace=namespace)
    opts = WriteOptions(counter="c1")
    try:
        sync.append("s", history(300, pinned_at=(0, 150)), opts)
        new = [said("user", 3, 999, 4), said("user", 3, 999, 4)]  # one id repeated
        expected = whole(by_script(sync, "s", 2000, opts, new, 1))
        scripts: list[str] = []
        run = store._run

        async def recorded_run(call: Any, *a: Any) -> Any:
            scripts.append(call.script)
            return await run(call, *a)

        store._run = recorded_run  # type: ignore[method-assign]
        assert whole(await store.fetch_window("s", 2000, opts, new, 1)) == expected
        assert whole(await store.fetch_window("s", 2000, opts, new, 1)) == expected
        assert scripts == []
        # an id stored already (m5, the same message): the script compares the two
        # (_reuse.lua), and answers as it answers the sync store
        stored = [said("user", 3, 999, 4), said("assistant", 20, 5, 25)]
        expected = whole(by_script(sync, "s", 2000, opts, stored, 1))
        assert whole(await store.fetch_window("s", 2000, opts, stored, 1)) == expected
        assert scripts == ["window"]
    finally:
        sync.close()
        await store.close()
