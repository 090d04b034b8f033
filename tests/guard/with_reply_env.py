"""A ``commit="with_reply"`` guard on one backend, sync or async, for that mode's tests.

:class:`Env` opens the guard under test (``Guard`` or ``AsyncGuard``, every method
awaitable through :class:`Awaitable` so a test is written once), a plain sync store on
the same sessions (``reader``: to read, to write behind the guard's back, to snapshot
with tests/store_diff.py) and runs the ``ctxguard`` CLI against them. The fixture is
``with_reply`` in tests/guard/conftest.py.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from click.testing import CliRunner, Result

from ctxguard import AsyncGuard, Guard
from ctxguard.cli import cli
from ctxguard.guard.prepared import PreparedRequest
from ctxguard.stores import open_async_store, open_store
from tests import store_diff

SID = "s"
SETTINGS: dict[str, Any] = {"counter": "approx", "limit": 4000, "max_tokens": 60}
SYSTEM = {"role": "system", "content": "be brief", "id": "m-sys"}


def user(i: int | str, words: int = 3) -> dict[str, Any]:
    return {"role": "user", "content": f"question {i} " + "word " * words, "id": f"u{i}"}


def answer(i: int | str) -> dict[str, Any]:
    return {"role": "assistant", "content": f"answer {i}", "id": f"a{i}"}


class Awaitable:
    """Every method of ``raw`` (a sync or an async guard or store) as an awaitable."""

    def __init__(self, raw: Any) -> None:
        self.raw = raw

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.raw, name)
        if not callable(attr):
            return attr

        async def call(*args: Any, **kwargs: Any) -> Any:
            result = attr(*args, **kwargs)
            if inspect.isawaitable(result):
                result = await result
            return result

        return call


class CallLog:
    """Wraps a store (sync or async) and records the name of every method called on it."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if not callable(attr) or name.startswith("_"):
            return attr
        if inspect.iscoroutinefunction(attr):

            async def acall(*args: Any, **kwargs: Any) -> Any:
                self.calls.append(name)
                return await attr(*args, **kwargs)

            return acall

        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls.append(name)
            return attr(*args, **kwargs)

        return call


@dataclass
class Env:
    """One backend (``memory``, ``redis``, ``cluster``) and one mode (``sync``, ``async``)."""

    backend: str
    mode: str
    url: str
    namespace: str
    opened: list[Any] = field(default_factory=list)
    guards: list[Any] = field(default_factory=list)
    reader: Any = None

    def __post_init__(self) -> None:
        self.reader = open_store(self.url, namespace=self.namespace)

    def store(self) -> Any:
        """A store of the guard's kind (sync or async) on the test's sessions."""
        opener = open_store if self.mode == "sync" else open_async_store
        opened = opener(self.url, namespace=self.namespace)
        self.opened.append(opened)
        return opened

    def guard(self, store: Any = None, **settings: Any) -> Awaitable:
        """The guard under test: ``commit="with_reply"`` unless ``settings`` say."""
        settings = {**SETTINGS, "commit": "with_reply", **settings}
        cls = Guard if self.mode == "sync" else AsyncGuard
        made = cls(self.store() if store is None else store, **settings)
        self.guards.append(made)
        return Awaitable(made)

    def other(self) -> Guard:
        """Another writer: a sync guard of the default mode on the same sessions."""
        made = Guard(self.reader, **SETTINGS)
        self.guards.append(made)
        return made

    def snap(self) -> store_diff.Snapshot:
        return store_diff.take(self.reader, self.url)

    def ids(self, session_id: str = SID) -> list[str]:
        return [s.message.id for s in self.reader.read(session_id)]

    def requests(self, session_id: str = SID) -> list[dict[str, Any]]:
        return [r for r in self.reader.read_audit(session_id) if r["kind"] == "request"]

    def cli(self, *args: str) -> Result:
        env = {"CTXGUARD_URL": self.url, "CTXGUARD_NAMESPACE": self.namespace}
        return CliRunner().invoke(cli, list(args), env=env, catch_exceptions=False)

    def cli_json(self, *args: str) -> Any:
        result = self.cli(*args, "--json")
        assert result.exit_code in (0, 1), result.output + result.stderr
        return json.loads(result.stdout)

    async def close(self) -> None:
        for made in self.guards:
            done = made.aclose() if isinstance(made, AsyncGuard) else made.close()
            if inspect.isawaitable(done):
                await done
        for store in self.opened:
            done = store.close()
            if inspect.isawaitable(done):
                await done
        self.reader.close()


async def turn(
    guard: Awaitable,
    i: int | str,
    usage: Callable[[PreparedRequest], Any] | None = None,
    words: int = 3,
) -> PreparedRequest:
    """One whole turn: prepare the user's question ``i``, complete with answer ``i``."""
    prepared: PreparedRequest = await guard.prepare(SID, [user(i, words)])
    used = usage(prepared) if usage is not None else None
    await guard.complete(SID, answer(i), prepared=prepared, usage=used)
    return prepared


def ids_of(prepared: PreparedRequest) -> list[str]:
    return [m.id for m in prepared.messages]


async def seeded(env: Env, **settings: Any) -> Awaitable:
    """The guard under test, after a first turn (system message, question 1, answer 1)."""
    guard = env.guard(**settings)
    first = await guard.prepare(SID, [SYSTEM, user(1)])
    await guard.complete(SID, answer(1), prepared=first)
    assert env.ids() == ["m-sys", "u1", "a1"]
    return guard


def cached(guard: Awaitable) -> bool:
    """Whether the guard holds the session's window (its next prepare plans on it)."""
    return guard.raw.core.cache.get(SID) is not None
