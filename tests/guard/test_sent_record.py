"""Request records say what was sent as seq ranges + a digest, and readers rebuild the ids.

The record's size must not grow with the window (issue 16: audit memory), and
what it says must still be enough to rebuild, in order, every id the request sent
(the summary included), or to tell that the history changed since.
"""

from __future__ import annotations

import itertools
import json
import uuid

from hypothesis import example, given
from hypothesis import strategies as st

from ctxguard.guard import Guard
from ctxguard.guard.sent import ids_digest, sent_count, sent_fields, sent_ids, sent_seqs, seq_ranges
from ctxguard.messages import Message
from ctxguard.stores import open_store
from tests.conftest import private_memory_url, recorded_ids


@given(st.lists(st.integers(0, 300), unique=True).map(sorted))
def test_ranges_hold_exactly_the_seqs(seqs: list[int]) -> None:
    ranges = seq_ranges(seqs)
    assert sent_seqs({"sent": ranges}) == seqs
    assert all(a < b for a, b in ranges)
    assert all(b < c for (_, b), (c, _) in itertools.pairwise(ranges))  # maximal runs


def _ranges_one_at_a_time(seqs: list[int] | tuple[int, ...]) -> list[list[int]]:
    """``seq_ranges`` as it was before its whole-run comparison (the reference)."""
    out: list[list[int]] = []
    for seq in seqs:
        if out and out[-1][1] == seq:
            out[-1][1] = seq + 1
        else:
            out.append([seq, seq + 1])
    return out


_windows = st.builds(
    lambda pinned, start, length, extra: (
        sorted(set(pinned)) + list(range(start, start + length)) + extra
    ),
    st.lists(st.integers(0, 40), max_size=4),
    st.integers(0, 60),
    st.integers(0, 40),
    st.lists(st.integers(0, 120), max_size=3),  # anything after: gaps, repeats, going back
)


def _near_run(pinned: list[int], start: int, length: int, at: int, value: int) -> list[int]:
    """A window whose run has one seq changed: its ends still say "one run"."""
    run = list(range(start, start + length))
    run[at % length] = value
    return sorted(set(pinned)) + run


_near_runs = st.builds(
    _near_run,
    st.lists(st.integers(0, 40), max_size=3),
    st.integers(0, 60),
    st.integers(3, 40),
    st.integers(0, 39),
    st.integers(-1, 110),
)


@example([0, 0, 2], False)
@example([0, 70, 72, 72, 73], False)
@example([0, 70, 71, 72], False)
@given(st.one_of(_windows, _near_runs, st.lists(st.integers(-3, 50), max_size=40)), st.booleans())
def test_ranges_are_those_made_one_seq_at_a_time(seqs: list[int], as_tuple: bool) -> None:
    """The whole-run comparison of a window's tail gives the ranges the plain loop gives,
    for windows (pinned seqs, then a run, then anything) and any list of ints at all."""
    given_seqs = tuple(seqs) if as_tuple else seqs
    got = seq_ranges(given_seqs)
    assert got == _ranges_one_at_a_time(seqs)
    assert [type(x) for r in got for x in r] == [int] * (2 * len(got))


def test_ids_are_rebuilt_in_order_with_the_summary_in_its_place() -> None:
    ids = ["sys", "ctxguard-summary-v2", "m5", "m6"]
    record = {"summary_version": 2, **sent_fields([0, 5, 6], ids, summary_at=1)}
    history = {0: "sys", 5: "m5", 6: "m6"}
    assert record["sent"] == [[0, 1], [5, 7]]
    assert sent_ids(record, history.get) == ids
    assert sent_count(record) == 4


def test_a_changed_history_is_seen_not_misread() -> None:
    record = sent_fields([0, 1], ["a", "b"], None)
    assert sent_ids(record, {0: "a", 1: "b"}.get) == ["a", "b"]
    assert sent_ids(record, {0: "a", 1: "other"}.get) is None  # retracted, then re-used
    assert sent_ids(record, {0: "a"}.get) is None  # no longer stored


def test_records_written_before_ranges_still_read() -> None:
    old = {"sent_ids": ["a", "ctxguard-summary-v1"], "sent_seqs": [3]}
    assert sent_ids(old, {}.get) == ["a", "ctxguard-summary-v1"]
    assert sent_seqs(old) == [3] and sent_count(old) == 2


def test_damaged_ranges_read_as_nothing() -> None:
    for bad in ([[3, 1]], [[1]], [["a", 2]], [[-1, 2]], [[0, 1 << 40]], "x"):
        assert sent_seqs({"sent": bad}) == []  # never raises, never allocates the range
    assert ids_digest(["a"]) != ids_digest(["a", ""])


def _fold(previous: str | None, messages: list[Message]) -> str:
    return "earlier: " + " ".join(m.text for m in messages)[:40]


def test_the_record_does_not_grow_with_the_window_and_rebuilds_what_was_sent() -> None:
    store = open_store(f"memory://{uuid.uuid4().hex}")
    small = Guard(store, counter="approx", limit=600, max_tokens=50)
    large = Guard(store, counter="approx", limit=60_000, max_tokens=50)
    for guard, session in ((small, "small"), (large, "large")):
        guard.append(session, [Message(role="system", content="be brief")])
        for i in range(300):
            guard.prepare(session, [Message(role="user", content=f"question {i} " * 4)])
            guard.complete(session, Message(role="assistant", content=f"answer {i} " * 4))
    sizes = {}
    for session in ("small", "large"):
        records = [r for r in store.read_audit(session) if r["kind"] == "request"]
        last = records[-1]
        sizes[session] = len(json.dumps(last))
        assert "sent_ids" not in last and "sent_seqs" not in last
        prepared_ids = recorded_ids(store, session, last)
        assert prepared_ids is not None and len(prepared_ids) == sent_count(last)
    assert sizes["large"] < sizes["small"] + 40  # hundreds of messages more, same size


def test_a_summarised_request_rebuilds_with_its_summary() -> None:
    store = open_store(f"memory://{uuid.uuid4().hex}")
    guard = Guard(
        store, counter="approx", limit=400, max_tokens=40, summarizer=_fold, summarize_after=4
    )
    guard.append("s", [Message(role="system", content="be brief")])
    sent = None
    for i in range(40):
        sent = guard.prepare("s", [Message(role="user", content=f"question number {i} " * 3)])
        guard.complete("s", Message(role="assistant", content=f"answer number {i} " * 3))
    assert sent is not None and sent.summary_version > 0
    record = [r for r in store.read_audit("s") if r["kind"] == "request"][-1]
    assert recorded_ids(store, "s", record) == [m.id for m in sent.messages]


def test_complete_audits_only_what_the_server_reported() -> None:
    """Without usage, complete adds no record (the request record has the estimate)."""
    store = open_store(f"memory://{uuid.uuid4().hex}")
    guard = Guard(store, counter="approx", limit=4000)
    first = guard.prepare("s", [Message(role="user", content="hi")])
    guard.complete("s", Message(role="assistant", content="hello"), prepared=first)
    assert [r["kind"] for r in store.read_audit("s")] == ["request"]
    second = guard.prepare("s", [Message(role="user", content="again")])
    guard.complete(
        "s", Message(role="assistant", content="yes"), prepared=second, usage={"prompt_tokens": 9}
    )
    usage = [r for r in store.read_audit("s") if r["kind"] == "usage"]
    assert [(r["of_turn"], r["prompt_tokens"]) for r in usage] == [(second.turn, 9)]


def test_request_records_policy_is_made_once_per_config_and_held_by_each_record() -> None:
    """The record's ``policy`` (made once per config and policy: ``_record_policy``) is
    what the settings say, each record holding its own dict; a core given another
    config records that one's."""
    import dataclasses

    # a store of its own: memory:// is one store per process, and another test's session
    # "s" in it made three records here
    guard = Guard(f"memory://{uuid.uuid4().hex}", counter="approx", limit=2000, max_tokens=50)
    guard.prepare("s", [{"role": "user", "content": "one"}])
    guard.prepare("s", [{"role": "user", "content": "two"}])
    records = [r for r in guard.store.read_audit("s") if r.get("kind") == "request"]
    assert len(records) == 2
    want = {
        k: v
        for k, v in guard.core.policy_settings().items()
        if v is not None and v != {"degrade_tool_results": True, "summary_role": "system"}.get(k)
    }
    assert records[0]["policy"] == records[1]["policy"] == want
    records[0]["policy"]["start_on_user"] = "changed"  # a reader's dict: not the guard's
    guard.prepare("t", [{"role": "user", "content": "x"}])
    (other,) = [r for r in guard.store.read_audit("t") if r.get("kind") == "request"]
    assert other["policy"] == want
    guard.core.config = dataclasses.replace(guard.core.config, start_on_user=False)
    guard.prepare("s", [{"role": "user", "content": "three"}])
    last = [r for r in guard.store.read_audit("s") if r.get("kind") == "request"][-1]
    assert last["policy"] == {**want, "start_on_user": False}
    held = Guard(
        private_memory_url(), counter="approx", limit=2000, max_tokens=50, audit_mode="with_reply"
    )
    one = held.prepare("h", [{"role": "user", "content": "one"}]).pending_audit
    two = held.prepare("h", [{"role": "user", "content": "two"}]).pending_audit
    assert one is not None and two is not None and one["policy"] == two["policy"]
    one["policy"]["low_water"] = "changed"  # a held record's dict is its own
    three = held.prepare("h", [{"role": "user", "content": "three"}]).pending_audit
    assert three is not None and three["policy"] == two["policy"] != one["policy"]
