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
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from ctxguard import _validate
from ctxguard.adapters._shared import GuardRef
from ctxguard.errors import ConfigError
from ctxguard.guard.aio import AsyncGuard
from ctxguard.guard.prepared import PreparedRequest
from ctxguard.guard.sync import Guard
from ctxguard.kv.limit import ContextLimit, LimitSource, StaticLimit
from ctxguard.messages import Message
from ctxguard.stores.contract import AppendResult, StoredMessage

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
    """A fitted request as ``complete`` takes it: this session's, of no stored turn (0),
    with nothing left to store (the run's messages go by ``persist``, under any
    ``GuardConfig.commit``: a fitted request's ``unstored`` is the scratch store's)."""
    return dataclasses.replace(
        prepared, session_id=session_id, turn=0, pending_audit=None, unstored=None
    )


class Seen(set[str]):
    """One session's ids known to be stored, and the session's state token after the
    last write that told us so (``None``: none yet, so nothing is taken as stored)."""

    token: str | None = None

    def note(self, result: AppendResult, ids: Iterable[str]) -> None:
        """Our write ``result`` stored ``ids``: the set stays good only if the session
        was as we left it (its token before our write is the one we kept)."""
        moved = self.token is not None and result.token_before != self.token
        self.update(ids)
        self.token = "" if moved else result.token_after  # "": the next persist re-checks


class SeenIds:
    """Per session, the ids known to be stored: a shortcut that spares counting them again.

    Bounded (the least recently used sessions are forgotten): forgetting is safe, since
    the store skips an id it holds, so a long-lived process does not grow with every
    session it served. Stale when the session was deleted, cleared or rewritten
    elsewhere: each set keeps the state token our last write left, and our next write
    (which the turn makes anyway: the new messages, else the reply) reports the token it
    found; when they differ the session is read once and what the run holds is laid back
    in order (``persist``, ``complete``).
    """

    def __init__(self, sessions: int = 256) -> None:
        self._sessions = sessions
        self._ids: OrderedDict[str, Seen] = OrderedDict()
        self._lock = threading.Lock()

    def of(self, session_id: str) -> Seen:
        with self._lock:
            ids = self._ids.pop(session_id, None)
            self._ids[session_id] = ids = Seen() if ids is None else ids
            while len(self._ids) > self._sessions:
                self._ids.popitem(last=False)
            return ids


Everything = Callable[[], Sequence[Message]]


def _unseen(messages: Sequence[Message], seen: set[str]) -> list[Message]:
    return [m for m in messages if m.id not in seen]


def _moved(seen: Seen, result: AppendResult) -> bool:
    return seen.token is not None and result.token_before != seen.token


def persist(
    guard: Guard,
    session_id: str,
    messages: Sequence[Message],
    seen: Seen,
    everything: Everything | None = None,
) -> None:
    """Append the messages not ``seen`` before, in order. ``seen`` is only a shortcut:
    an id the session holds already is skipped by the store itself. When the append
    finds the session moved since our last write (deleted, cleared, rewritten), the
    messages ``seen`` left out may be gone: :func:`_relay` lays ``everything`` (what
    the run holds, in order; default ``messages``) back after what the session keeps."""
    new = _unseen(messages, seen)
    if not new:
        return
    result = guard.append(session_id, new)
    if _moved(seen, result):
        _lay_back(guard, session_id, list(messages if everything is None else everything()), seen)
        return
    seen.note(result, (m.id for m in new))


def _lay_back(guard: Guard, session_id: str, full: list[Message], seen: Seen) -> None:
    """The session moved elsewhere: read it once and lay the run's messages back."""
    stored, token = guard.store.read_with_token(session_id)
    start, tail = _relay(stored, full)
    after: str | None = token
    if tail is not None:
        after = guard.replace_tail(
            session_id, start, tail, expected_state=token
        ).appended.token_after
    _reset(seen, full, after)


async def _alay_back(guard: AsyncGuard, session_id: str, full: list[Message], seen: Seen) -> None:
    stored, token = await guard.store.read_with_token(session_id)
    start, tail = _relay(stored, full)
    after: str | None = token
    if tail is not None:
        replaced = await guard.replace_tail(session_id, start, tail, expected_state=token)
        after = replaced.appended.token_after
    _reset(seen, full, after)


def _with_reply(everything: Everything, reply: Message) -> list[Message]:
    full = list(everything())
    return full if any(m.id == reply.id for m in full) else [*full, reply]


async def apersist(
    ref: GuardRef,
    session_id: str,
    messages: Sequence[Message],
    seen: Seen,
    everything: Everything | None = None,
) -> None:
    guard = ref.aio()
    if guard is None:
        await asyncio.to_thread(persist, ref.sync(), session_id, messages, seen, everything)
        return
    new = _unseen(messages, seen)
    if not new:
        return
    result = await guard.append(session_id, new)
    if _moved(seen, result):
        await _alay_back(
            guard, session_id, list(messages if everything is None else everything()), seen
        )
        return
    seen.note(result, (m.id for m in new))


def _relay(
    stored: Sequence[StoredMessage], full: Sequence[Message]
) -> tuple[int, list[Message] | None]:
    """Where the run's part of the session starts (after the longest run of messages
    the run does not hold), and the run's messages to lay there in order (None: they
    are there already)."""
    ours = {m.id for m in full}
    ids = [s.message.id for s in stored]
    start = len(ids)
    while start > 0 and ids[start - 1] in ours:
        start -= 1
    kept = set(ids[:start])
    tail = [m for m in full if m.id not in kept]
    return start, (None if [m.id for m in tail] == ids[start:] else tail)


def _reset(seen: Seen, full: Sequence[Message], token: str | None) -> None:
    """The run's messages are all stored now, and the session's token is ``token``."""
    seen.clear()
    seen.update(m.id for m in full)
    seen.token = token


def complete(
    guard: Guard,
    session_id: str,
    reply: Message,
    prepared: PreparedRequest | None,
    reported: Mapping[str, Any] | None,
    seen: Seen,
    everything: Everything | None = None,
) -> None:
    """Store the reply with its usage. When the write finds the session moved since our
    last write (deleted, cleared, rewritten elsewhere) and ``everything`` says what the
    run holds before the reply, that is laid back with the reply now, as ``persist``
    does: a call that brought no new message (all stored before) left the session
    holding the reply alone until some later call appended one."""
    sent = None if prepared is None else as_sent(prepared, session_id)
    result = guard.complete(session_id, reply, prepared=sent, usage=reported)
    if everything is not None and _moved(seen, result):
        _lay_back(guard, session_id, _with_reply(everything, reply), seen)
        return
    seen.note(result, [reply.id])


async def acomplete(
    ref: GuardRef,
    session_id: str,
    reply: Message,
    prepared: PreparedRequest | None,
    reported: Mapping[str, Any] | None,
    seen: Seen,
    everything: Everything | None = None,
) -> None:
    guard = ref.aio()
    if guard is None:
        args = (ref.sync(), session_id, reply, prepared, reported, seen, everything)
        await asyncio.to_thread(complete, *args)
        return
    sent = None if prepared is None else as_sent(prepared, session_id)
    result = await guard.complete(session_id, reply, prepared=sent, usage=reported)
    if everything is not None and _moved(seen, result):
        await _alay_back(guard, session_id, _with_reply(everything, reply), seen)
        return
    seen.note(result, [reply.id])


def persist_reply(
    guard: Guard,
    session_id: str,
    messages: Sequence[Message],
    reply: Message,
    prepared: PreparedRequest | None,
    reported: Mapping[str, Any] | None,
    seen: Seen,
    everything: Everything | None = None,
) -> None:
    """Store the run's messages not ``seen`` and then the model's ``reply``, so that a
    refusal of any of them (a count that fails, a message past the cap) stores none:
    one append of both, and (usage reported) ``complete`` for the usage record, the
    reply stored already; when every message is stored, ``complete`` alone."""
    if reply.id in seen:
        persist(guard, session_id, messages, seen, everything)
    elif not _unseen(messages, seen):
        complete(guard, session_id, reply, prepared, reported, seen, everything)
    else:
        persist(guard, session_id, [*messages, reply], seen, _with(everything, messages, reply))
        if reported is not None:
            complete(guard, session_id, reply, prepared, reported, seen)


async def apersist_reply(
    ref: GuardRef,
    session_id: str,
    messages: Sequence[Message],
    reply: Message,
    prepared: PreparedRequest | None,
    reported: Mapping[str, Any] | None,
    seen: Seen,
    everything: Everything | None = None,
) -> None:
    """:func:`persist_reply` on an async guard (or a sync one, in a thread)."""
    if reply.id in seen:
        await apersist(ref, session_id, messages, seen, everything)
    elif not _unseen(messages, seen):
        await acomplete(ref, session_id, reply, prepared, reported, seen, everything)
    else:
        full = _with(everything, messages, reply)
        await apersist(ref, session_id, [*messages, reply], seen, full)
        if reported is not None:
            await acomplete(ref, session_id, reply, prepared, reported, seen)


def _with(everything: Everything | None, messages: Sequence[Message], reply: Message) -> Everything:
    """What the run holds, the reply after it (for :func:`_relay`)."""
    return lambda: [*(everything() if everything is not None else messages), reply]
