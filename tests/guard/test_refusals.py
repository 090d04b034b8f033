"""A refused prepare changes nothing that is stored, and leaves a ``refused`` audit
record in an existing session (issue 12, items 4, 5 and 7); on memory, Redis and
Redis Cluster, with and without the window cache."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest

from ctxguard import Guard
from ctxguard.errors import (
    BudgetError,
    ConflictError,
    CorruptRecordError,
    CtxGuardError,
    InvalidInputError,
    InvalidMessageError,
    MessageTooLongError,
    TemplateRefusedError,
)
from ctxguard.guard import flows
from ctxguard.guard.plan import Budget
from ctxguard.guard.policies import check_plan
from ctxguard.guard.summarizers import ExtractiveSummarizer
from ctxguard.messages import Message
from ctxguard.stores import MemoryStore, SessionStore, Summary, open_store
from ctxguard.tokens import load_counter
from tests.conftest import recorded_ids


def said(text: str, role: str = "user", **kw: Any) -> Message:
    return Message(role=role, content=text, **kw)


def call(call_id: str, *more: str) -> Message:
    calls = [
        {"id": c, "type": "function", "function": {"name": "f", "arguments": "{}"}}
        for c in (call_id, *more)
    ]
    return Message(role="assistant", content=None, tool_calls=calls)


def result(call_id: str, text: str = "42") -> Message:
    return Message(role="tool", content=text, tool_call_id=call_id)


class Refusing:
    """The approx counter, with a chat template that refuses the word REFUSE."""

    def __init__(self) -> None:
        self.inner = load_counter("approx")
        self.fingerprint = "refusing-" + self.inner.fingerprint
        self.exact = True
        self.additive = False

    def count_message(self, message: Message) -> int:
        return self.inner.count_message(message)

    def request_overhead(self, *, tools: Any = None) -> int:
        return self.inner.request_overhead(tools=tools)

    def count_request(self, messages: Sequence[Message], *, tools: Any = None) -> int:
        if any("REFUSE" in (m.text or "") for m in messages):
            raise TemplateRefusedError("the chat template refuses this conversation")
        return self.inner.count_request(messages, tools=tools)


@pytest.fixture(
    params=[
        "memory",
        pytest.param("redis", marks=pytest.mark.redis),
        pytest.param("cluster", marks=pytest.mark.cluster),
    ]
)
def open_one(request: pytest.FixtureRequest, namespace: str) -> Iterator[Callable[[], Any]]:
    opened: list[SessionStore] = []
    if request.param == "memory":
        shared = MemoryStore(namespace)

        def make() -> Any:
            return shared

    else:
        url = request.getfixturevalue(f"{request.param}_url")

        def make() -> Any:
            store = open_store(url, namespace=namespace)
            opened.append(store)
            return store

    yield make
    for store in opened:
        store.close()


def guard_on(store: Any, cached: bool = True, **settings: Any) -> Guard:
    settings.setdefault("max_tokens", 60)
    settings.setdefault("counter", "approx")
    if not cached:
        settings["window_cache_size"] = 0
    return Guard(store, limit=settings.pop("limit", 400), **settings)


def snapshot(store: Any, sid: str = "s", token: bool = True) -> tuple[Any, ...]:
    info = store.info(sid)
    stored = [(m.seq, m.message.id, m.tokens) for m in store.read(sid)]
    state = store.fetch_window(sid, 10_000).token if token else None
    return stored, None if info is None else (info.message_count, info.token_total), state


REFUSALS: list[Any] = [
    pytest.param(lambda: [said("word " * 2000)], {}, BudgetError, id="budget"),
    pytest.param(
        lambda: [said("word " * 300)],
        {"max_message_tokens": 100},
        MessageTooLongError,
        id="message-too-long",
    ),
    pytest.param(
        lambda: [said("please REFUSE")],
        {"counter": Refusing()},
        TemplateRefusedError,
        id="template",
    ),
    pytest.param(lambda: [result("nope")], {}, InvalidMessageError, id="orphan-tool-result"),
]


@pytest.mark.parametrize("cached", [True, False], ids=["cached", "fetched"])
@pytest.mark.parametrize(("batch", "settings", "error"), REFUSALS)
def test_a_refused_prepare_stores_nothing_and_is_audited(
    open_one: Callable[[], Any],
    cached: bool,
    batch: Callable[[], list[Message]],
    settings: dict[str, Any],
    error: type[CtxGuardError],
) -> None:
    store = open_one()
    guard = guard_on(store, cached, **settings)
    oracle = guard_on(open_one(), False, **settings)
    guard.append("s", [said("be brief", "system")])
    guard.prepare("s", [said("hello")])
    guard.complete("s", said("hi", "assistant"))
    before = snapshot(store)
    audit_before = store.read_audit("s")

    refused = batch()
    with pytest.raises(error) as caught:
        guard.prepare("s", refused)
    assert "\n" not in str(caught.value)
    assert snapshot(store) == before  # no message, no count, same state token
    records = store.read_audit("s")
    assert records[:-1] == audit_before
    record = records[-1]
    assert record["kind"] == "refused" and record["error"] == error.__name__
    if error is not MessageTooLongError:  # refused while counting: ids not known yet
        assert record["ids"] == [m.id for m in refused]
    if isinstance(caught.value, BudgetError):
        assert (record["needed"], record["limit"]) == (caught.value.needed, caught.value.limit)
    assert "word" not in str(record) and "REFUSE" not in str(record)  # no content

    # the session goes on as if the refused prepare never happened (cache consistent)
    nxt = [said("and now?")]
    got = guard.prepare("s", nxt)
    want = oracle.prepare("s", [])  # the same history: nxt is stored now
    assert [m.id for m in got.messages] == [m.id for m in want.messages]
    assert got.messages[-1].id == nxt[0].id
    guard.close()
    oracle.close()


@pytest.mark.parametrize(("batch", "settings", "error"), REFUSALS)
def test_a_refused_first_prepare_creates_no_session(
    open_one: Callable[[], Any],
    batch: Callable[[], list[Message]],
    settings: dict[str, Any],
    error: type[CtxGuardError],
) -> None:
    store = open_one()
    guard = guard_on(store, **settings)
    with pytest.raises(error):
        guard.prepare("s", batch())
    assert store.info("s") is None and store.read_audit("s") == []
    assert list(store.list_sessions()) == []
    guard.close()


def test_nothing_to_send_is_refused(open_one: Callable[[], Any]) -> None:
    store = open_one()
    guard = guard_on(store)
    with pytest.raises(InvalidInputError, match="nothing to send"):
        guard.prepare("s")
    assert store.info("s") is None
    guard.close()


# -- item 5: tool results must answer the call just before them ---------------------


def test_tool_results_are_checked_against_the_window(open_one: Callable[[], Any]) -> None:
    store = open_one()
    guard = guard_on(store, limit=2000)
    guard.prepare("s", [said("weather?")])
    guard.complete("s", call("c1", "c2"))
    before = snapshot(store)

    for bad in ([result("c9")], [result("c1"), said("x"), result("c2")], [said("x"), result("c1")]):
        with pytest.raises(InvalidMessageError, match="tool_call_id") as caught:
            guard.prepare("s", bad)
        wrong = (
            next(m for m in bad if m.role == "tool" and m.tool_call_id != "c1")
            if bad[0].role == "tool" and bad[0].tool_call_id == "c9"
            else None
        )
        if wrong is not None:
            assert repr(wrong.tool_call_id) in str(caught.value)
        assert snapshot(store) == before

    # a call and its results in one batch, and results answering the stored call
    ok = guard.prepare("s", [result("c1"), result("c2")])
    assert [m.role for m in ok.messages][-3:] == ["assistant", "tool", "tool"]
    ok2 = guard.prepare("s", [said("and?"), call("c3"), result("c3")])
    assert [m.role for m in ok2.messages][-3:] == ["user", "assistant", "tool"]
    guard.close()


def test_a_batch_answering_part_of_a_call_is_a_typed_refusal(
    open_one: Callable[[], Any],
) -> None:
    """Results for some of a stored assistant message's tool calls, and nothing after
    them: the group cannot go out whole, so the newest new message cannot be sent. A
    typed one-line refusal that stores nothing (it was an internal error), with the
    cache and without; the whole batch then goes out."""
    for cached in (True, False):
        store = open_one()
        guard = guard_on(store, cached, limit=2000)
        guard.prepare("s", [said("weather?")])
        guard.complete("s", call("c1", "c2"))
        before = snapshot(store)
        for partial in ([result("c1")], [result("c2")]):
            with pytest.raises(InvalidInputError, match="cannot be sent") as caught:
                guard.prepare("s", partial)
            assert "internal error" not in str(caught.value)
            assert "\n" not in str(caught.value)
            assert repr(partial[0].tool_call_id) in str(caught.value)
            assert snapshot(store) == before
        ok = guard.prepare("s", [result("c1"), result("c2")])
        assert [m.role for m in ok.messages][-3:] == ["assistant", "tool", "tool"]
        guard.close()


def test_an_orphan_tool_result_on_a_new_session_is_refused(open_one: Callable[[], Any]) -> None:
    store = open_one()
    guard = guard_on(store)
    with pytest.raises(InvalidMessageError, match="'nope'"):
        guard.prepare("s", [result("nope")])
    assert store.info("s") is None
    guard.close()


def test_a_history_of_incomplete_tool_groups_only_is_a_typed_refusal(
    open_one: Callable[[], Any],
) -> None:
    """prepare(s, []) where tool integrity drops every stored message (a call still
    waiting for its results, a result stored by append or import without its call)
    has nothing to send: a typed one-line error, never an internal error."""
    for cached in (True, False):
        store = open_one()
        guard = guard_on(store, cached)
        waiting, orphan = f"waiting{cached}", f"orphan{cached}"
        guard.append(waiting, [call("c1")])
        guard.append(orphan, [result("zz")])
        for sid in (waiting, orphan):
            before = snapshot(store, sid)
            with pytest.raises(InvalidInputError, match="nothing to send") as caught:
                guard.prepare(sid, [])
            assert "internal error" not in str(caught.value)
            assert "\n" not in str(caught.value)
            assert snapshot(store, sid) == before
        guard.close()


def test_a_tool_call_beyond_the_budget_is_a_budget_error_not_an_empty_request(
    open_one: Callable[[], Any],
) -> None:
    store = open_one()
    guard = guard_on(store, limit=600, degrade_tool_results=False)
    guard.prepare("s", [said("fetch both")])
    guard.complete("s", call("c1", "c2"))
    guard.append("s", [result("c1", "data " * 400)])  # alone, nearly the whole budget
    before = snapshot(store)
    with pytest.raises(BudgetError):
        guard.prepare("s", [result("c2", "more " * 100)])
    assert snapshot(store) == before
    guard.close()


# -- item 7: a summary beyond the history is corrupt; the newest message always goes ---


def test_a_summary_beyond_the_history_is_corrupt(open_one: Callable[[], Any]) -> None:
    for cached in (True, False):
        store = open_one()
        sid = f"s{cached}"
        guard = guard_on(store, cached)
        guard.prepare(sid, [said("hello")])
        guard.complete(sid, said("hi", "assistant"))
        store.restore(sid, 0, Summary(version=1, text="from elsewhere", covers_to=9))
        before = snapshot(store, sid, token=False)
        with pytest.raises(CorruptRecordError) as caught:
            guard.prepare(sid, [said("new question")])
        assert caught.value.key is not None and caught.value.key.endswith("sum")
        assert "covers messages up to position 9" in str(caught.value)
        assert snapshot(store, sid, token=False) == before


def test_check_plan_requires_the_newest_new_message_and_some_message() -> None:
    budget = Budget(limit=1000, reserved_output=10, safety_margin=0, overhead=3, limit_source="t")
    newest = said("q")
    assert check_plan([said("older"), newest], budget, 10, newest) == []
    assert "lacks the newest new message" in " ".join(
        check_plan([said("older")], budget, 10, newest)
    )
    assert check_plan([], budget, 0) == ["request has no messages"]


def test_a_plan_without_the_newest_message_raises_instead_of_sending(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Any future bug that drops the user's new message raises (planted here)."""
    from ctxguard.guard import core as core_module

    real = core_module.GuardCore.plan

    def dropping(self: Any, *args: Any, **kw: Any) -> Any:
        plan, recounts = real(self, *args, **kw)
        plan.window = plan.window[:-1]
        return plan, recounts

    monkeypatch.setattr(core_module.GuardCore, "plan", dropping)
    store = MemoryStore("x")
    guard = guard_on(store, cached=False)
    guard.append("s", [said("earlier")])
    with pytest.raises(CtxGuardError, match="lacks the newest new message"):
        guard.prepare("s", [said("new")])
    assert [m.message.text for m in store.read("s")] == ["earlier"]


# -- the commit: planned again when another writer came first, bounded ---------------


class Interfering:
    """A store where another writer appends just before each of the first ``n`` commits."""

    def __init__(self, inner: Any, n: int) -> None:
        self.inner = inner
        self.n = n
        self.other = 0
        self.fetches = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def commit_if_unchanged(self, session_id: str, *args: Any) -> Any:
        if self.n > 0:
            self.n -= 1
            self.other += 1
            self.inner.append(
                session_id,
                guard_on(MemoryStore()).core.encode_new([said(f"other writer {self.other}")]),
            )
        return self.inner.commit_if_unchanged(session_id, *args)

    def fetch_window(self, session_id: str, *args: Any) -> Any:
        self.fetches += 1
        return self.inner.fetch_window(session_id, *args)


def test_a_commit_after_another_writer_plans_again(
    open_one: Callable[[], Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    sleeps: list[float] = []
    monkeypatch.setattr("time.sleep", sleeps.append)
    store = open_one()
    guard_on(store).prepare("s", [said("hello")])
    wrapped = Interfering(store, 3)
    guard = guard_on(wrapped, cached=False)
    q = said("mine")
    req = guard.prepare("s", [q])
    history = [m.message.text for m in store.read("s")]
    assert history == ["hello", "other writer 1", "other writer 2", "other writer 3", "mine"]
    assert [m.text for m in req.messages] == history  # planned on the state it committed to
    requests = [r for r in store.read_audit("s") if r["kind"] == "request"]
    assert len(requests) == 2 and recorded_ids(store, "s", requests[-1]) == [
        m.id for m in req.messages
    ]
    # the second plan used what the lost commit sent back; later ones waited a little and
    # read the session afresh (planning on a state older than the wait would lose again)
    assert len(sleeps) == 3 - flows.FRESH_REPLANS + 1
    assert wrapped.fetches == 1 + len(sleeps)  # the first fetch (cache off), one after each wait


def test_a_commit_that_never_holds_is_a_conflict_and_stores_nothing(
    open_one: Callable[[], Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("time.sleep", lambda s: None)
    store = open_one()
    guard_on(store).prepare("s", [said("hello")])
    guard = guard_on(Interfering(store, 10_000), cached=False)
    q = said("mine")
    with pytest.raises(ConflictError, match="retry") as caught:
        guard.prepare("s", [q])
    assert "\n" not in str(caught.value)
    assert q.id not in [m.message.id for m in store.read("s")]
    assert len(store.read("s")) == 1 + flows.MAX_COMMITS


def test_a_retried_prepare_does_not_store_or_count_twice(open_one: Callable[[], Any]) -> None:
    store = open_one()
    guard = guard_on(store)
    q = said("hello")
    first = guard.prepare("s", [q])
    again = guard_on(store).prepare("s", [q])  # another process retries the same message
    assert [m.message.id for m in store.read("s")] == [q.id]
    assert [m.id for m in again.messages] == [m.id for m in first.messages] == [q.id]
    assert again.tokens == first.tokens


@pytest.mark.parametrize("cached", [True, False], ids=["cached", "fetched"])
def test_a_request_the_template_refuses_commits_no_due_summary(
    open_one: Callable[[], Any], cached: bool
) -> None:
    """A summary due on this turn is folded in only for a request the counter accepts:
    a template refusal leaves the summary, the messages and the state token as they
    were (the summary was committed first, then the request refused)."""
    store = open_one()
    plain = guard_on(store, cached, counter=Refusing())  # no summarizer: one falls due
    plain.append("s", [said("be brief " * 8, "system")])
    for i in range(8):
        plain.prepare("s", [said(f"question {i} " + "word " * 12)])
        plain.complete("s", said(f"answer {i} " + "word " * 12, "assistant"))
    guard = guard_on(
        store, cached, counter=Refusing(), summarizer=ExtractiveSummarizer(), summarize_after=1
    )
    before = snapshot(store)
    with pytest.raises(TemplateRefusedError) as caught:
        guard.prepare("s", [said("please REFUSE")])
    assert "\n" not in str(caught.value)
    assert store.info("s").summary_version == 0
    assert snapshot(store) == before
    assert store.read_audit("s")[-1]["kind"] == "refused"
    guard.prepare("s", [said("go on")])
    assert store.info("s").summary_version == 1  # (it was due)
    guard.close()
    plain.close()
