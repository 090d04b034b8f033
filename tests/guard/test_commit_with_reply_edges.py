"""``commit="with_reply"``: retries, refusals, usage, a history changed under the request,
conflicts, copies, the setting's check and summaries.

On memory://, Redis and Redis Cluster, with Guard and AsyncGuard (the ``with_reply``
fixture): a complete repeated after one that stored stores nothing again; a complete
refused (a reply that is not one, no ``prepared=``, another session's request) stores
nothing; the server's usage completes the request record; a retraction or a replace
between prepare and complete is stored as it is and readers say the record cannot be
rebuilt; 64 lost commits raise ConflictError with nothing stored; a prepared request
copies and pickles with what it did not store, and its repr shows none of it; a long
session with summaries (inline and background) ends whole. The lost reply of a
complete's commit is in tests/faults/test_lost_replies.py.
"""

from __future__ import annotations

import copy
import pickle
from collections.abc import Callable
from typing import Any

import pytest

from ctxguard import Guard, GuardConfig
from ctxguard.errors import ConfigError, ConflictError, InvalidInputError, InvalidMessageError
from ctxguard.guard import ops, unstored
from ctxguard.guard.ops import MAX_COMMITS
from ctxguard.messages import Message
from tests import store_diff
from tests.conftest import private_memory_url, recorded_ids
from tests.guard.test_held_refusals import MovedEveryTime
from tests.guard.with_reply_env import SID, Env, answer, ids_of, seeded, turn, user


def assert_unchanged(env: Env, before: store_diff.Snapshot) -> None:
    after = env.snap()
    assert after == before, "\n".join(store_diff.changes(before, after))


# -- 5. a retried complete ---------------------------------------------------------------


@pytest.mark.parametrize("between", ["nothing", "another writer"])
async def test_a_retried_complete_stores_nothing_twice(with_reply: Env, between: str) -> None:
    guard = await seeded(with_reply)
    prepared = await guard.prepare(SID, [user(2)])
    usage = {"prompt_tokens": prepared.tokens, "completion_tokens": 3}
    await guard.complete(SID, answer(2), prepared=prepared, usage=usage)
    if between == "another writer":
        with_reply.other().append(SID, [user("o")])
    before = with_reply.snap()

    await guard.complete(SID, answer(2), prepared=prepared, usage=usage)

    assert_unchanged(with_reply, before)
    tail = ["uo"] if between == "another writer" else []
    assert with_reply.ids() == ["m-sys", "u1", "a1", "u2", "a2", *tail]
    assert [r["turn"] for r in with_reply.requests()] == [1, 2]
    await turn(guard, 3)  # and the session goes on
    assert with_reply.ids()[-2:] == ["u3", "a3"]
    assert [r["turn"] for r in with_reply.requests()] == [1, 2, 3]


# -- 6. refusals at complete store nothing ------------------------------------------------


REFUSALS: dict[str, tuple[type[Exception], str]] = {
    "a user message as the reply": (InvalidMessageError, "assistant message"),
    "an assistant reply saying nothing": (InvalidMessageError, "content or tool_calls"),
    "no prepared=": (InvalidInputError, 'commit="with_reply"'),
    "another session's request": (InvalidInputError, "prepared is the request of session"),
}


@pytest.mark.parametrize("case", list(REFUSALS))
async def test_a_refused_complete_stores_nothing(with_reply: Env, case: str) -> None:
    guard = await seeded(with_reply)
    prepared = await guard.prepare(SID, [user(2)])
    elsewhere = await guard.prepare("s2", [user("x")])
    before = with_reply.snap()
    error, says = REFUSALS[case]
    with pytest.raises(error) as caught:
        if case == "a user message as the reply":
            await guard.complete(SID, {"role": "user", "content": "hm"}, prepared=prepared)
        elif case == "an assistant reply saying nothing":
            await guard.complete(SID, {"role": "assistant"}, prepared=prepared)
        elif case == "no prepared=":
            await guard.complete(SID, answer(2))
        else:
            await guard.complete(SID, answer(2), prepared=elsewhere)
    text = str(caught.value)
    assert says in text and "\n" not in text, text
    assert_unchanged(with_reply, before)
    assert with_reply.reader.info("s2") is None

    await guard.complete(SID, answer(2), prepared=prepared)  # the right call still works
    assert with_reply.ids() == ["m-sys", "u1", "a1", "u2", "a2"]
    assert len(with_reply.requests()) == 2


# -- 7. usage ------------------------------------------------------------------------------


async def test_the_usage_completes_the_request_record(with_reply: Env) -> None:
    guard = await seeded(with_reply)
    prepared = await guard.prepare(SID, [user(2)])
    usage = {"prompt_tokens": prepared.tokens + 5, "completion_tokens": 7}
    await guard.complete(SID, answer(2), prepared=prepared, usage=usage)
    first, record = with_reply.requests()
    assert (record["tokens"], record["completed"]) == (prepared.tokens, True)
    assert (record["prompt_tokens"], record["completion_tokens"], record["drift"]) == (
        prepared.tokens + 5,
        7,
        5,
    )
    assert first["completed"] is True and "prompt_tokens" not in first  # (no usage given)
    assert [r["kind"] for r in with_reply.reader.read_audit(SID)] == ["request", "request"]
    drift = with_reply.cli_json("audit", SID)["sessions"][0]
    assert drift["drift_max"] == 5


# -- 8. a retraction or a replace between prepare and complete -------------------------------


@pytest.mark.parametrize("change", ["retract", "replace"])
async def test_a_history_changed_under_the_request_is_not_misread(
    with_reply: Env, change: str
) -> None:
    guard = await seeded(with_reply)
    await turn(guard, 2)
    prepared = await guard.prepare(SID, [user(3)])
    assert ids_of(prepared) == ["m-sys", "u1", "a1", "u2", "a2", "u3"]
    if change == "retract":
        with_reply.reader.retract(SID, 2)  # u2, a2 go
        kept = ["m-sys", "u1", "a1"]
    else:
        with_reply.other().replace_tail(SID, 3, [user("r"), answer("r")])
        kept = ["m-sys", "u1", "a1", "ur", "ar"]

    await guard.complete(SID, answer(3), prepared=prepared)

    assert with_reply.ids() == [*kept, "u3", "a3"]
    record = with_reply.requests()[-1]
    assert record["completed"] is True
    assert recorded_ids(with_reply.reader, SID, record) is None  # what was sent is gone
    found = with_reply.cli_json("audit", SID)
    checks = sorted((v["check"], v["where"]) for v in found["violations"])
    # turn 2 sent what was retracted or replaced, turn 3 too: neither can be rebuilt,
    # and neither is read as a request that left out its newest message
    assert checks == [("unknown_sent_id", "turn 2"), ("unknown_sent_id", "turn 3")], found
    assert record["turn"] == 3
    replayed = [t for t in with_reply.cli_json("replay", SID) if t["turn"] == record["turn"]]
    assert replayed[0]["recorded_ids"] == [] and not replayed[0]["same"]

    # the next turn plans on the history as it is now, not on the window sent
    oracle = with_reply.guard(window_cache_size=0)
    want = await oracle.prepare(SID, [user(4)])
    got = await turn(guard, 4)
    assert ids_of(got) == ids_of(want) == [*kept, "u3", "a3", "u4"]
    assert recorded_ids(with_reply.reader, SID, with_reply.requests()[-1]) == ids_of(got)


# -- 9. ConflictError after MAX_COMMITS lost commits --------------------------------------------


@pytest.fixture
def no_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    """The waits between a complete's commits at zero (64 of them otherwise take seconds)."""

    class Zero:
        @staticmethod
        def uniform(low: float, high: float) -> float:
            return 0.0

    monkeypatch.setattr(ops, "random", Zero)


@pytest.mark.usefixtures("no_backoff")
async def test_a_conflict_after_every_commit_stores_nothing(with_reply: Env) -> None:
    store = MovedEveryTime(with_reply.store())
    guard = await seeded(with_reply, store=store)
    prepared = await guard.prepare(SID, [user(2)])
    store.armed = True
    before = with_reply.snap()
    with pytest.raises(ConflictError) as caught:
        await guard.complete(SID, answer(2), prepared=prepared)
    assert store.commits == MAX_COMMITS
    text = str(caught.value)
    assert "nothing was stored" in text and "\n" not in text, text
    assert_unchanged(with_reply, before)

    store.armed = False  # the caller retries: the turn is stored once
    await guard.complete(SID, answer(2), prepared=prepared)
    assert with_reply.ids() == ["m-sys", "u1", "a1", "u2", "a2"]
    assert recorded_ids(with_reply.reader, SID, with_reply.requests()[-1]) == ids_of(prepared)


# -- 10. copies and pickles; the repr ----------------------------------------------------------

COPIES: dict[str, Callable[[Any], Any]] = {
    "copy": copy.copy,
    "deepcopy": copy.deepcopy,
    "pickle": lambda value: pickle.loads(pickle.dumps(value)),
}


@pytest.mark.parametrize("how", list(COPIES))
async def test_a_prepared_request_copies_with_what_it_did_not_store(
    with_reply: Env, how: str
) -> None:
    guard = await seeded(with_reply)
    prepared = await guard.prepare(SID, [user(2)])
    later = prepared.unstored
    assert later is not None
    text = repr(prepared)
    for hidden in ("unstored", "Unstored", later.record["rid"], later.record["sent_digest"]):
        assert hidden not in text, hidden

    clone = COPIES[how](prepared)

    assert clone == prepared and clone.unstored == later
    await guard.complete(SID, answer(2), prepared=clone)
    assert with_reply.ids() == ["m-sys", "u1", "a1", "u2", "a2"]
    record = with_reply.requests()[-1]
    assert record["rid"] == unstored.turn_rid(later.record["rid"], "a2")  # (the reply's turn)
    assert recorded_ids(with_reply.reader, SID, record) == ids_of(prepared)


# -- 11. the setting's check ----------------------------------------------------------------


def test_an_unknown_commit_mode_is_refused_in_one_line() -> None:
    with pytest.raises(ConfigError) as caught:
        GuardConfig(commit="bogus")  # type: ignore[arg-type]
    text = str(caught.value)
    assert "commit" in text and "'bogus'" in text and "with_reply" in text, text
    assert "\n" not in text
    with pytest.raises(ConfigError, match="commit must be"):
        Guard(private_memory_url(), counter="approx", limit=400, commit="bogus")  # type: ignore[arg-type]


# -- 12. summaries -------------------------------------------------------------------------------


def summarizer(previous: str | None, messages: list[Message]) -> str:
    return f"{len(messages)} earlier messages"


@pytest.mark.parametrize("summary_mode", ["inline", "background"])
async def test_a_long_session_with_summaries_ends_whole(with_reply: Env, summary_mode: str) -> None:
    guard = await seeded(
        with_reply,
        limit=400,
        summarizer=summarizer,
        summarize_after=4,
        summary_mode=summary_mode,
    )
    sent = []
    for i in range(2, 16):
        sent.append(await turn(guard, i, usage=lambda p: {"prompt_tokens": p.tokens}, words=20))
        if summary_mode == "background":
            await guard.wait_for_summaries()
    want = ["m-sys", "u1", "a1"] + [f"{k}{i}" for i in range(2, 16) for k in "ua"]
    assert with_reply.ids() == want  # every message once, in order
    records = with_reply.requests()[1:]
    assert [r["turn"] for r in records] == list(range(2, 16))
    for record, prepared in zip(records, sent, strict=True):
        assert record["completed"] is True and record["drift"] == 0
        assert record.get("summary_version", 0) == prepared.summary_version
        assert recorded_ids(with_reply.reader, SID, record) == ids_of(prepared), record["turn"]
    summaries = [r for r in with_reply.reader.read_audit(SID) if r["kind"] == "summary"]
    assert summaries and all(r["committed"] for r in summaries)
    assert any(p.summary_version for p in sent)  # a summary was sent
    assert with_reply.cli_json("audit", SID)["ok"] is True
    assert all(t["same"] for t in with_reply.cli_json("replay", SID))
