"""Shared pieces of the fault tests: recording retry policies, kills, writers."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import redis

from ctxguard.errors import StoreConnectionError
from ctxguard.messages import Message
from ctxguard.stores import NewMessage
from ctxguard.stores.redis import RetryPolicy


@dataclass(frozen=True)
class RecordingPolicy(RetryPolicy):
    """A :class:`RetryPolicy` that remembers every backoff delay it handed out."""

    used: list[float] = field(default_factory=list, compare=False)

    def delays(self) -> Any:
        for delay in super().delays():
            self.used.append(delay)
            yield delay


def new(content: str, **kw: Any) -> NewMessage:
    return NewMessage(Message(role="user", content=content, **kw))


def wait_blocked(admin: redis.Redis, timeout: float = 5) -> int:
    """The id of the (one) client held by CLIENT PAUSE (flag ``b``)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for client in admin.client_list():
            if "b" in client["flags"]:
                return int(client["id"])
        time.sleep(0.01)
    raise AssertionError("no client got blocked by CLIENT PAUSE")


def kill_blocked(admin: redis.Redis) -> None:
    """Kill the connection of the client held by a pause mid-command, then unpause."""
    victim = wait_blocked(admin)
    admin.execute_command("CLIENT", "KILL", "ID", victim)
    admin.execute_command("CLIENT", "UNPAUSE")


def run_killed(admin: redis.Redis, op: Callable[[], Any]) -> Any:
    """Run ``op`` while writes are paused, kill its connection mid-command; its outcome."""
    admin.execute_command("CLIENT", "PAUSE", 5000, "WRITE")
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["result"] = op()
        except BaseException as exc:  # handed back to the test
            box["error"] = exc

    thread = threading.Thread(target=target)
    thread.start()
    try:
        kill_blocked(admin)
    finally:
        admin.execute_command("CLIENT", "UNPAUSE")
        thread.join(15)
    if "error" in box:
        return box["error"]
    return box["result"]


def append_until_stored(store: Any, session_id: str, message: NewMessage) -> int:
    """Append with an application-level retry (same id) across outages; failures seen."""
    failures = 0
    deadline = time.monotonic() + 60
    while True:
        try:
            store.append(session_id, [message])
            return failures
        except StoreConnectionError:
            failures += 1
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


async def aappend_until_stored(store: Any, session_id: str, message: NewMessage) -> int:
    import asyncio

    failures = 0
    deadline = time.monotonic() + 60
    while True:
        try:
            await store.append(session_id, [message])
            return failures
        except StoreConnectionError:
            failures += 1
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.05)


def assert_once_in_order(stored_ids: list[str], sent: dict[str, list[str]]) -> None:
    """Every sent id is stored exactly once, and each writer's own order is kept."""
    assert len(stored_ids) == len(set(stored_ids)), "duplicated messages"
    expected = {i for ids in sent.values() for i in ids}
    assert set(stored_ids) == expected, (
        f"lost {len(expected - set(stored_ids))}, unexpected {len(set(stored_ids) - expected)}"
    )
    position = {m: n for n, m in enumerate(stored_ids)}
    for writer, ids in sent.items():
        assert [position[i] for i in ids] == sorted(position[i] for i in ids), writer
