"""Every public method, any argument: success or a CtxGuardError, and a refusal stores nothing.

Each example takes a valid call of a public method of :class:`Guard`,
:class:`AsyncGuard` or the memory store and replaces one or more of its
arguments with an arbitrary value: JSON of any shape, and values that are not
JSON (bytes, sets, objects, NaN, infinities, huge ints, nesting thousands of
levels deep), bare or planted inside an otherwise valid message, tool or usage.
Only a :class:`CtxGuardError` may escape, its message is one line, and when the
input is refused (:class:`InvalidInputError`) the store is exactly as before.
"""

from __future__ import annotations

import asyncio
import copy
import math
import uuid
from collections.abc import Callable
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctxguard import AsyncGuard, CtxGuardError, Guard, InvalidInputError, Message
from ctxguard.guard.plan import SummaryRequest
from ctxguard.stores import MemoryStore, NewMessage, WriteOptions
from ctxguard.stores.base import RecordWrite, Summary

from .strategies import JSON, WILD_TEXT

FUZZ = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def _deep(depth: int, dicts: bool) -> Any:
    value: Any = "leaf"
    for _ in range(depth):
        value = {"k": value} if dicts else [value]
    return value


NOT_JSON = st.one_of(
    st.binary(max_size=8),
    st.sets(st.integers(), max_size=2),
    st.frozensets(st.text(max_size=3), max_size=2),
    st.builds(object),
    st.sampled_from([math.nan, math.inf, -math.inf, 10**400, -(10**400), b"raw", bytearray(b"x")]),
    st.builds(_deep, st.sampled_from([65, 100, 2_000, 5_000]), st.booleans()),
    st.tuples(st.integers(), st.text(max_size=3)),
    st.builds(complex, st.floats(allow_nan=False), st.floats(allow_nan=False)),
    st.just(Message(role="user", content="a Message where something else belongs")),
    st.just(lambda: None),
)
# JSON that holds one non-JSON value somewhere inside
POISONED = st.recursive(
    NOT_JSON,
    lambda inner: st.one_of(
        st.lists(st.one_of(inner, JSON), min_size=1, max_size=3),
        st.dictionaries(st.text(max_size=5), inner, min_size=1, max_size=2),
        st.builds(lambda k, v: {k: v}, st.one_of(st.integers(), st.none(), st.booleans()), JSON),
    ),
    max_leaves=4,
)
ANYTHING = st.one_of(JSON, NOT_JSON, POISONED, WILD_TEXT, st.integers(), st.none())


def _user(text: str = "hello") -> dict[str, Any]:
    return {"role": "user", "content": text}


TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
MESSAGE_SLOTS = ("content", "name", "metadata", "tool_call_id", "id", "refusal", "role")


def planted_message(value: Any, slot: str) -> dict[str, Any]:
    if slot == "metadata":
        return {**_user(), "metadata": {"k": value}}
    return {**_user(), slot: value}


ARGS = st.one_of(
    ANYTHING,
    st.builds(lambda v, s: [planted_message(v, s)], ANYTHING, st.sampled_from(MESSAGE_SLOTS)),
    st.builds(lambda v: [{**TOOL, "function": {"name": "f", "parameters": v}}], ANYTHING),
    st.builds(lambda v: {"prompt_tokens": v, "completion_tokens": 1}, ANYTHING),
    st.builds(lambda v: {"prompt_tokens": 3, "details": v}, POISONED),
    st.builds(
        lambda a, b, c, d: SummaryRequest(a, b, c, d), ANYTHING, ANYTHING, ANYTHING, ANYTHING
    ),
    st.builds(lambda v: [NewMessage(Message(**_user()), v)], ANYTHING),
    st.builds(lambda v: WriteOptions(counter=v), ANYTHING),
    st.builds(lambda v: WriteOptions(ttl_seconds=v), ANYTHING),
    st.builds(lambda v: RecordWrite(counter="c", counts={0: v}), ANYTHING),
    st.builds(lambda v: RecordWrite(audit=v), ANYTHING),
)


# -- the calls: (name, valid arguments, run) -------------------------------------------


def snapshot(store: MemoryStore) -> Any:
    """Everything the memory store holds, as plain data."""
    return {
        sid: (
            list(s.records),
            list(s.tokens.values),
            list(s.audit),
            s.summary,
            s.summary_version,
            s.turns,
            s.counter,
            s.version,
        )
        for sid, s in store._sessions.items()
    }


def fresh_store() -> MemoryStore:
    store = MemoryStore()
    store.append("s", [NewMessage(Message(**_user("first")), 2)], WriteOptions(counter="c"))
    return store


def guard_calls(guard: Guard) -> dict[str, tuple[list[Any], Callable[..., Any]]]:
    prepared = guard.prepare("s", [_user("warm")], max_tokens=32)
    request = SummaryRequest(None, 0, 0, 1)
    reply = {"role": "assistant", "content": "ok"}
    usage = {"prompt_tokens": 5, "completion_tokens": 1}
    return {
        "prepare": (
            ["s", [_user()], 32, [TOOL]],
            lambda s, m, mt, t: guard.prepare(s, m, max_tokens=mt, tools=t),
        ),
        "append": (["s", [_user()]], guard.append),
        "complete": (
            ["s", reply, prepared, usage],
            lambda s, r, p, u: guard.complete(s, r, prepared=p, usage=u),
        ),
        "summarize": (["s", request], guard.summarize),
        "wait_for_summaries": ([1.0], guard.wait_for_summaries),
    }


def store_calls(store: MemoryStore) -> dict[str, tuple[list[Any], Callable[..., Any]]]:
    new = [NewMessage(Message(**_user("n")), 1)]
    opts = WriteOptions(counter="c")
    write = RecordWrite(counter="c", counts={0: 2}, audit={"kind": "usage"}, retention=10)
    summary = Summary(version=1, text="sum", covers_to=1)
    token = store.fetch_window("s", 100, opts).token or ""
    return {
        "append": (["s", new, opts], store.append),
        "read": (["s", 0, None], store.read),
        "read_last": (["s", 2], store.read_last),
        "info": (["s"], store.info),
        "delete": (["s"], store.delete),
        "list_sessions": ([""], lambda p: list(store.list_sessions(p))),
        "fetch_window": (["s", 100, opts, new, 1], store.fetch_window),
        "commit_if_unchanged": (["s", token, 100, opts, new, 1, write], store.commit_if_unchanged),
        "set_token_counts": (["s", "c", {0: 3}], store.set_token_counts),
        "get_summary": (["s"], store.get_summary),
        "retract": (["s", 1, None, 0], store.retract),
        "restore": (["s", 3, summary, 0], store.restore),
        "commit_summary": (["s", summary, 0], store.commit_summary),
        "add_audit": (["s", {"kind": "x"}, 10, 0], store.add_audit),
        "read_audit": (["s"], store.read_audit),
        "record": (["s", write], store.record),
        "append_with_audit": (["s", new, opts, write], store.append_with_audit),
    }


def check_call(store: MemoryStore, run: Callable[[], Any]) -> None:
    before = copy.deepcopy(snapshot(store))
    try:
        run()
    except CtxGuardError as exc:
        assert "\n" not in str(exc), f"a multi-line message: {exc}"
        if isinstance(exc, InvalidInputError):
            assert snapshot(store) == before, f"refused ({exc}) but the store changed"


@st.composite
def replaced(draw: st.DrawFn, valid: list[Any]) -> list[Any]:
    args = list(valid)
    positions = draw(st.lists(st.integers(0, len(args) - 1), min_size=1, max_size=2, unique=True))
    for index in positions:
        args[index] = draw(ARGS)
    return args


@FUZZ
@given(
    data=st.data(),
    method=st.sampled_from(["prepare", "append", "complete", "summarize", "wait_for_summaries"]),
)
def test_guard_methods_answer_any_argument_typed(data: st.DataObject, method: str) -> None:
    store = fresh_store()
    guard = Guard(store, counter="approx", limit=4096, max_tokens=64)
    valid, fn = guard_calls(guard)[method]
    args = data.draw(replaced(valid))
    check_call(store, lambda: fn(*args))


@FUZZ
@given(data=st.data(), method=st.sampled_from(["prepare", "append", "complete", "summarize"]))
def test_async_guard_methods_answer_any_argument_typed(data: st.DataObject, method: str) -> None:
    name = f"memory://fuzz-{uuid.uuid4().hex}"
    guard = AsyncGuard(name, counter="approx", limit=4096, max_tokens=64)
    store: MemoryStore = guard.store.sync  # type: ignore[attr-defined]
    sync_twin = Guard(store, counter="approx", limit=4096, max_tokens=64)
    valid, _ = guard_calls(sync_twin)[method]
    args = data.draw(replaced(valid))

    async def run() -> Any:
        if method == "prepare":
            return await guard.prepare(args[0], args[1], max_tokens=args[2], tools=args[3])
        if method == "append":
            return await guard.append(*args)
        if method == "complete":
            return await guard.complete(args[0], args[1], prepared=args[2], usage=args[3])
        return await guard.summarize(*args)

    check_call(store, lambda: asyncio.run(run()))


STORE_METHODS = sorted(store_calls(fresh_store()))


@FUZZ
@given(data=st.data(), method=st.sampled_from(STORE_METHODS))
def test_memory_store_methods_answer_any_argument_typed(data: st.DataObject, method: str) -> None:
    store = fresh_store()
    valid, fn = store_calls(store)[method]
    args = data.draw(replaced(valid))
    check_call(store, lambda: fn(*args))


@FUZZ
@given(session_id=ANYTHING, messages=ARGS)
def test_a_refused_prepare_or_append_stores_nothing_anywhere(
    session_id: Any, messages: Any
) -> None:
    store = fresh_store()
    guard = Guard(store, counter="approx", limit=4096, max_tokens=64)
    check_call(store, lambda: guard.prepare(session_id, messages))
    check_call(store, lambda: guard.append(session_id, messages))


def test_an_audit_record_of_none_is_refused_typed() -> None:
    """Found by the larger-budget run: None was taken as 'no record given'."""
    store = fresh_store()
    store.append("s", [NewMessage(Message(role="user", content="hi"))])
    before = store.read_audit("s")
    for record in (None, [], "x", {1: "a"}):
        try:
            store.add_audit("s", record, 10, 0)  # type: ignore[arg-type]
        except InvalidInputError as exc:
            assert "\n" not in str(exc)
        else:
            raise AssertionError(f"add_audit took {record!r}")
    assert store.read_audit("s") == before
