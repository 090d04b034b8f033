"""What the agent-loop adapters (LangChain middleware, Pydantic AI capability) share.

They fit each model call in memory (the framework owns the history it sends) and
keep a ctxguard session beside it: the messages the run holds are appended once
(by id), and after each call the reply is stored with the usage the model reported,
against ctxguard's own count of what was sent (one ``usage`` audit record, with
``estimated``, ``prompt_tokens`` and ``drift``). Framework-free.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

from ctxguard import _validate
from ctxguard.adapters._shared import GuardRef
from ctxguard.errors import ConfigError
from ctxguard.guard.aio import AsyncGuard
from ctxguard.guard.prepared import PreparedRequest
from ctxguard.guard.sync import Guard
from ctxguard.kv.limit import ContextLimit, LimitSource, StaticLimit
from ctxguard.messages import Message

LimitLike = Guard | AsyncGuard | int | ContextLimit | LimitSource


def served_limit(source: LimitLike) -> ContextLimit:
    """The per-request limit (prompt + output) of a guard, a limit source or a number.

    A :class:`~ctxguard.ServerLimit` asks the running server once, here.
    """
    if isinstance(source, Guard | AsyncGuard):
        source = source.limit_source
    if isinstance(source, ContextLimit):
        return source
    if isinstance(source, int) and not isinstance(source, bool):
        return StaticLimit(source).resolve()
    if isinstance(source, LimitSource):
        return source.resolve()
    raise ConfigError(
        "pass a Guard, a ContextLimit, a limit source (ModelLimit, ServerLimit) or a "
        f"number of tokens, got {_validate.type_name(source)}"
    )


def usage(prompt_tokens: object, completion_tokens: object) -> dict[str, Any] | None:
    """The usage a model reported, in the guard's terms (None when it reported none)."""
    prompt = prompt_tokens if isinstance(prompt_tokens, int) and prompt_tokens > 0 else None
    completion = completion_tokens if isinstance(completion_tokens, int) else None
    if prompt is None and completion is None:
        return None
    return {"prompt_tokens": prompt, "completion_tokens": completion}


def as_sent(prepared: PreparedRequest, session_id: str) -> PreparedRequest:
    """A fitted request as ``complete`` takes it: this session's, of no stored turn (0)."""
    return dataclasses.replace(prepared, session_id=session_id, turn=0, pending_audit=None)


class SeenIds:
    """Per session, the ids known to be stored: a shortcut that spares counting them again.

    Bounded (the least recently used sessions are forgotten): forgetting is safe, since
    the store skips an id it holds, so a long-lived process does not grow with every
    session it served.
    """

    def __init__(self, sessions: int = 256) -> None:
        self._sessions = sessions
        self._ids: OrderedDict[str, set[str]] = OrderedDict()
        self._lock = threading.Lock()

    def of(self, session_id: str) -> set[str]:
        with self._lock:
            ids = self._ids.pop(session_id, None)
            self._ids[session_id] = ids = set() if ids is None else ids
            while len(self._ids) > self._sessions:
                self._ids.popitem(last=False)
            return ids


def _unseen(messages: Sequence[Message], seen: set[str]) -> list[Message]:
    return [m for m in messages if m.id not in seen]


def persist(guard: Guard, session_id: str, messages: Sequence[Message], seen: set[str]) -> None:
    """Append the messages not ``seen`` before, in order. ``seen`` is only a shortcut:
    an id the session holds already is skipped by the store itself."""
    new = _unseen(messages, seen)
    if new:
        guard.append(session_id, new)
        seen.update(m.id for m in new)


async def apersist(
    ref: GuardRef, session_id: str, messages: Sequence[Message], seen: set[str]
) -> None:
    new = _unseen(messages, seen)
    if not new:
        return
    guard = ref.aio()
    if guard is None:
        await asyncio.to_thread(ref.sync().append, session_id, new)
    else:
        await guard.append(session_id, new)
    seen.update(m.id for m in new)


def complete(
    guard: Guard,
    session_id: str,
    reply: Message,
    prepared: PreparedRequest | None,
    reported: Mapping[str, Any] | None,
) -> None:
    sent = None if prepared is None else as_sent(prepared, session_id)
    guard.complete(session_id, reply, prepared=sent, usage=reported)


async def acomplete(
    ref: GuardRef,
    session_id: str,
    reply: Message,
    prepared: PreparedRequest | None,
    reported: Mapping[str, Any] | None,
) -> None:
    guard = ref.aio()
    if guard is None:
        await asyncio.to_thread(complete, ref.sync(), session_id, reply, prepared, reported)
        return
    sent = None if prepared is None else as_sent(prepared, session_id)
    await guard.complete(session_id, reply, prepared=sent, usage=reported)
