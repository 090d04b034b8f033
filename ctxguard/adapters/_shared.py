"""What every adapter needs: the guard behind it, whole-history I/O, and in-memory fitting.

Framework-free on purpose: each adapter module imports its framework and
converts messages; everything it does to the store goes through here, so the
three adapters store, read and rewrite sessions the same way.

Kept whole past ~400 lines on purpose: it is the one door the adapters share; a split
would hand each adapter two modules to keep in step. Every write that rewrites stored
history (``replace``, ``remove_at``, ``split_newest``) is one atomic store write
(``Guard.replace_tail`` or ``store.retract``), never a removal and an append.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import importlib
import json
import threading
from collections.abc import Callable, Mapping, Sequence
from types import ModuleType
from typing import Any

from ctxguard import _validate
from ctxguard.adapters._loops import PerLoop
from ctxguard.errors import (
    ConfigError,
    ConflictError,
    GuardClosedError,
    InvalidInputError,
    InvalidMessageError,
    MissingDependencyError,
)
from ctxguard.guard.aio import AsyncGuard
from ctxguard.guard.config import GuardConfig
from ctxguard.guard.prepared import PreparedRequest
from ctxguard.guard.sync import Guard
from ctxguard.ids import validate_id
from ctxguard.kv.limit import ContextLimit, LimitSource
from ctxguard.messages import Message
from ctxguard.stores.contract import AppendResult
from ctxguard.stores.memory import MemoryStore
from ctxguard.tokens._protocol import TokenCounter

Tools = Sequence[Mapping[str, Any]]
FIT_SESSION = "fit"


def require(module: str, feature: str, extra: str) -> ModuleType:
    """Import a framework module, or raise :class:`MissingDependencyError` naming the extra."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingDependencyError(feature, extra) from exc


class _NoLimit:
    """Stands in when an adapter was opened by URL without ``limit=``: storage works,
    budgeted windows say what is missing."""

    def resolve(self) -> ContextLimit:
        raise ConfigError(
            "a budgeted window needs a context limit: pass limit=<tokens> (or a Guard) "
            "to the adapter"
        )


class GuardRef:
    """The guard an adapter works through, given as a Guard, an AsyncGuard or a store URL.

    From a URL both twins are opened lazily over the same URL (so sync and async
    methods see the same session). From a Guard, async methods run it in a
    thread; from an AsyncGuard, sync methods are refused (they would block a loop).
    """

    def __init__(
        self,
        guard_or_url: Guard | AsyncGuard | str,
        *,
        limit: int | ContextLimit | LimitSource | None = None,
        counter: str | TokenCounter = "approx",
        namespace: str | None = None,
        tenant: str | None = None,
        config: GuardConfig | None = None,
        **unknown: Any,
    ) -> None:
        if unknown:  # (an adapter passes its **guard_options on: a typo was a bare TypeError)
            raise ConfigError(
                f"unknown option {', '.join(map(repr, sorted(unknown)))}: an adapter opened "
                "from a URL takes limit, counter, namespace, tenant and config (GuardConfig "
                "holds the guard's settings)"
            )
        self._sync: Guard | None = None
        self._async: AsyncGuard | None = None
        self._options: dict[str, Any] = {}
        self._opening = threading.Lock()
        self.per_loop: PerLoop[AsyncGuard] = PerLoop(self._open_async, AsyncGuard.aclose)
        given = [
            name
            for name, value, default in (
                ("limit", limit, None),
                ("counter", counter, "approx"),
                ("namespace", namespace, None),
                ("tenant", tenant, None),
                ("config", config, None),
            )
            if value is not default and value != default
        ]
        if given and isinstance(guard_or_url, Guard | AsyncGuard):  # (they were ignored)
            raise ConfigError(
                f"{', '.join(given)} given with a {type(guard_or_url).__name__}: these options "
                "are for a guard the adapter opens from a store URL; set them on the guard "
                "you pass, or pass the URL instead"
            )
        if isinstance(guard_or_url, Guard):
            self._sync = guard_or_url
        elif isinstance(guard_or_url, AsyncGuard):
            self._async = guard_or_url
        elif isinstance(guard_or_url, str):
            self._options = {
                "store": guard_or_url,
                "limit": _NoLimit() if limit is None else limit,
                "counter": counter,
                "namespace": namespace,
                "tenant": tenant,
                "config": config,
            }
        else:
            raise ConfigError(
                "pass a ctxguard Guard, an AsyncGuard or a store URL such as "
                f"'redis://localhost:6379/0', got {type(guard_or_url).__name__}"
            )

    def sync(self) -> Guard:
        if self._sync is None:
            if not self._options:
                raise ConfigError(
                    "this adapter wraps an AsyncGuard: use its async methods, "
                    "or pass a Guard or a store URL"
                )
            with self._opening:  # two threads' first calls open one Guard, not two
                if self._sync is None:
                    self._sync = Guard(**self._options)
        return self._sync

    def aio(self) -> AsyncGuard | None:
        """The async guard, or None when only a sync Guard was given (call it from a
        coroutine).

        Opened from a URL, each event loop gets its own AsyncGuard (an async Redis
        connection belongs to the loop that opened it; frameworks call one session
        from several loops, e.g. ``Runner.run_sync`` in threads), closed when that
        loop shuts down (see :mod:`ctxguard.adapters._loops`).
        """
        if not self._options:
            return self._async
        return self.per_loop.get()

    def _open_async(self) -> AsyncGuard:
        return AsyncGuard(**self._options)

    @property
    def owns(self) -> bool:
        """Whether the guards are this ref's own (opened from a URL), to close."""
        return bool(self._options)

    def close(self) -> None:
        """Close the Guard this ref opened from a URL, releasing its store's connections;
        a Guard or AsyncGuard it was given is the caller's and is left open. Idempotent;
        a later call opens a new guard."""
        if not self._options:
            return
        with self._opening:
            guard, self._sync = self._sync, None
        if guard is not None:
            guard.close()

    async def aclose(self) -> None:
        """:meth:`close`, and the running loop's AsyncGuard opened from the URL (another
        loop's is closed by that loop's shutdown, see :mod:`ctxguard.adapters._loops`)."""
        if not self._options:
            return
        try:
            await self.per_loop.close_here()
        finally:
            if self._sync is not None:
                await asyncio.to_thread(self.close)  # (it writes pending records)

    def any_guard(self) -> Guard | AsyncGuard:
        return self._sync or self._async or self.per_loop.latest() or self.sync()

    @property
    def commit(self) -> str:
        """The guard's ``GuardConfig.commit``, known without opening it."""
        if self._options:
            config = self._options["config"]
            return "prepare" if config is None else str(config.commit)
        guard = self._sync or self._async
        assert guard is not None
        return str(guard.config.commit)


def refuse_with_reply(commit: object, door: str, why: str) -> None:
    """A door that cannot keep ``GuardConfig(commit="with_reply")``'s promise refuses it
    when built (a one-line :class:`ConfigError`), never loses a message or a record later.
    ``why``: what the door does that the setting would lose."""
    if commit == "with_reply":
        raise ConfigError(
            f'{door} does not support GuardConfig(commit="with_reply"): {why}; give it a '
            'guard with commit="prepare" (the default)'
        )


# -- argument checks at the adapters' doors (one-line typed errors, before any I/O) ------


def check_batch(values: object, kind: type[Any], what: str = "messages") -> list[Any]:
    """A batch of framework messages: a list (or tuple, or other iterable) of ``kind``."""
    name = kind.__name__
    if kind is not object and isinstance(values, kind):
        raise InvalidMessageError(
            f"{what}: expected a list of {name}, got one {name} (wrap it in a list)"
        )
    if type(values) is list or type(values) is tuple:
        batch = list(values)
    elif (
        values is None
        or isinstance(values, str | bytes | bytearray | Mapping)
        or not hasattr(values, "__iter__")
    ):
        hint = " (pass [] for none)" if values is None else ""
        raise InvalidMessageError(
            _validate.one_line(
                f"{what}: expected a list of {name}, got {_validate.show(values)}{hint}"
            )
        )
    else:
        batch = list(values)
    for index, value in enumerate(batch):
        check_message(value, kind, f"{what}[{index}]")
    return batch


def check_message(value: object, kind: type[Any], what: str = "message") -> None:
    if not isinstance(value, kind):
        raise InvalidMessageError(
            _validate.one_line(
                f"{what} must be a {kind.__name__}, got {_validate.show(value)}; "
                f"pass {kind.__module__.split('.')[0]} message objects"
            )
        )


def check_key(value: object, what: str = "session id") -> str:
    """A session id (a LlamaIndex chat store key, an Agents or LangChain session id)."""
    return validate_id(value, what)


def digest_id(data: Any, prefix: str) -> str:
    """A stable message id made from ``data`` (JSON): ``prefix`` and a digest of its
    canonical JSON, for a message whose framework gives no usable id of its own."""
    text = json.dumps(data, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    digest = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=12)
    return prefix + digest.hexdigest()


def check_index(value: object, what: str) -> int:
    if type(value) is not int:
        raise InvalidInputError(
            _validate.one_line(f"{what} must be an int, got {_validate.show(value)}")
        )
    return value


def check_optional_count(value: object, what: str) -> int | None:
    """None, or a non-negative int (``max_tokens``, ``limit``)."""
    if value is not None:
        _validate.check_count(value, what)
    return value  # type: ignore[return-value]


def check_flag(value: object, what: str) -> bool:
    if type(value) is not bool:
        raise InvalidInputError(
            _validate.one_line(f"{what} must be True or False, got {_validate.show(value)}")
        )
    return value


def check_tool_list(tools: object, what: str = "tools") -> list[Any] | None:
    """A list or tuple of tools, or None (each item is the framework's to convert)."""
    if tools is None:
        return None
    if not isinstance(tools, list | tuple):
        raise InvalidInputError(
            f"{what} must be a list of tools or None, got {_validate.type_name(tools)}"
        )
    return list(tools)


# -- whole-history operations ---------------------------------------------------


def read_all(guard: Guard, session_id: str) -> list[Message]:
    return [s.message for s in guard.store.read(session_id)]


async def aread_all(ref: GuardRef, session_id: str) -> list[Message]:
    guard = ref.aio()
    if guard is None:
        return await asyncio.to_thread(read_all, ref.sync(), session_id)
    return [s.message for s in await guard.store.read(session_id)]


def read_last(guard: Guard, session_id: str, count: int) -> list[Message]:
    return [s.message for s in guard.store.read_last(session_id, count)]


async def aread_last(ref: GuardRef, session_id: str, count: int) -> list[Message]:
    guard = ref.aio()
    if guard is None:
        return await asyncio.to_thread(read_last, ref.sync(), session_id, count)
    return [s.message for s in await guard.store.read_last(session_id, count)]


async def aappend(
    ref: GuardRef, session_id: str, messages: Sequence[Message]
) -> AppendResult | None:
    """Append ``messages``; what the append did (None when there was nothing to append)."""
    if not messages:
        return None
    guard = ref.aio()
    if guard is None:
        return await asyncio.to_thread(ref.sync().append, session_id, messages)
    return await guard.append(session_id, messages)


def retract_unchanged(guard: Guard, session_id: str, count: int, token: str) -> bool:
    """Retract the newest ``count`` messages (one atomic, audited write) if the session's
    state token is still ``token``: whether it did (False, nothing written: another
    write came between)."""
    try:
        guard.store.retract(session_id, count, expected_state=token)
    except ConflictError:
        return False
    return True


async def aretract_unchanged(ref: GuardRef, session_id: str, count: int, token: str) -> bool:
    """Async :func:`retract_unchanged`."""
    guard = ref.aio()
    if guard is None:
        return await asyncio.to_thread(retract_unchanged, ref.sync(), session_id, count, token)
    try:
        await guard.store.retract(session_id, count, expected_state=token)
    except ConflictError:
        return False
    return True


def clear(guard: Guard, session_id: str) -> None:
    guard.store.delete(session_id)


async def aclear(ref: GuardRef, session_id: str) -> None:
    guard = ref.aio()
    if guard is None:
        await asyncio.to_thread(clear, ref.sync(), session_id)
    else:
        await guard.store.delete(session_id)


def remove_at(guard: Guard, session_id: str, index: int) -> Message | None:
    """Remove message ``index`` in one atomic, audited write; returns it (None when there
    is none). The tail from ``index`` is replaced by the messages after it, with their ids
    (``Guard.replace_tail``), so a reader sees the history with or without the message,
    never a shorter one; the session must still be as read (its state token: a message
    another process appended, or removed and replaced by another, meanwhile is never
    lost or put back: ConflictError instead, nothing written)."""
    if index < 0:
        return None
    tail, token = guard.store.read_with_token(session_id, index)
    if not tail:
        return None
    rest = [s.message for s in tail[1:]]
    guard.replace_tail(
        session_id, index, rest, expected_count=index + len(tail), expected_state=token
    )
    return tail[0].message


async def aremove_at(ref: GuardRef, session_id: str, index: int) -> Message | None:
    """Async :func:`remove_at`."""
    guard = ref.aio()
    if guard is None:
        return await asyncio.to_thread(remove_at, ref.sync(), session_id, index)
    if index < 0:
        return None
    tail, token = await guard.store.read_with_token(session_id, index)
    if not tail:
        return None
    rest = [s.message for s in tail[1:]]
    await guard.replace_tail(
        session_id, index, rest, expected_count=index + len(tail), expected_state=token
    )
    return tail[0].message


def pop_newest(guard: Guard, session_id: str) -> Message | None:
    """Remove and return the newest message (one atomic, audited retract)."""
    removed = guard.store.retract(session_id, 1)
    return removed[0].message if removed else None


async def apop_newest(ref: GuardRef, session_id: str) -> Message | None:
    """Async :func:`pop_newest`."""
    guard = ref.aio()
    if guard is None:
        return await asyncio.to_thread(pop_newest, ref.sync(), session_id)
    removed = await guard.store.retract(session_id, 1)
    return removed[0].message if removed else None


SPLIT_ATTEMPTS = 3  # reads of the newest message, each after another process's write


async def asplit_newest(
    ref: GuardRef, session_id: str, rest_of: Callable[[Message], Sequence[Message]]
) -> Message | None:
    """Take the newest message and leave ``rest_of(it)`` in its place (the part the
    caller does not pop: an Agents session's parallel calls share one message), in one
    atomic, audited write: a retract when nothing is left, else ``Guard.replace_tail``.
    Either checks the state token read with the message (a count would miss a writer
    that retracted the message and appended another); when another process wrote
    meanwhile (nothing was written) the newest is read again, at most
    :data:`SPLIT_ATTEMPTS` times (then ConflictError). Returns the message taken,
    None when there is none."""
    guard = ref.aio()
    if guard is None:
        return await asyncio.to_thread(split_newest, ref.sync(), session_id, rest_of)
    for attempt in range(SPLIT_ATTEMPTS):
        newest, token = await guard.store.read_with_token(session_id, -1)
        if not newest:
            return None
        seq, message = newest[0].seq, newest[0].message
        rest = rest_of(message)
        try:
            if rest:
                await guard.replace_tail(
                    session_id, seq, rest, expected_count=seq + 1, expected_state=token
                )
            else:
                await guard.store.retract(session_id, 1, seq + 1, expected_state=token)
        except ConflictError:
            if attempt + 1 == SPLIT_ATTEMPTS:
                raise
            continue
        return message
    return None  # (not reached)


def split_newest(
    guard: Guard, session_id: str, rest_of: Callable[[Message], Sequence[Message]]
) -> Message | None:
    """Sync :func:`asplit_newest`."""
    for attempt in range(SPLIT_ATTEMPTS):
        newest, token = guard.store.read_with_token(session_id, -1)
        if not newest:
            return None
        seq, message = newest[0].seq, newest[0].message
        rest = rest_of(message)
        try:
            if rest:
                guard.replace_tail(
                    session_id, seq, rest, expected_count=seq + 1, expected_state=token
                )
            else:
                guard.store.retract(session_id, 1, seq + 1, expected_state=token)
        except ConflictError:
            if attempt + 1 == SPLIT_ATTEMPTS:
                raise
            continue
        return message
    return None  # (not reached)


def replace(guard: Guard, session_id: str, messages: Sequence[Message]) -> None:
    """Replace a session's whole history (a framework's ``set_messages``) in one atomic,
    audited write (``Guard.replace_tail`` from 0): the batch is counted once, and a batch
    the guard or the store refuses writes nothing. The summary goes (it covered the old
    history); the audit trail and turn numbers stay, with a ``replace`` record. An empty
    batch deletes the session, as :func:`clear`."""
    if not messages:
        guard.store.delete(session_id)
        return
    guard.replace_tail(session_id, 0, messages)


async def areplace(ref: GuardRef, session_id: str, messages: Sequence[Message]) -> None:
    """Async :func:`replace`."""
    guard = ref.aio()
    if guard is None:
        await asyncio.to_thread(replace, ref.sync(), session_id, messages)
    elif not messages:
        await guard.store.delete(session_id)
    else:
        await guard.replace_tail(session_id, 0, messages)


def prepare(
    guard: Guard,
    session_id: str,
    new: Sequence[Message],
    max_tokens: int | None,
    tools: Tools | None = None,
) -> PreparedRequest:
    """Append ``new`` (may be empty) and return the budgeted window (one audit record)."""
    return guard.prepare(session_id, new, max_tokens=max_tokens, tools=tools)


async def aprepare(
    ref: GuardRef,
    session_id: str,
    new: Sequence[Message],
    max_tokens: int | None,
    tools: Tools | None = None,
) -> PreparedRequest:
    guard = ref.aio()
    if guard is None:
        return await asyncio.to_thread(prepare, ref.sync(), session_id, new, max_tokens, tools)
    return await guard.prepare(session_id, new, max_tokens=max_tokens, tools=tools)


# -- fitting a list that is not (all) stored yet -----------------------------------


def fit(
    guard: Guard | AsyncGuard,
    messages: Sequence[Message],
    max_tokens: int | None,
    tools: Tools | None = None,
) -> tuple[PreparedRequest, list[int]]:
    """Run the guard's policies over ``messages`` in memory, touching no session store.

    For prompts a framework assembles itself (history + new input + system
    prompt). Uses the guard's counter, limit and window settings; no summarizer.
    Returns the request and, per window message, the index of the input it came
    from (nothing is summarised here, so every window message has one).
    """
    if not messages:  # (the scratch session's "holds no messages" named it, not the call)
        raise InvalidInputError(
            "no messages to fit: the list is empty, so there is no request to send; "
            "pass at least the user's message"
        )
    if guard.closed:  # a closed guard fits nothing (the model is not called, then refused)
        raise GuardClosedError(type(guard).__name__)
    scratch = _scratch(guard)
    tagged = [m.model_copy(update={"id": f"fit-{i}"}) for i, m in enumerate(messages)]
    prepared = scratch.prepare(FIT_SESSION, tagged, max_tokens=max_tokens, tools=tools)
    origins = [int(m.id.removeprefix("fit-")) for m in prepared.messages]
    own_ids = tuple(
        m.model_copy(update={"id": messages[i].id})
        for m, i in zip(prepared.messages, origins, strict=True)
    )
    return dataclasses.replace(prepared, messages=own_ids), origins


def _scratch(guard: Guard | AsyncGuard) -> Guard:
    """A guard over a fresh in-memory store with ``guard``'s counter, limit and settings
    (no summarizer, no cap on stored messages, ``commit="prepare"``: a fitted request is
    no turn of a session, and one made under ``commit="with_reply"`` carried the scratch
    store's batch, ``fit-<i>`` ids and all, for a ``complete`` to store in the session)."""
    config = dataclasses.replace(
        guard.config, summarizer=None, max_stored_messages=None, commit="prepare"
    )
    return Guard(MemoryStore(), counter=guard.counter, limit=guard.limit_source, config=config)


async def afit(
    guard: Guard | AsyncGuard,
    messages: Sequence[Message],
    max_tokens: int | None,
    tools: Tools | None = None,
) -> tuple[PreparedRequest, list[int]]:
    """:func:`fit` off the event loop (counting and the limit lookup may be slow)."""
    return await asyncio.to_thread(fit, guard, messages, max_tokens, tools)


def restore_window(
    prepared: PreparedRequest,
    origins: Sequence[int],
    originals: Sequence[Any],
    convert: Callable[[Message], Any],
) -> list[Any]:
    """Map a fitted window back to the caller's own objects; shrunk messages are converted."""
    out = []
    for message, origin in zip(prepared.messages, origins, strict=True):
        shrunk = "ctxguard_truncated" in message.metadata
        out.append(convert(message) if shrunk else originals[origin])
    return out
