"""OpenAI Agents SDK adapter: the ``Session`` protocol on ctxguard.

>>> session = CtxGuardSession("user-42", "redis://localhost:6379/0", limit=128_000)
>>> result = await Runner.run(agent, "hi", session=session,            # doctest: +SKIP
...     run_config=RunConfig(call_model_input_filter=session.model_input_filter()))

Items are stored one ctxguard message per item, except that consecutive call
items added together (parallel tool calls) share one assistant message, so the
guard sees the chat shape providers check: an assistant message with all its
tool calls, then the results. Each original item is kept verbatim in
``Message.metadata['agents']`` when the chat shape cannot rebuild it, so
``get_items`` returns exactly what ``add_items`` received. (Just past ~400 lines on
purpose: the ``Session`` protocol's methods belong on one class; compaction is already
apart, in ``adapters/_compaction.py``.)

* ``get_items(limit=N)`` is the newest N items, oldest first, always from the raw
  history: the Runner relies on it to check and rewind the session's tail.
  Without ``limit``, ``session_settings.limit`` applies, as in the SDK's own
  sessions (``session_settings`` is a ``SessionSettings`` or a dict of its
  fields; unknown keys are a :class:`~ctxguard.errors.ConfigError`).
* ``get_items()`` with no limit is the whole history, or, with ``window=True``,
  the guard's budgeted window of it (system items pinned, call/output pairs whole).
* Every method takes the SDK's context-aware ``wrapper=`` keyword (the run's
  ``RunContextWrapper``); the session does not need the run context and
  ignores it.
* ``run_compaction`` (the Runner's post-turn hook) folds turns older than the
  newest ``compact_keep_turns`` user turns into the session's rolling summary
  with the guard's summarizer (see :mod:`ctxguard.adapters._compaction`).
* The Runner asks for history before it stores the new input, so the exact
  budget belongs in :meth:`CtxGuardSession.model_input_filter`: it fits every
  model call (instructions + history + new input + this run's tool turns).
* ``pop_item`` returns and removes the newest item in one atomic, audited write:
  a ``store.retract`` of the newest message, or, when that message held several
  items (parallel calls), ``Guard.replace_tail`` of it by the others, with its id
  (a reader never sees them gone). Either checks that nothing was appended since
  the message was read (:class:`~ctxguard.errors.ConflictError` otherwise).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Self

from ctxguard._validate import check_json, check_tools, one_line, show, type_name
from ctxguard.adapters import _compaction, _shared
from ctxguard.adapters._loops import PerLoop
from ctxguard.adapters._shared import GuardRef
from ctxguard.errors import (
    ConfigError,
    InvalidInputError,
    InvalidMessageError,
    MissingDependencyError,
)
from ctxguard.guard.aio import AsyncGuard
from ctxguard.guard.prepared import PreparedRequest
from ctxguard.guard.sync import Guard
from ctxguard.messages import FunctionCall, ImagePart, Message, TextPart, ToolCall

try:
    from agents.memory.session_settings import (
        SessionSettings,
        coerce_session_settings,
        resolve_session_limit,
    )
    from agents.run_config import ModelInputData
except ImportError as exc:  # pragma: no cover - exercised in a subprocess test
    raise MissingDependencyError("ctxguard.adapters.openai_agents", "agents") from exc

META_KEY = "agents"
Item = dict[str, Any]
_MESSAGE_ROLES = {"user", "system", "developer", "assistant"}


# -- items <-> messages ------------------------------------------------------------


def items_to_messages(items: Sequence[Any]) -> list[Message]:
    """Items as ctxguard messages: consecutive call items become one assistant message."""
    plain = [_plain(item, f"items[{index}]") for index, item in enumerate(items)]
    return [_message_of(group) for group in _groups(plain)]


def message_to_items(message: Message) -> list[Item]:
    """The items a stored message stands for (the originals when they were kept)."""
    kept = message.metadata.get(META_KEY)
    if kept is None:
        return _generic_items(message)
    items = [dict(i) for i in kept["items"]]
    if "ctxguard_truncated" in message.metadata and len(items) == 1:
        return [_with_text(items[0], message)]
    return items


def _plain(item: Any, what: str = "item") -> Item:
    """An item as a dict of JSON values (it is stored verbatim), or InvalidInputError."""
    if hasattr(item, "model_dump"):
        item = item.model_dump(exclude_unset=True)
    if not isinstance(item, dict):
        raise InvalidMessageError(
            f"{what}: an Agents SDK item must be a dict, got {type_name(item)}"
        )
    check_json(item, what, loose=True)
    return dict(item)


def _is_call(item: Item) -> bool:
    kind = str(item.get("type", ""))
    return kind.endswith("_call") and isinstance(item.get("call_id"), str)


def _is_output(item: Item) -> bool:
    kind = str(item.get("type", ""))
    return kind.endswith("_call_output") and isinstance(item.get("call_id"), str)


def _groups(items: list[Item]) -> list[list[Item]]:
    groups: list[list[Item]] = []
    for item in items:
        if groups and _is_call(item) and _is_call(groups[-1][-1]):
            groups[-1].append(item)
        else:
            groups.append([item])
    return groups


def _message_of(group: list[Item]) -> Message:
    head = group[0]
    if _is_call(head):
        base = Message(role="assistant", content=None, tool_calls=[_tool_call(i) for i in group])
    elif _is_output(head):
        base = Message(role="tool", content=_text(head.get("output")), tool_call_id=head["call_id"])
    elif (
        isinstance(head.get("role"), str)
        and head["role"] in _MESSAGE_ROLES
        and head.get("type", "message") == "message"
    ):
        base = Message(role=head["role"], content=_content(head.get("content"), head["role"]))
    else:
        base = Message(role="assistant", content=_other_text(head))
    if _generic_items(base) == group:
        return base
    return base.model_copy(update={"metadata": {META_KEY: {"items": group}}})


def _tool_call(item: Item) -> ToolCall:
    name = item.get("name") or item["type"]
    arguments = item.get("arguments", item.get("input", item.get("action")))
    if not isinstance(arguments, str) or not _is_json(arguments):
        arguments = json.dumps(arguments, ensure_ascii=False)
    return ToolCall(id=item["call_id"], function=FunctionCall(name=name, arguments=arguments))


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def _content(content: Any, role: str) -> str | list[TextPart | ImagePart]:
    if isinstance(content, str):
        return content
    if content is not None and not isinstance(content, list):
        raise InvalidMessageError(
            f"a {role} message item's content must be a string or a list of content parts, "
            f"got {type_name(content)}"
        )
    parts: list[TextPart | ImagePart] = []
    for part in content or ():
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("input_text", "output_text", "text"):
            parts.append(TextPart(text=part.get("text", "")))
        elif kind == "input_image" and isinstance(part.get("image_url"), str) and role == "user":
            parts.append(ImagePart.model_validate({"image_url": {"url": part["image_url"]}}))
        else:
            return _text(content)
    return parts


def _text(value: Any) -> str:
    """The text of a content list or tool output (what the guard counts)."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "".join(_text(v) for v in value)
    if isinstance(value, dict):
        for key in ("text", "refusal", "output"):
            if isinstance(value.get(key), str):
                return str(value[key])
        return ""
    return json.dumps(value, default=str)


def _other_text(item: Item) -> str:
    """Reasoning counts by its summary; any other item by its JSON."""
    if item.get("type") == "reasoning":
        return _text(item.get("summary")) + _text(item.get("content"))
    return json.dumps(item, ensure_ascii=False, default=str)


def _generic_items(message: Message) -> list[Item]:
    if message.role == "tool":
        return [
            {
                "type": "function_call_output",
                "call_id": message.tool_call_id,
                "output": message.text,
            }
        ]
    items: list[Item] = []
    if message.content is not None and (message.content != "" or not message.tool_calls):
        items.append({"role": message.role, "content": _content_out(message)})
    for call in message.tool_calls or ():
        items.append(
            {
                "type": "function_call",
                "call_id": call.id,
                "name": call.function.name,
                "arguments": call.function.arguments,
            }
        )
    return items


def _content_out(message: Message) -> str | list[Item]:
    if message.content is None or isinstance(message.content, str):
        return message.content or ""
    kind = "output_text" if message.role == "assistant" else "input_text"
    return [
        {"type": kind, "text": p.text}
        if isinstance(p, TextPart)
        else {"type": "input_image", "image_url": p.image_url.url, "detail": "auto"}
        for p in message.content
    ]


def _with_text(item: Item, message: Message) -> Item:
    """An item whose text the guard shrank: the shrunk text in the original's shape."""
    if "output" in item:
        return {**item, "output": message.text}
    if "content" in item:
        return {**item, "content": message.text}
    return _generic_items(message)[0]


# -- the session ---------------------------------------------------------------------


class CtxGuardSession:
    """An Agents SDK ``Session`` stored by ctxguard (memory://, Redis, Cluster).

    ``guard_or_url`` is a :class:`~ctxguard.guard.Guard`, an
    :class:`~ctxguard.guard.AsyncGuard` or a store URL (then ``limit``,
    ``counter``, ``namespace``, ``tenant`` build the guard). ``window=True``
    makes ``get_items()`` return the budgeted window, reserving ``max_tokens``
    for the reply. ``session_settings`` (a ``SessionSettings`` or a dict of its
    fields) sets the default ``limit`` of :meth:`get_items`, as in the SDK's sessions.
    ``compact_keep_turns`` and ``compact_threshold`` tune :meth:`run_compaction`.
    """

    session_settings: SessionSettings | None

    def __init__(
        self,
        session_id: str,
        guard_or_url: Guard | AsyncGuard | str = "memory://",
        *,
        window: bool = False,
        max_tokens: int | None = None,
        session_settings: SessionSettings | dict[str, Any] | None = None,
        compact_keep_turns: int = _compaction.KEEP_TURNS,
        compact_threshold: int = _compaction.THRESHOLD,
        **guard_options: Any,
    ) -> None:
        self.session_id = _shared.check_key(session_id)
        self.window = _shared.check_flag(window, "window")
        self.max_tokens = _shared.check_optional_count(max_tokens, "max_tokens")
        self.session_settings = _settings(session_settings) or SessionSettings()
        self.compaction = _compaction.Folding(compact_keep_turns, compact_threshold)
        self.ref = GuardRef(guard_or_url, **guard_options)
        self.last_prepared: PreparedRequest | None = None
        self._locks: PerLoop[asyncio.Lock] = PerLoop(asyncio.Lock)

    def _lock(self) -> asyncio.Lock:
        """This session's lock on the running loop (an asyncio.Lock serves one loop; a
        session used from several, as ``Runner.run_sync`` in threads does, keeps one each)."""
        return self._locks.get()

    async def get_items(self, limit: int | None = None, *, wrapper: Any = None) -> list[Item]:
        if limit is not None and type(limit) is not int:
            raise InvalidInputError(
                one_line(f"limit must be an int (the newest N items) or None, got {show(limit)}")
            )
        limit = resolve_session_limit(limit, self.session_settings)
        if limit is not None:
            if limit <= 0:
                return []
            messages = await _shared.aread_last(self.ref, self.session_id, limit)
            return _flatten(messages)[-limit:]
        if not self.window:
            return _flatten(await _shared.aread_all(self.ref, self.session_id))
        prepared = await _shared.aprepare(self.ref, self.session_id, (), self.max_tokens)
        self.last_prepared = prepared
        return _flatten(prepared.messages)

    async def add_items(self, items: list[Any], *, wrapper: Any = None) -> None:
        messages = items_to_messages(_shared.check_batch(items, object, "items"))
        async with self._lock():
            await _shared.aappend(self.ref, self.session_id, messages)

    async def pop_item(self, *, wrapper: Any = None) -> Item | None:
        """Remove and return the newest item (atomic retract; see the module docstring)."""
        async with self._lock():
            last = await _shared.asplit_newest(self.ref, self.session_id, _rest_of)
            return None if last is None else message_to_items(last)[-1]

    async def clear_session(self, *, wrapper: Any = None) -> None:
        async with self._lock():
            await _shared.aclear(self.ref, self.session_id)

    async def close(self) -> None:
        """Release the connections of the guards this session opened from a store URL:
        the Guard and the running loop's AsyncGuard (another loop's closes with that
        loop). A Guard or AsyncGuard passed in is yours and stays open. Idempotent; a
        later call opens a new guard. Awaited, as the SDK's own ``RedisSession.close``
        and ``AsyncSQLiteSession.close`` are; also ``async with session:``."""
        await self.ref.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def run_compaction(self, args: Any = None, *, wrapper: Any = None) -> None:
        """Fold old turns into the session's summary with the guard's summarizer.

        The Runner calls this after each turn it stores (when the model reports a
        response id, as the Responses API does; call it yourself otherwise). The
        raw history is kept whole; windows use the summary once they leave those
        turns out. Nothing happens while a tool call still waits for its output,
        without a summarizer, or (unless ``args["force"]``) before
        ``compact_threshold`` messages are there to fold. A failed summary is
        audited (``summary_failed``) and changes nothing.
        """
        force = _compaction.check_args(args)
        async with self._lock():
            await self.compaction.arun(self.ref, self.session_id, force=force)

    def model_input_filter(
        self, *, max_tokens: int | None = None, tools: Sequence[Any] | None = None
    ) -> Callable[[Any], Awaitable[Any]]:
        """A ``RunConfig.call_model_input_filter`` that fits every model call to the budget.

        ``tools`` are OpenAI tool schemas to count (the SDK does not hand them
        to the filter); ``max_tokens`` the output to reserve (else this
        session's, else the guard's default).
        """
        _shared.check_optional_count(max_tokens, "max_tokens")
        reserve = self.max_tokens if max_tokens is None else max_tokens
        guard = self.ref.any_guard()
        schemas = _shared.check_tool_list(tools) or None
        check_tools(schemas)

        async def fit_call(data: Any) -> Any:
            model_data = data.model_data
            instructions = model_data.instructions
            groups = _groups([_plain(i) for i in model_data.input])
            messages = [_message_of(g) for g in groups]
            if instructions:
                messages.insert(0, Message(role="system", content=instructions))
                groups.insert(0, [])
            prepared, origins = await _shared.afit(guard, messages, reserve, schemas)
            self.last_prepared = prepared
            window = _shared.restore_window(prepared, origins, groups, message_to_items)
            items = [item for group in window for item in group]
            return ModelInputData(input=items, instructions=instructions)

        return fit_call


def _rest_of(last: Message) -> list[Message]:
    """What stays of the newest message when its last item is popped: the other items
    (parallel calls), as one message with its id and time (none for a single item)."""
    items = message_to_items(last)
    rest = items_to_messages(items[:-1])
    return [m.model_copy(update={"id": last.id, "created_at": last.created_at}) for m in rest]


def _settings(value: object) -> SessionSettings | None:
    """``session_settings`` as the SDK's sessions take it, or a one-line ConfigError."""
    if value is None:
        return None
    try:
        return coerce_session_settings(value)  # type: ignore[arg-type]
    except (TypeError, ValueError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ConfigError(
            one_line(f"session_settings must be a SessionSettings or a dict of its fields: {first}")
        ) from None


def _flatten(messages: Sequence[Message]) -> list[Item]:
    return [item for m in messages for item in message_to_items(m)]


__all__ = ["CtxGuardSession", "items_to_messages", "message_to_items"]
