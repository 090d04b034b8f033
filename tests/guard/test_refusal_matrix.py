"""Every refusal class through every mutating door of Guard and AsyncGuard changes nothing
stored: every key of the namespace (type, value, TTL) is the same after the refused call,
except one ``refused`` audit record a refused ``prepare`` writes into an existing session
(docs/turn.md, step 6). On memory://, Redis and Redis Cluster; the store compared is the
raw one (tests/store_diff.py), not what the store's reads answer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from ctxguard import AsyncGuard, Guard, LimitSource
from ctxguard.errors import CtxGuardError
from ctxguard.messages import Message
from ctxguard.stores import open_async_store, open_store
from ctxguard.tokens import load_counter
from tests import store_diff

SID = "s"
SEEDED = [
    {"role": "system", "content": "be brief", "id": "m-sys"},
    {"role": "user", "content": "hello", "id": "m-u1"},
    {"role": "assistant", "content": "hi", "id": "m-a1"},
]


class MidBatchCounter:
    """The approx counter, failing on the ``fail_at``-th message it counts (1-based),
    with an untyped error or with a value no count can be."""

    def __init__(self, fail_at: int, bad: Any = None) -> None:
        self.inner = load_counter("approx")
        self.fingerprint = self.inner.fingerprint
        self.exact = self.inner.exact
        self.additive = self.inner.additive
        self.fail_at = fail_at
        self.bad = bad
        self.seen = 0
        self.armed = False

    def count_message(self, message: Message) -> int:
        if self.armed:
            self.seen += 1
            if self.seen == self.fail_at:
                if self.bad is None:
                    raise RuntimeError("counter broke on this message")
                return self.bad  # type: ignore[no-any-return]
        return self.inner.count_message(message)

    def request_overhead(self, *, tools: Any = None) -> int:
        return self.inner.request_overhead(tools=tools)

    def count_request(self, messages: Sequence[Message], *, tools: Any = None) -> int:
        return sum(self.count_message(m) for m in messages) + self.request_overhead(tools=tools)


class FailingLimit(LimitSource):
    def __init__(self) -> None:
        self.armed = False

    def resolve(self) -> Any:
        from ctxguard import ContextLimit

        if self.armed:
            raise RuntimeError("limit source down")
        return ContextLimit(400, "static")


def users(n: int, prefix: str = "n") -> list[dict[str, Any]]:
    return [{"role": "user", "content": f"line {i}", "id": f"{prefix}{i}"} for i in range(n)]


@dataclass
class Case:
    """One refusal class: the batch, the guard settings, and what to do before the call."""

    batch: Callable[[], list[Any]]
    settings: Callable[[], dict[str, Any]] = dict
    arm: Callable[[Any, dict[str, Any]], None] = lambda guard, settings: None
    session: str = SID
    prepare_kwargs: dict[str, Any] = field(default_factory=dict)
    replace_kwargs: dict[str, Any] = field(default_factory=dict)
    doors: tuple[str, ...] = ("append", "prepare", "replace", "complete")


def _arm_counter(guard: Any, settings: dict[str, Any]) -> None:
    settings["counter"].armed = True


def _arm_limit(guard: Any, settings: dict[str, Any]) -> None:
    settings["limit"].armed = True


def _close(guard: Any, settings: dict[str, Any]) -> None:
    result = guard.close() if isinstance(guard, Guard) else None
    if result is None and isinstance(guard, AsyncGuard):
        asyncio.run(guard.aclose())


CASES: dict[str, Case] = {
    "bad-role": Case(lambda: [{"role": "bogus", "content": "x"}]),
    "bad-message-id": Case(lambda: [{"role": "user", "content": "x", "id": "a\nb"}]),
    "bad-session-id": Case(lambda: users(1), session=""),
    "reused-id-other-content": Case(lambda: [{"role": "user", "content": "other", "id": "m-u1"}]),
    "reused-id-in-batch": Case(
        lambda: [
            {"role": "user", "content": "one", "id": "dup"},
            {"role": "user", "content": "two", "id": "dup"},
        ]
    ),
    "reused-id-mid-batch": Case(
        lambda: [*users(2), {"role": "user", "content": "other", "id": "m-u1"}, *users(2, "k")]
    ),
    "non-text-media": Case(
        lambda: [
            {
                "role": "user",
                "content": [{"type": "input_audio", "input_audio": {"data": "AAAA"}}],
            }
        ]
    ),
    "huge-int": Case(lambda: [{"role": "user", "content": "x", "n": 10**5000}]),
    "orphan-tool-result": Case(
        lambda: [{"role": "tool", "tool_call_id": "nope", "content": "42"}],
        doors=("prepare",),  # append and replace store history as given
    ),
    "duplicate-call-ids": Case(
        lambda: [
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}},
                    {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}},
                ],
            }
        ]
    ),
    "over-budget": Case(lambda: [{"role": "user", "content": "word " * 2000}], doors=("prepare",)),
    "message-too-long": Case(
        lambda: [*users(2), {"role": "user", "content": "word " * 300}],
        settings=lambda: {"max_message_tokens": 100},
    ),
    "session-full": Case(lambda: users(3), settings=lambda: {"max_stored_messages": 4}),
    "output-reserve": Case(
        lambda: users(1), prepare_kwargs={"max_tokens": 10**20}, doors=("prepare",)
    ),
    "counter-raises-3rd-of-5": Case(
        lambda: users(5), settings=lambda: {"counter": MidBatchCounter(3)}, arm=_arm_counter
    ),
    "counter-bad-count-3rd-of-5": Case(
        lambda: users(5), settings=lambda: {"counter": MidBatchCounter(3, "x")}, arm=_arm_counter
    ),
    "counter-negative-3rd-of-5": Case(
        lambda: users(5), settings=lambda: {"counter": MidBatchCounter(3, -7)}, arm=_arm_counter
    ),
    "limit-source-fails": Case(
        lambda: users(1),
        settings=lambda: {"limit": FailingLimit()},
        arm=_arm_limit,
        doors=("prepare",),
    ),
    "closed-guard": Case(lambda: users(1), arm=_close),
    "conflict-count-moved": Case(
        lambda: users(1), replace_kwargs={"expected_count": 2}, doors=("replace",)
    ),
    "conflict-state-moved": Case(
        lambda: users(1), replace_kwargs={"expected_state": "1:1:1"}, doors=("replace",)
    ),
    "bad-state-token": Case(
        lambda: users(1), replace_kwargs={"expected_state": "nonsense"}, doors=("replace",)
    ),
}


def _pairs() -> Iterator[Any]:
    for name, case in CASES.items():
        for door in case.doors:
            yield pytest.param(name, door, id=f"{name}-{door}")


def _settings(case: Case) -> dict[str, Any]:
    settings: dict[str, Any] = {"counter": "approx", "limit": 400, "max_tokens": 60}
    settings.update(case.settings())
    return settings


def _call(guard: Any, door: str, case: Case) -> Any:
    batch = case.batch()
    sid = case.session
    if door == "append":
        return guard.append(sid, batch)
    if door == "prepare":
        return guard.prepare(sid, batch, **case.prepare_kwargs)
    if door == "replace":
        return guard.replace_tail(sid, 2, batch, **case.replace_kwargs)
    assert door == "complete"
    return guard.complete(sid, batch[-1])


def _check(before: Any, after: Any, door: str) -> None:
    store_diff.assert_refused_only(before, after, refused=door == "prepare")


@pytest.mark.parametrize(("name", "door"), list(_pairs()))
def test_sync_refusal_stores_nothing(backend: str, namespace: str, name: str, door: str) -> None:
    case = CASES[name]
    store = open_store(backend, namespace=namespace)
    settings = _settings(case)
    guard = Guard(store, **settings)
    try:
        guard.append(SID, SEEDED)
        guard.append("other", users(2, "o"))
        case.arm(guard, settings)
        before = store_diff.take(store, backend)
        with pytest.raises(CtxGuardError) as caught:
            _call(guard, door, case)
        assert "\n" not in str(caught.value)
        _check(before, store_diff.take(store, backend), door)
    finally:
        guard.close()
        store.close()


async def _acall(guard: Any, door: str, case: Case) -> Any:
    batch = case.batch()
    sid = case.session
    if door == "append":
        return await guard.append(sid, batch)
    if door == "prepare":
        return await guard.prepare(sid, batch, **case.prepare_kwargs)
    if door == "replace":
        return await guard.replace_tail(sid, 2, batch, **case.replace_kwargs)
    return await guard.complete(sid, batch[-1])


@pytest.mark.parametrize(("name", "door"), list(_pairs()))
def test_async_refusal_stores_nothing(backend: str, namespace: str, name: str, door: str) -> None:
    case = CASES[name]

    async def run() -> None:
        store = open_async_store(backend, namespace=namespace)
        settings = _settings(case)
        guard = AsyncGuard(store, **settings)
        try:
            await guard.append(SID, SEEDED)
            await guard.append("other", users(2, "o"))
            if case.arm is _close:
                await guard.aclose()
            else:
                case.arm(guard, settings)
            before = await asyncio.to_thread(store_diff.take, store, backend)
            with pytest.raises(CtxGuardError) as caught:
                await _acall(guard, door, case)
            assert "\n" not in str(caught.value)
            after = await asyncio.to_thread(store_diff.take, store, backend)
            _check(before, after, door)
        finally:
            await guard.aclose()
            await store.close()

    asyncio.run(run())


# -- audit_mode="with_reply": a refused prepare leaves the held record held ----------

HELD_REFUSALS = ["orphan-tool-result", "duplicate-call-ids", "over-budget", "output-reserve"]


@pytest.mark.parametrize("name", HELD_REFUSALS)
def test_a_refused_prepare_leaves_the_previous_turns_record_held(
    backend: str, namespace: str, name: str
) -> None:
    """A record held for ``complete`` (audit_mode="with_reply") was written by a refused
    prepare (completed: false), so that turn's complete() could no longer add the
    server's usage to it; a refused prepare now writes only its refused record."""
    case = CASES[name]
    store = open_store(backend, namespace=namespace)
    guard = Guard(store, **_settings(case), audit_mode="with_reply")
    try:
        guard.append(SID, SEEDED)
        prepared = guard.prepare(SID, users(1))
        before = store_diff.take(store, backend)
        with pytest.raises(CtxGuardError):
            _call(guard, "prepare", case)
        store_diff.assert_refused_only(before, store_diff.take(store, backend), refused=True)
        usage = {"prompt_tokens": prepared.tokens, "completion_tokens": 2}
        guard.complete(SID, {"role": "assistant", "content": "ok"}, prepared=prepared, usage=usage)
        requests = [r for r in store.read_audit(SID) if r["kind"] == "request"]
        assert len(requests) == 1 and requests[0]["completed"] is True
        assert requests[0]["prompt_tokens"] == prepared.tokens
    finally:
        guard.close()
        store.close()


# -- a store failing as it is asked to write ----------------------------------------

WRITES = ("append", "replace_tail", "commit_if_unchanged", "record", "append_with_audit")


class FailingWrites:
    """A store whose writes fail (a connection lost before the command was sent), reads
    pass: what the guard does after a write fails must not write anything else."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.armed = False

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.inner, name)
        if name not in (*WRITES, "add_audit", "commit_summary", "retract", "restore"):
            return method

        def failing(*args: Any, **kwargs: Any) -> Any:
            if self.armed:
                from ctxguard.errors import StoreConnectionError

                raise StoreConnectionError(f"lost the connection before {name}")
            return method(*args, **kwargs)

        return failing


@pytest.mark.parametrize("audit_mode", ["sync", "with_reply"])
@pytest.mark.parametrize("door", ["append", "prepare", "replace", "complete"])
def test_a_write_that_fails_leaves_the_store_as_it_was(
    backend: str, namespace: str, door: str, audit_mode: str
) -> None:
    inner = open_store(backend, namespace=namespace)
    store = FailingWrites(inner)
    guard = Guard(store, **_settings(CASES["bad-role"]), audit_mode=audit_mode)
    try:
        guard.append(SID, SEEDED)
        prepared = guard.prepare(SID, users(1, "p"))
        usage = {"prompt_tokens": prepared.tokens, "completion_tokens": 1}
        store.armed = True
        before = store_diff.take(inner, backend)
        with pytest.raises(CtxGuardError):
            if door == "complete":
                guard.complete(SID, {"role": "assistant", "content": "ok"}, usage=usage)
            else:
                _call(guard, door, Case(lambda: users(2)))
        store_diff.assert_refused_only(before, store_diff.take(inner, backend))
        store.armed = False
    finally:
        guard.close()
        inner.close()
