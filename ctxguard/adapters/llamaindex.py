"""LlamaIndex adapter: a chat store over ctxguard sessions, and a budgeted memory.

>>> store = CtxGuardChatStore("redis://localhost:6379/0")
>>> memory = CtxGuardMemory.from_defaults("redis://localhost:6379/0", session_id="s1",
...                                       limit=8192, max_tokens=512)   # doctest: +SKIP
>>> engine = SimpleChatEngine.from_defaults(llm=llm, memory=memory)     # doctest: +SKIP

* :class:`CtxGuardChatStore` implements ``BaseChatStore`` (keys are session ids)
  with native async methods. ``get_keys`` walks the namespace with SCAN, never KEYS,
  and lists the keys sorted on every store (SCAN answers in no set order, and no
  store keeps an order across sessions: not insertion order, as ``SimpleChatStore``).
* :class:`CtxGuardMemory` implements ``BaseMemory``: ``get()`` returns the window
  the guard chose (system pinned, tool pairs whole, within budget), not the whole
  history; ``get_all()`` returns everything.
* :class:`CtxGuardLLM` wraps an LLM so that every call's final input fits: what an
  agent adds beyond its memory (system prompt, tool schemas, the run's tool steps)
  is counted and fitted too (:mod:`ctxguard.adapters._llamaindex_llm`).

LlamaIndex users import both from here; the conversion (lossless, see
:mod:`ctxguard.adapters._llamaindex_convert`) and the memory
(:mod:`ctxguard.adapters._llamaindex_memory`) live beside it.

Every write is one atomic step: a reader (or a crash) sees the history before or
after it, never a part. ``set_messages`` (and the memory's ``set`` and
``from_defaults(chat_history=...)``) is ``Guard.replace_tail`` from 0: the batch is
counted once, a refused batch leaves the session as it was, the summary goes (it
covered the old history) and the audit trail stays, with a ``replace`` record;
an empty list deletes the session, as ``delete_messages`` does.
``delete_last_message`` is one audited ``store.retract``. ``delete_message``
replaces the tail from that index with the messages after it (their ids kept), in
one write that checks nothing was appended since the tail was read (ConflictError
otherwise); a summary covering the removed message goes, the audit trail stays.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from ctxguard.adapters import _llamaindex_fields as fields
from ctxguard.adapters import _shared
from ctxguard.adapters._closing import ClosesOwnGuard
from ctxguard.adapters._llamaindex_convert import (
    _converted,
    _converted_one,
    _key,
    to_ctxguard,
    to_llamaindex,
)
from ctxguard.adapters._loops import PerLoop
from ctxguard.adapters._shared import GuardRef
from ctxguard.errors import InvalidInputError, MissingDependencyError
from ctxguard.guard.aio import AsyncGuard
from ctxguard.guard.sync import Guard

try:
    from llama_index.core.base.llms.types import ChatMessage
    from llama_index.core.bridge.pydantic import PrivateAttr, ValidationError
    from llama_index.core.storage.chat_store.base import BaseChatStore
except ImportError as exc:  # pragma: no cover - exercised in a subprocess test
    raise MissingDependencyError("ctxguard.adapters.llamaindex", "llamaindex") from exc

from ctxguard.adapters._llamaindex_llm import CtxGuardLLM
from ctxguard.adapters._llamaindex_memory import CtxGuardMemory

# -- the chat store ------------------------------------------------------------------


class CtxGuardChatStore(BaseChatStore, fields.StoreFields, ClosesOwnGuard):
    """``BaseChatStore`` on ctxguard: one key is one session (memory://, Redis, Cluster).

    ``CtxGuardChatStore(guard_or_url, **guard_options)``: a Guard, an AsyncGuard or a
    store URL (then ``limit``, ``counter``, ``namespace``, ``tenant``, ``config`` build
    the guard). Its fields name that store (the URL with its password as ``***``), so the
    store rebuilt from ``to_dict``, a pickle or a saved workflow ``Context`` is the same
    store (see :mod:`ctxguard.adapters._llamaindex_fields`), not a fresh ``memory://``.
    """

    _lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)
    # one asyncio.Lock per event loop: a lock shared by loops binds to the first that
    # waits on it and raises RuntimeError in any other (asyncio.run per call, threads)
    _alocks: PerLoop[asyncio.Lock] = PrivateAttr(default_factory=lambda: PerLoop(asyncio.Lock))

    def __init__(
        self, guard_or_url: Guard | AsyncGuard | str | None = None, **options: Any
    ) -> None:
        if guard_or_url is None and _FIELDS_ONLY & options.keys():
            try:  # rebuilt from its fields (from_dict, pickle): the guard opens on use
                super().__init__(**options)
            except ValidationError as exc:
                raise _refusal(exc) from None
            return
        url = "memory://" if guard_or_url is None else guard_or_url
        ref = GuardRef(url, **options)
        super().__init__(**fields.describe(url, options))
        self._ref = ref
        fields.remember(self.handle, ref)

    @classmethod
    def class_name(cls) -> str:
        return "CtxGuardChatStore"

    @classmethod
    def model_validate(cls, obj: Any, *args: Any, **kwargs: Any) -> CtxGuardChatStore:
        try:
            return super().model_validate(obj, *args, **kwargs)
        except ValidationError as exc:
            raise _refusal(exc) from None

    @classmethod
    def model_validate_json(cls, json_data: Any, *args: Any, **kwargs: Any) -> CtxGuardChatStore:
        try:
            return super().model_validate_json(json_data, *args, **kwargs)
        except ValidationError as exc:
            raise _refusal(exc) from None

    def model_post_init(self, context: Any, /) -> None:
        _shared.check_optional_count(self.limit, "limit")
        fields.hide_credentials(self, "CtxGuardChatStore")

    @property
    def ref(self) -> GuardRef:
        """The guard this store works through (found again or opened from the fields)."""
        if self._ref is None:
            self._ref = fields.find_or_reopen(self.handle, self.model_dump(), "CtxGuardChatStore")
        return self._ref

    def set_messages(self, key: str, messages: list[ChatMessage]) -> None:
        new = _converted(key, messages)
        with self._lock:
            _shared.replace(self.ref.sync(), key, new)

    def get_messages(self, key: str) -> list[ChatMessage]:
        _key(key)
        return [to_llamaindex(m) for m in _shared.read_all(self.ref.sync(), key)]

    def add_message(self, key: str, message: ChatMessage) -> None:
        self.ref.sync().append(_key(key), [_converted_one(message)])

    def delete_messages(self, key: str) -> list[ChatMessage] | None:
        _key(key)
        with self._lock:
            guard = self.ref.sync()
            found = _shared.read_all(guard, key)
            _shared.clear(guard, key)
        return [to_llamaindex(m) for m in found] or None

    def delete_message(self, key: str, idx: int) -> ChatMessage | None:
        """Remove message ``idx`` in one atomic, audited write (the later messages keep
        their ids). An index past the end (or negative) returns None, as LlamaIndex's
        stores do."""
        _key(key)
        _shared.check_index(idx, "idx")
        with self._lock:
            removed = _shared.remove_at(self.ref.sync(), key, idx)
        return None if removed is None else to_llamaindex(removed)

    def delete_last_message(self, key: str) -> ChatMessage | None:
        """Remove the newest message (one atomic, audited retract)."""
        _key(key)
        with self._lock:
            removed = _shared.pop_newest(self.ref.sync(), key)
        return to_llamaindex(removed) if removed else None

    def get_keys(self) -> list[str]:
        """Every key (session id) in the namespace, sorted."""
        return sorted(self.ref.sync().store.list_sessions())

    async def aset_messages(self, key: str, messages: list[ChatMessage]) -> None:
        new = _converted(key, messages)
        async with self._alocks.get():
            await _shared.areplace(self.ref, key, new)

    async def aget_messages(self, key: str) -> list[ChatMessage]:
        _key(key)
        return [to_llamaindex(m) for m in await _shared.aread_all(self.ref, key)]

    async def async_add_message(self, key: str, message: ChatMessage) -> None:
        await _shared.aappend(self.ref, _key(key), [_converted_one(message)])

    async def adelete_messages(self, key: str) -> list[ChatMessage] | None:
        _key(key)
        async with self._alocks.get():
            found = await _shared.aread_all(self.ref, key)
            await _shared.aclear(self.ref, key)
        return [to_llamaindex(m) for m in found] or None

    async def adelete_message(self, key: str, idx: int) -> ChatMessage | None:
        _key(key)
        _shared.check_index(idx, "idx")
        async with self._alocks.get():
            removed = await _shared.aremove_at(self.ref, key, idx)
        return None if removed is None else to_llamaindex(removed)

    async def adelete_last_message(self, key: str) -> ChatMessage | None:
        _key(key)
        async with self._alocks.get():
            removed = await _shared.apop_newest(self.ref, key)
        return to_llamaindex(removed) if removed else None

    async def aget_keys(self) -> list[str]:
        guard = self.ref.aio()
        if guard is None:
            return await asyncio.to_thread(self.get_keys)
        return sorted([key async for key in guard.store.list_sessions()])

    # -- closing the guard opened from a URL -------------------------------------------

    def _guard_ref(self) -> GuardRef | fields.NothingOpen:  # ClosesOwnGuard: close(), with
        # copies of this object share the guard, and open a new one when next used
        return fields.to_close(self._ref, self.handle)


_FIELDS_ONLY = {"store", "settings", "handle"}  # only a rebuild passes these


def _refusal(exc: ValidationError) -> InvalidInputError:
    return fields.refusal(exc, "CtxGuardChatStore", "CtxGuardChatStore(url, ...)")


__all__ = ["CtxGuardChatStore", "CtxGuardLLM", "CtxGuardMemory", "to_ctxguard", "to_llamaindex"]
