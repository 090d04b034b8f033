"""The window cache: a cached turn is one round trip, and never a stale request.

The oracle throughout is a guard with ``window_cache_size=0``: it fetches the
window every time. Preparing the same messages again (same ids: the append is
a no-op) on the same session must give the very request the cached guard sent.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from ctxguard import Guard
from ctxguard.errors import BudgetError
from ctxguard.guard.prepared import PreparedRequest
from ctxguard.guard.window_cache import WindowCache, estimated_bytes, extend, speculate
from ctxguard.messages import Message
from ctxguard.stores import NewMessage, Summary, WriteOptions, open_store
from ctxguard.stores.base import SessionStore
from ctxguard.stores.memory import MemoryStore
from tests.conftest import recorded_ids

COUNTER = WriteOptions(counter="c")
SYSTEM = {"role": "system", "content": "You answer briefly."}


def said(text: str, role: str = "user") -> Message:
    return Message(role=role, content=text)


def make_guard(store: SessionStore, **settings: Any) -> Guard:
    settings.setdefault("max_tokens", 60)
    return Guard(store, counter="approx", limit=settings.pop("limit", 400), **settings)


def same_request(got: PreparedRequest, want: PreparedRequest) -> None:
    assert [m.id for m in got.messages] == [m.id for m in want.messages]
    assert (got.tokens, got.limit, got.reserved_output) == (
        want.tokens,
        want.limit,
        want.reserved_output,
    )
    assert got.dropped == want.dropped
    assert got.sent_seqs == want.sent_seqs
    assert got.decisions == want.decisions


class CallLog:
    """Wraps a store and records the name of every method the guard calls."""

    def __init__(self, inner: SessionStore) -> None:
        self.inner = inner
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls.append(name)
            return attr(*args, **kwargs)

        return call


@pytest.fixture(
    params=[
        "memory",
        pytest.param("redis", marks=pytest.mark.redis),
        pytest.param("cluster", marks=pytest.mark.cluster),
    ]
)
def open_one(
    request: pytest.FixtureRequest, namespace: str
) -> Iterator[Callable[[], SessionStore]]:
    """Opens stores on one backend that all see the same sessions."""
    opened: list[SessionStore] = []
    if request.param == "memory":
        shared = MemoryStore(namespace)

        def make() -> SessionStore:
            return shared

    else:
        url = request.getfixturevalue(f"{request.param}_url")

        def make() -> SessionStore:
            store = open_store(url, namespace=namespace)
            opened.append(store)
            return store

    yield make
    for store in opened:
        store.close()


# -- the pure parts: the walk re-run on a copy ----------------------------------


# small counts and budgets, so that a running total often lands exactly on the budget
counts_st = st.lists(st.integers(1, 8), min_size=0, max_size=40)


@settings(max_examples=400, deadline=None)
@given(
    history=counts_st,
    roles=st.lists(st.sampled_from(["user", "assistant", "system"]), min_size=40, max_size=40),
    later=counts_st,
    new_counts=st.lists(st.integers(1, 8), min_size=0, max_size=3),
    budget0=st.integers(0, 120),
    budget1=st.integers(0, 120),
)
@example(
    history=[10, 10, 10], roles=["user"] * 40, later=[5], new_counts=[], budget0=20, budget1=35
)
@example(
    history=[10, 10, 10], roles=["user"] * 40, later=[5], new_counts=[], budget0=20, budget1=25
)
def test_speculation_is_the_fetch_the_store_would_make(
    history: list[int],
    roles: list[str],
    later: list[int],
    new_counts: list[int],
    budget0: int,
    budget1: int,
) -> None:
    store = MemoryStore()

    def batch(counts: list[int], offset: int) -> list[NewMessage]:
        return [
            NewMessage(said(f"m{offset + i}", roles[(offset + i) % 40]), c)
            for i, c in enumerate(counts)
        ]

    store.append("s", batch(history, 0), COUNTER)
    entry = store.fetch_window("s", budget0, COUNTER)
    assert (entry.token is None) == (not history)  # a session that does not exist has none
    assume(entry.token is not None)
    later_batch = batch(later, len(history))
    appended = store.append("s", later_batch, COUNTER) if later else None
    if appended is not None:
        extended = extend(entry, later_batch, appended)
        assert extended is not None  # nothing else wrote: the copy follows exactly
        entry = extended
    new = batch(new_counts, 1000)

    guess = speculate(entry, new, budget1, len(new))
    actual = store.fetch_window("s", budget1, COUNTER, new, len(new))

    if budget1 <= budget0:
        assert guess is not None, "a walk that ends inside the copy must be re-run on it"
    if guess is not None:
        assert [(m.seq, m.message.id, m.tokens) for m in guess.recent] == [
            (m.seq, m.message.id, m.tokens) for m in actual.recent
        ]
        assert [p.seq for p in guess.pinned] == [p.seq for p in actual.pinned]
        assert guess.reached_start == actual.reached_start
        assert guess.stop_tokens == actual.stop_tokens
        assert guess.info.message_count == actual.info.message_count
        assert guess.info.token_total == actual.info.token_total


def test_a_copy_with_an_unknown_count_is_not_used() -> None:
    store = MemoryStore()
    store.append("s", [NewMessage(said("a"), None), NewMessage(said("b"), 5)], COUNTER)
    entry = store.fetch_window("s", 100, COUNTER)
    assert speculate(entry, [NewMessage(said("c"), 3)], 100, 1) is None


def test_the_lru_keeps_the_newest_sessions() -> None:
    store = MemoryStore()
    cache = WindowCache(2)
    for sid in ("a", "b", "c"):
        store.append(sid, [NewMessage(said("x"), 1)], COUNTER)
        cache.put(sid, store.fetch_window(sid, 10, COUNTER))
    assert (cache.get("a"), len(cache)) == (None, 2)
    assert cache.get("b") is not None and cache.get("c") is not None
    off = WindowCache(0)
    off.put("a", store.fetch_window("a", 10, COUNTER))
    assert off.get("a") is None


def test_the_cache_holds_no_more_than_its_memory_bound() -> None:
    store = MemoryStore()
    for sid, size in (("small", 1), ("big", 40), ("huge", 400)):
        store.append(sid, [NewMessage(said(f"m{i}"), 10) for i in range(size)], COUNTER)
    windows = {sid: store.fetch_window(sid, 10_000, COUNTER) for sid in ("small", "big", "huge")}
    bound = estimated_bytes(windows["small"]) + estimated_bytes(windows["big"])
    cache = WindowCache(100, max_bytes=bound)
    cache.put("small", windows["small"])
    cache.put("big", windows["big"])
    assert cache.bytes == bound and len(cache) == 2
    cache.put("huge", windows["huge"])  # alone over the bound: never kept, evicts nothing
    assert cache.get("huge") is None and len(cache) == 2
    cache.put("small", windows["big"])  # replacing an entry re-weighs it: the oldest goes
    assert cache.get("big") is None and cache.get("small") is not None
    assert cache.bytes == estimated_bytes(windows["big"]) <= bound
    cache.evict()
    assert (len(cache), cache.bytes) == (0, 0)


# -- the guard: one round trip, and the same request as without a cache ----------


def test_a_cached_turn_is_one_store_call_that_also_writes_the_audit(
    open_one: Callable[[], SessionStore],
) -> None:
    log = CallLog(open_one())
    guard = make_guard(log)  # type: ignore[arg-type]
    guard.append("s", [SYSTEM])
    first = guard.prepare("s", [said("hello")])
    guard.complete("s", said("hi there", "assistant"))
    log.calls.clear()

    second = guard.prepare("s", [said("and now?")])

    assert log.calls == ["commit_if_unchanged"]
    assert (first.turn, second.turn) == (1, 2)
    records = [r for r in log.inner.read_audit("s") if r["kind"] == "request"]
    assert [r["turn"] for r in records] == [1, 2]
    assert recorded_ids(log.inner, "s", records[-1]) == [m.id for m in second.messages]
    assert records[-1]["tokens"] == second.tokens


def test_without_a_cache_every_turn_fetches(open_one: Callable[[], SessionStore]) -> None:
    log = CallLog(open_one())
    guard = make_guard(log, window_cache_size=0)  # type: ignore[arg-type]
    for i in range(3):
        guard.prepare("s", [said(f"q{i}")])
        guard.complete("s", said(f"a{i}", "assistant"))
    # each turn: a fetch, the commit on its token (messages + record), the reply
    assert log.calls == ["fetch_window", "commit_if_unchanged", "append"] * 3


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    steps=st.lists(
        st.tuples(
            st.sampled_from(["turn", "turn", "turn", "other", "retract", "summary", "budget"]),
            st.integers(1, 30),
        ),
        min_size=1,
        max_size=25,
    )
)
def test_cached_requests_equal_fetched_ones_whatever_else_writes(
    open_one: Callable[[], SessionStore], steps: list[tuple[str, int]]
) -> None:
    """Other writers, retractions, summaries and budget changes between turns."""
    sid = "s" + uuid.uuid4().hex[:8]
    guard = make_guard(open_one())
    other = make_guard(open_one())
    oracle = make_guard(open_one(), window_cache_size=0)
    guard.append(sid, [SYSTEM])
    summaries = 0
    for kind, size in steps:
        words = " ".join(["word"] * size)
        if kind == "other":
            other.prepare(sid, [said(words)])
            other.complete(sid, said("other " + words, "assistant"))
            continue
        if kind == "retract":
            guard.store.retract(sid, 1)
            continue
        if kind == "summary":
            count = guard.store.info(sid).message_count  # type: ignore[union-attr]
            summary = Summary(version=summaries + 1, text="earlier: " + words, covers_to=count // 2)
            summaries += guard.store.commit_summary(sid, summary, summaries)
            continue
        max_tokens = 60 + size if kind == "budget" else 60
        new = [said("q " + words)]
        try:
            got = guard.prepare(sid, new, max_tokens=max_tokens)
        except BudgetError:
            with pytest.raises(BudgetError):
                oracle.prepare(sid, new, max_tokens=max_tokens)
            continue
        same_request(got, oracle.prepare(sid, new, max_tokens=max_tokens))
        guard.complete(sid, said("a " + words, "assistant"))


def test_a_recreated_session_is_not_served_from_the_copy(
    open_one: Callable[[], SessionStore],
) -> None:
    guard = make_guard(open_one())
    other = make_guard(open_one())
    for _ in range(2):
        guard.prepare("s", [said("same words")])
        guard.complete("s", said("same answer", "assistant"))
    other.store.delete("s")
    # the same number of the same operations: only the token's creation stamp differs
    other.prepare("s", [said("same words")])
    other.complete("s", said("same answer", "assistant"))
    other.prepare("s", [said("same words")])
    other.complete("s", said("same answer", "assistant"))

    req = guard.prepare("s", [said("next")])
    stored = [m.message.id for m in guard.store.read("s")]
    assert [m.id for m in req.messages] == stored


def test_a_refused_request_on_a_cached_session_stores_nothing_and_is_audited(
    open_one: Callable[[], SessionStore],
) -> None:
    guard = make_guard(open_one(), limit=200)
    guard.append("s", [SYSTEM])
    guard.prepare("s", [said("hi")])
    guard.complete("s", said("hello", "assistant"))
    before = [m.message.id for m in guard.store.read("s")]
    huge = said("word " * 400)
    with pytest.raises(BudgetError) as caught:
        guard.prepare("s", [huge])
    assert [m.message.id for m in guard.store.read("s")] == before
    refused = guard.store.read_audit("s")[-1]
    assert refused["kind"] == "refused" and refused["error"] == "BudgetError"
    assert (refused["ids"], refused["needed"]) == ([huge.id], caught.value.needed)
    assert "word" not in str(refused)  # ids and numbers, no content
    # the cached copy is still right: the next turn is sent as without a cache
    req = guard.prepare("s", [said("small")])
    assert [m.id for m in req.messages] == [m.message.id for m in guard.store.read("s")]


async def test_the_async_guard_takes_the_same_cached_path(namespace: str, redis_url: str) -> None:
    from ctxguard import AsyncGuard
    from ctxguard.stores import open_async_store

    store = open_async_store(redis_url, namespace=namespace)
    calls: list[str] = []
    for name in ("fetch_window", "commit_if_unchanged", "record", "append_with_audit"):
        setattr(store, name, _spied(getattr(store, name), name, calls))
    guard = AsyncGuard(store, counter="approx", limit=400, max_tokens=60)
    oracle = make_guard(open_store(redis_url, namespace=namespace), window_cache_size=0)
    await guard.append("s", [SYSTEM])
    for i in range(4):
        calls.clear()
        new = [said(f"question {i} " + "word " * 20)]
        got = await guard.prepare("s", new)
        first = ["fetch_window", "commit_if_unchanged"]
        assert calls == (first if i == 0 else ["commit_if_unchanged"])
        same_request(got, oracle.prepare("s", new))
        await guard.complete("s", said(f"answer {i} " + "word " * 20, "assistant"))
    await guard.aclose()
    oracle.close()


def _spied(method: Any, name: str, calls: list[str]) -> Any:
    async def call(*args: Any, **kwargs: Any) -> Any:
        calls.append(name)
        return await method(*args, **kwargs)

    return call


@pytest.mark.redis
def test_a_history_that_diverged_after_a_lost_write_is_not_served_from_the_copy(
    redis_url: str, namespace: str
) -> None:
    """A failover to a replica that missed our last write, then another writer's append:
    the version counter is back where ours was, but the token is not."""
    from ctxguard.stores.keys import KeySpace
    from tests.conftest import raw_client

    guard = make_guard(open_store(redis_url, namespace=namespace))
    other = make_guard(open_store(redis_url, namespace=namespace), window_cache_size=0)
    guard.append("s", [SYSTEM])
    guard.prepare("s", [said("first question")])
    keys = KeySpace(namespace, "default").session_keys("s")
    client = raw_client(redis_url)
    try:
        snapshot = {k: client.dump(k) for k in keys if client.exists(k)}
        lost = said("an answer the failover loses", "assistant")
        guard.complete("s", lost)  # the copy now holds it, with the token after it
        for key in keys:  # the replica that takes over never saw the answer
            client.delete(key)
        for key, value in snapshot.items():
            client.restore(key, 0, value)
        other.complete("s", said("another writer's answer", "assistant"))
    finally:
        client.close()

    req = guard.prepare("s", [said("next question")])
    sent = [m.id for m in req.messages]
    assert lost.id not in sent
    assert sent == [m.message.id for m in guard.store.read("s")]


def test_the_copies_built_field_by_field_keep_every_field() -> None:
    """extend/speculate build WindowFetch and SessionInfo positionally (speed): a field
    added later must not be dropped silently."""
    import dataclasses

    from ctxguard.guard.window_cache import _grown

    store = MemoryStore()
    store.append("s", [NewMessage(said("a"), 3), NewMessage(said("b"), 4)], COUNTER)
    entry = store.fetch_window("s", 100, COUNTER)
    new = [NewMessage(said("c"), 5)]
    grown = _grown(entry.info, 3, new)
    want = dataclasses.replace(entry.info, message_count=3, token_total=12)
    assert [getattr(grown, f.name) for f in dataclasses.fields(grown)] == [
        getattr(want, f.name) for f in dataclasses.fields(want)
    ]
    appended = store.append("s", new, COUNTER)
    extended = extend(entry, new, appended)
    assert extended is not None
    fresh = store.fetch_window("s", 100, COUNTER)
    for f in dataclasses.fields(fresh):
        if f.name not in ("info", "appended"):
            assert getattr(extended, f.name) == getattr(fresh, f.name), f.name


def test_threads_sharing_a_guard_and_a_session_each_send_the_newest_window(
    open_one: Callable[[], SessionStore],
) -> None:
    """Every request is a contiguous run of the history ending at its own user message,
    as the history stood when it was committed: no thread is served a stale copy."""
    import threading

    guard = make_guard(open_one(), limit=300, max_tokens=40)
    guard.append("s", [SYSTEM])
    sent: list[PreparedRequest] = []
    lock = threading.Lock()
    errors: list[BaseException] = []

    def writer(name: str) -> None:
        try:
            for i in range(25):
                req = guard.prepare("s", [said(f"{name} asks {i} " + "word " * (i % 7))])
                guard.complete("s", said(f"{name} answer {i}", "assistant"))
                with lock:
                    sent.append(req)
        except BaseException as exc:  # reported below, with the thread's name
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(f"w{k}",)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    history = [m.message.id for m in guard.store.read("s")]
    assert len(history) == len(set(history)) == 1 + 4 * 25 * 2
    for req in sent:
        body = [m.id for m in req.messages if m.role != "system"]
        end = history.index(body[-1])
        assert body == history[end - len(body) + 1 : end + 1]
        assert req.tokens + req.reserved_output <= req.limit


def test_a_cached_plan_reuses_only_the_items_its_messages_would_make() -> None:
    """The items kept with a cached window (``GuardCore._plan``'s ``reuse``) are taken
    only when they are the ones the fetch's messages make: the same Message object and
    count. A forged table (another message, another count, another seq's item) changes
    nothing in the plan; the genuine one is reused as the very objects."""
    from ctxguard.guard.plan import Item

    guard = make_guard(MemoryStore())
    guard.prepare("s", [SYSTEM, {"role": "user", "content": "one two three"}])
    for n in range(6):
        guard.complete("s", {"role": "assistant", "content": f"reply {n} " * 3})
        guard.prepare("s", [{"role": "user", "content": f"question {n} " * 3}])
    core = guard.core
    found = core.cache.get_with_items("s")
    assert found is not None
    fetch, kept = found
    assert kept, "the last cached plan's items are kept with the window"
    budget = core.budget(guard.limit_source.resolve(), 60, None)
    want, _, items = core._plan(fetch, budget, None, None)
    again, _, reused = core._plan(fetch, budget, None, kept)
    assert reused == items and again.window == want.window and again.pinned == want.pinned
    assert any(a is kept.get(a.seq) for a in reused)  # (the same objects: made once)
    other = said("forged")
    forged: dict[int, Item] = {}
    for index, item in enumerate(items):
        kind = index % 3
        if kind == 0:
            forged[item.seq] = Item(item.seq, other, item.tokens)  # another message
        elif kind == 1:
            forged[item.seq] = Item(item.seq, item.message, item.tokens + 7)  # another count
        else:
            forged[item.seq] = Item(item.seq + 1, item.message, item.tokens)  # another seq
    plan, _, made = core._plan(fetch, budget, None, forged)
    assert made == items
    assert [(i.seq, i.message.id, i.tokens) for i in plan.window] == [
        (i.seq, i.message.id, i.tokens) for i in want.window
    ]
    assert all(m is not forged[m.seq] for m in made)
