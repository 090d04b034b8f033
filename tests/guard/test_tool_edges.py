"""Tool groups at the edges of prepare: every request sent has whole tool groups (an
assistant message with tool_calls, then every result answering it), or prepare is a
typed one-line refusal that stores nothing. On memory, Redis and Redis Cluster, with
the window cache and without (the warm path ``window_cache.speculate`` and the fetch).

The rules (README, "Tool groups"):

* new tool results whose group (with its user turn when there is one) cannot fit the
  budget: ``BudgetError`` with the numbers, whether the call slid out of the fetched
  window or the group alone is over the room beside the pinned messages;
* a resent batch (every id stored already) stores nothing: before another message is
  stored it is the same request as the first time, after it the session as it stands;
* new tool calls with nothing after them in the batch, two results for one
  tool_call_id, a result whose call is not the message before it, results for part
  of a call with nothing after them: ``InvalidMessageError``;
* a stored call message giving two calls one id (an import; new ones are refused) is
  left out with its results (``test_duplicate_call_ids``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctxguard import Guard
from ctxguard.errors import BudgetError, CtxGuardError, InvalidInputError, InvalidMessageError
from ctxguard.guard.policies import tool_problems
from ctxguard.guard.summarizers import ExtractiveSummarizer
from ctxguard.ids import new_message_id
from ctxguard.messages import Message
from ctxguard.stores.contract import NewMessage
from tests.guard.test_refusals import call, guard_on, open_one, result, said, snapshot

__all__ = ["open_one"]  # the fixture: memory, Redis, cluster

CACHED = pytest.mark.parametrize("cached", [True, False], ids=["cached", "fetched"])


def well_formed(messages: tuple[Message, ...] | list[Message]) -> None:
    """What every OpenAI-compatible server needs of the tool messages."""
    assert tool_problems(messages) == []
    assert messages and messages[-1].role != "assistant"


def refused(
    guard: Guard, store: Any, sid: str, batch: list[Message], error: type[CtxGuardError]
) -> CtxGuardError:
    """prepare(sid, batch) raises ``error`` (one line, not an internal error), stores
    nothing and leaves a ``refused`` audit record."""
    before = snapshot(store, sid)
    audit_before = len(store.read_audit(sid))
    with pytest.raises(error) as caught:
        guard.prepare(sid, batch)
    text = str(caught.value)
    assert "\n" not in text and "internal error" not in text
    assert snapshot(store, sid) == before  # no message, no count, same state token
    records = store.read_audit(sid)
    assert len(records) == audit_before + 1 and records[-1]["kind"] == "refused"
    assert records[-1]["error"] == error.__name__
    return caught.value


def history(guard: Guard, sid: str, turns: int, words: int = 12) -> None:
    guard.append(sid, [said("be brief " * 8, "system")])
    for i in range(turns):
        guard.prepare(sid, [said(f"question {i} " + "word " * words)])
        guard.complete(sid, said(f"answer {i} " + "word " * words, "assistant"))


# -- 1. new results for a call older than the window, or a group bigger than the room --


@CACHED
@pytest.mark.parametrize("policy", ["sliding", "stable"])
@pytest.mark.parametrize("summaries", [False, True], ids=["plain", "summaries"])
def test_results_whose_group_fits_go_out_with_their_call(
    open_one: Callable[[], Any], cached: bool, policy: str, summaries: bool
) -> None:
    """A long history, a small budget: the new results go out with the assistant message
    calling them and its user turn, older turns left out."""
    store = open_one()
    extra: dict[str, Any] = {"window_policy": policy}
    if summaries:
        extra.update(summarizer=ExtractiveSummarizer(), summarize_after=2)
    guard = guard_on(store, cached, limit=400, **extra)
    history(guard, "s", 12)
    guard.prepare("s", [said("fetch both")])
    guard.complete("s", call("c1", "c2"))
    got = guard.prepare("s", [result("c1", "data " * 20), result("c2", "more " * 20)])
    well_formed(got.messages)
    roles = [m.role for m in got.messages]
    assert roles[0] == "system" and roles[-4:] == ["user", "assistant", "tool", "tool"]
    assert got.dropped  # the budget left older turns out
    assert got.tokens + got.reserved_output <= got.limit
    guard.close()


@CACHED
@pytest.mark.parametrize("policy", ["sliding", "stable"])
@pytest.mark.parametrize("summaries", [False, True], ids=["plain", "summaries"])
def test_results_whose_call_slid_out_of_the_window_are_a_budget_error(
    open_one: Callable[[], Any], cached: bool, policy: str, summaries: bool
) -> None:
    """The results alone fill the budget, so the walk stops before the call: sending
    them would split the group. BudgetError with the numbers; nothing stored; with
    degrade on they are shrunk and go out with their call."""
    store = open_one()
    extra: dict[str, Any] = {"window_policy": policy, "degrade_tool_results": False}
    if summaries:
        extra.update(summarizer=ExtractiveSummarizer(), summarize_after=2)
    guard = guard_on(store, cached, limit=400, **extra)
    history(guard, "s", 8)
    guard.prepare("s", [said("fetch both")])
    guard.complete("s", call("c1", "c2"))
    big = [result("c1", "data " * 200), result("c2", "more " * 200)]
    error = refused(guard, store, "s", big, BudgetError)
    assert isinstance(error, BudgetError) and error.needed > error.limit
    assert "cannot fit" in str(error)
    shrinking = guard_on(store, cached, limit=400, window_policy=policy)
    got = shrinking.prepare("s", big)
    well_formed(got.messages)
    assert [m.role for m in got.messages][-3:] == ["assistant", "tool", "tool"]
    shrinking.close()
    guard.close()


@CACHED
@pytest.mark.parametrize("policy", ["sliding", "stable"])
def test_a_tool_only_continuation_bigger_than_the_room_is_a_budget_error(
    open_one: Callable[[], Any], cached: bool, policy: str
) -> None:
    """No user message in the session (a call stored by append, as an agent run does):
    the newest turn is the whole group, never its last result alone. Over the room
    beside the system prompt: BudgetError (it was an InvalidInputError saying no call
    was stored on the sliding window, an internal error on the stable one)."""
    store = open_one()
    guard = guard_on(store, cached, window_policy=policy, degrade_tool_results=False)
    guard.append("s", [said("system " * 40, "system"), call("c1", "c2")])
    guard.prepare("s", [])  # (the cache holds the session)
    batch = [result("c1", "data " * 150), result("c2", "x")]
    error = refused(guard, store, "s", batch, BudgetError)
    assert isinstance(error, BudgetError) and error.needed > error.limit
    got = guard.prepare("s", [result("c1", "data " * 20), result("c2", "x")])
    well_formed(got.messages)
    assert [m.role for m in got.messages] == ["system", "assistant", "tool", "tool"]
    guard.close()


# -- 2. a resent batch: the same request before the reply, nothing stored after ---------


@CACHED
@pytest.mark.parametrize("kind", ["user", "tool"])
def test_a_resent_message_is_the_same_request_until_answered_then_stores_nothing(
    open_one: Callable[[], Any], cached: bool, kind: str
) -> None:
    """One rule for any resent message: before its reply, the request of the first
    time (nothing stored twice); after it, nothing stored either (no refusal: a retry
    of a shared session cannot tell another writer's reply from its own answer, and
    refusing it broke the guard's own retries under connection kills)."""
    store = open_one()
    guard = guard_on(store, cached, limit=2000)
    history(guard, "s", 2)
    if kind == "user":
        batch = [said("what now?")]
    else:
        guard.prepare("s", [said("weather?")])
        guard.complete("s", call("c1", "c2"))
        batch = [result("c1"), result("c2")]
    first = guard.prepare("s", batch)
    again = guard_on(store, cached, limit=2000).prepare("s", batch)  # a retry elsewhere
    retry = guard.prepare("s", batch)
    assert [m.id for m in again.messages] == [m.id for m in first.messages]
    assert [m.id for m in retry.messages] == [m.id for m in first.messages]
    assert retry.tokens == first.tokens
    reply = said("here you go", "assistant")
    guard.complete("s", reply)
    for who in (guard, guard_on(store, cached, limit=2000)):
        before = snapshot(store, "s")
        got = who.prepare("s", batch)
        assert snapshot(store, "s") == before
        assert batch[-1].id in [m.id for m in got.messages]
        assert tool_problems(got.messages) == []
    nxt = guard.prepare("s", [said("thanks")])
    well_formed(nxt.messages)
    assert nxt.messages[-1].text == "thanks"
    guard.close()


def test_a_resend_with_a_new_message_goes_out_and_stores_only_the_new_one(
    open_one: Callable[[], Any],
) -> None:
    store = open_one()
    guard = guard_on(store, limit=2000)
    q = said("hello")
    guard.prepare("s", [q])
    guard.complete("s", said("hi", "assistant"))
    got = guard.prepare("s", [q, said("again")])
    assert [m.text for m in got.messages] == ["hello", "hi", "again"]
    assert [m.message.text for m in store.read("s")] == ["hello", "hi", "again"]
    guard.close()


# -- 3. the other edges: each a typed one-line refusal that stores nothing -------------


EDGES: list[Any] = [
    pytest.param(lambda: [result("c1"), result("c1")], "both answer", id="same-result-twice"),
    pytest.param(lambda: [result("c2"), result("c1"), result("c1")], "both", id="repeat-later"),
    pytest.param(lambda: [said("and?"), call("c9")], "nothing after it", id="call-no-results"),
    pytest.param(lambda: [call("c9")], "nothing after it", id="call-alone"),
    pytest.param(lambda: [result("c1"), result("c2"), call("c9")], "c9", id="results-then-call"),
    pytest.param(lambda: [result("zz")], "'zz'", id="unknown-call-id"),
    pytest.param(lambda: [said("x"), result("c1")], "'c1'", id="result-after-user"),
    pytest.param(lambda: [result("c1")], "cannot be sent", id="part-of-a-call"),
    pytest.param(
        lambda: [said("x"), call("c7", "c8"), result("c7")], "cannot be sent", id="new-part"
    ),
]


@CACHED
@pytest.mark.parametrize(("batch", "match"), EDGES)
def test_tool_group_edges_are_typed_refusals(
    open_one: Callable[[], Any], cached: bool, batch: Callable[[], list[Message]], match: str
) -> None:
    store = open_one()
    guard = guard_on(store, cached, limit=2000)
    history(guard, "s", 2)
    guard.prepare("s", [said("weather?")])
    guard.complete("s", call("c1", "c2"))
    error = refused(guard, store, "s", batch(), InvalidMessageError)
    assert match in str(error)
    ok = guard.prepare("s", [result("c1"), result("c2")])  # the session goes on
    well_formed(ok.messages)
    assert [m.role for m in ok.messages][-3:] == ["assistant", "tool", "tool"]
    guard.close()


@CACHED
def test_part_of_a_call_is_refused_before_a_due_summary_is_committed(
    open_one: Callable[[], Any], cached: bool
) -> None:
    """A summary due on this turn is not committed for a request that is then refused:
    the state token does not move (it moved: the summary was folded in first). (A
    summary is folded only on the fetch path: a due one sends the cache there.)"""
    store = open_one()
    plain = guard_on(store, cached)  # no summarizer: one is due at the next prepare
    history(plain, "s", 8)
    plain.prepare("s", [said("fetch both")])
    plain.complete("s", call("c1", "c2"))
    assert store.info("s").summary_version == 0
    guard = guard_on(store, cached, summarizer=ExtractiveSummarizer(), summarize_after=1)
    refused(guard, store, "s", [result("c1", "data " * 20)], InvalidMessageError)
    assert store.info("s").summary_version == 0
    got = guard.prepare("s", [result("c1", "data " * 20), result("c2")])
    well_formed(got.messages)
    assert store.info("s").summary_version == 1  # (it was due)
    guard.close()
    plain.close()


@CACHED
def test_a_tool_call_id_may_recur_in_a_later_call(
    open_one: Callable[[], Any], cached: bool
) -> None:
    """Call ids are unique per call message only (some models number them per turn):
    the same id in two groups, stored or in one batch, is two groups, both sent."""
    store = open_one()
    guard = guard_on(store, cached, limit=2000)
    guard.prepare("s", [said("weather?")])
    guard.complete("s", call("c1"))
    guard.prepare("s", [result("c1", "sunny")])
    guard.complete("s", call("c1"))
    got = guard.prepare("s", [result("c1", "rainy"), said("and?"), call("c1"), result("c1")])
    well_formed(got.messages)
    assert [m.role for m in got.messages].count("tool") == 3
    guard.close()


@CACHED
def test_a_result_answering_a_call_answered_already_is_refused(
    open_one: Callable[[], Any], cached: bool
) -> None:
    store = open_one()
    guard = guard_on(store, cached, limit=2000)
    guard.prepare("s", [said("weather?")])
    guard.complete("s", call("c1", "c2"))
    first = result("c1")
    guard.append("s", [first])
    error = refused(guard, store, "s", [result("c1", "again"), result("c2")], InvalidMessageError)
    assert "answers already" in str(error) and repr(first.id) in str(error)
    ok = guard.prepare("s", [result("c2")])
    well_formed(ok.messages)
    guard.close()


@CACHED
def test_a_stored_second_result_for_one_call_is_left_out_not_sent(
    open_one: Callable[[], Any], cached: bool
) -> None:
    """A history holding two results for one tool_call_id (stored by append or an
    import, which do not check groups): the second is an orphan, left out as such;
    the request is well-formed (it was an internal error)."""
    store = open_one()
    guard = guard_on(store, cached, limit=2000)
    guard.prepare("s", [said("weather?")])
    guard.complete("s", call("c1"))
    kept, repeated = result("c1", "sunny"), result("c1", "rainy")
    guard.append("s", [kept, repeated])
    got = guard.prepare("s", [])
    well_formed(got.messages)
    assert kept.id in [m.id for m in got.messages]
    assert repeated.id not in [m.id for m in got.messages]
    assert any(d["policy"] == "tool_integrity" for d in got.decisions)
    guard.close()


# -- property: random histories with tool groups, random budgets -----------------------


TURN = st.tuples(
    st.integers(1, 60),  # words of the user message
    st.sampled_from(["plain", "inline", "later", "later-split", "agent", "resend", "repeated"]),
    st.integers(1, 3),  # tool calls
    st.lists(st.integers(1, 150), min_size=3, max_size=3),  # words of each result
    st.integers(1, 60),  # words of the reply
)


def run_random(guard: Guard, store: Any, sid: str, turns: list[Any]) -> None:
    """Every prepare is well-formed or a typed refusal that stored nothing."""
    last: list[Message] = []

    def prepare(batch: list[Message], resend: bool = False) -> bool:
        before = snapshot(store, sid)
        try:
            req = guard.prepare(sid, batch)
        except (BudgetError, InvalidInputError) as exc:
            assert "\n" not in str(exc) and "internal error" not in str(exc)
            assert snapshot(store, sid) == before
            return False
        if resend:  # no message stored twice (a due summary may be folded in); after its
            # reply the window ends on that reply
            assert [s[1] for s in snapshot(store, sid)[0]] == [s[1] for s in before[0]]
            assert tool_problems(req.messages) == []
        else:
            well_formed(req.messages)
        assert req.tokens + req.reserved_output <= req.limit
        newest = [m for m in batch if m.role in ("user", "tool")][-1]
        assert newest.id in [m.id for m in req.messages]
        return True

    for number, (words, kind, calls, sizes, reply) in enumerate(turns):
        user = said(f"q{number} " + "word " * words)
        ids = [f"c{number}_{k}" for k in range(calls)]
        results = [result(i, "data " * sizes[k]) for k, i in enumerate(ids)]
        if kind == "resend" and last:
            prepare(last, resend=True)  # before or after its reply: never a bad request
            continue
        if kind == "inline":
            batch = [user, call(*ids), *results]
        elif kind == "agent":  # a call stored without a user turn (an agent run's step)
            guard.append(sid, [call(*ids)])
            batch = results
        elif kind == "repeated":  # imported: a call repeating an id, with its results
            stored = [call(ids[0], *ids), *results]
            store.append(sid, [NewMessage(m) for m in stored], guard.core.write_options)
            batch = [user]
        elif kind in ("later", "later-split"):
            if not prepare([user]):
                continue
            guard.complete(sid, call(*ids))
            batch = results
            if kind == "later-split" and calls > 1:
                prepare(results[:1])  # part of the call: refused, stores nothing
        else:
            batch = [user]
        last = batch
        if prepare(batch):
            guard.complete(sid, said("a " + "word " * reply, "assistant"))


@pytest.mark.parametrize("cached", [True, False], ids=["cached", "fetched"])
@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    turns=st.lists(TURN, min_size=2, max_size=12),
    limit=st.integers(150, 900),
    reserve=st.sampled_from([10, 60]),
    system=st.integers(0, 60),
    policy=st.sampled_from(["sliding", "stable"]),
    summarize_after=st.one_of(st.none(), st.integers(1, 5)),
    degrade=st.booleans(),
)
def test_random_tool_histories_are_well_formed_or_refused(
    open_one: Callable[[], Any],
    cached: bool,
    turns: list[Any],
    limit: int,
    reserve: int,
    system: int,
    policy: str,
    summarize_after: int | None,
    degrade: bool,
) -> None:
    store = open_one()
    extra: dict[str, Any] = {"window_policy": policy, "degrade_tool_results": degrade}
    if summarize_after is not None:
        extra.update(summarizer=ExtractiveSummarizer(), summarize_after=summarize_after)
    guard = guard_on(store, cached, limit=limit, max_tokens=reserve, **extra)
    sid = "p" + new_message_id()  # one session per example (the store is the fixture's)
    if system:
        guard.append(sid, [said("rule " * system, "system")])
    try:
        run_random(guard, store, sid, turns)
    finally:
        guard.close()
