"""OpenAI Agents SDK items as ctxguard messages and back (for ``adapters.openai_agents``).

Items are stored one ctxguard message per item, except that consecutive call items
added together (parallel tool calls) share one assistant message, so the guard sees the
chat shape providers check: an assistant message with all its tool calls, then the
results. What an item carries is what the guard counts: a message's text, a call's
arguments (its input, action or patch operation), a tool result's output (a shell
call's stdout and stderr), reasoning by its summary, any other item by its JSON (an
image, a file or audio is refused with its place, ``UncountableContentError``, in the
session and in the model input filter alike; a generated image too). Each
original item is kept verbatim in ``Message.metadata['agents']`` when the chat shape
cannot rebuild it, so the items read back are exactly the items stored.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ctxguard._validate import check_json, type_name
from ctxguard.adapters import _media
from ctxguard.errors import InvalidMessageError
from ctxguard.messages import FunctionCall, ImagePart, Message, TextPart, ToolCall

META_KEY = "agents"
Item = dict[str, Any]
_MESSAGE_ROLES = {"user", "system", "developer", "assistant"}


def items_to_messages(items: Sequence[Any]) -> list[Message]:
    """Items as ctxguard messages: consecutive call items become one assistant message."""
    return [_message_of(group) for group in _groups(checked_items(items, "items"))]


def checked_items(items: Sequence[Any], name: str) -> list[Item]:
    """Items as dicts of JSON values, with what the guard cannot count refused at its
    place (``<name>[i]``): an image, file or audio (UncountableContentError)."""
    plain = [_plain(item, f"{name}[{index}]") for index, item in enumerate(items)]
    for index, item in enumerate(plain):
        _check_media(item, f"{name}[{index}]")
    return plain


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


# a tool search's answer is a ``tool_search_output`` (the tool definitions it loaded), which
# no chat tool message can hold: the call is not paired as a tool call (its output would
# be taken for nothing's answer, and the guard would leave the call out), both items are
# counted as their JSON and stay in their turn
_UNPAIRED_CALLS = frozenset({"tool_search_call"})


# A call and its ``*_call_output`` pair by ``call_id`` (function, custom tool, computer,
# shell, apply_patch and local shell calls), except that a local shell call's output
# names the call by ``id`` in the Responses API's own shape (the Agents SDK writes
# ``call_id``): read as ``call_id``, it was no output at all, so the guard left its call
# out of every window as unanswered and sent the output alone. (An MCP approval request
# and its response, ``id`` / ``approval_request_id``, are not paired as a tool call: a
# request waiting for its approval must stay in the window, where an unanswered tool
# call is left out; both are counted as their JSON and stay in their turn, which a
# window keeps whole.)
_OUTPUT_KEYS = {"local_shell_call_output": ("call_id", "id")}


def _call_key(item: Item) -> str | None:
    """The id its output names this call by, or None for an item that is no call."""
    kind = str(item.get("type", ""))
    key = item.get("call_id")
    if kind.endswith("_call") and kind not in _UNPAIRED_CALLS and isinstance(key, str):
        return key
    return None


def _answer_key(item: Item) -> str | None:
    """The id of the call this item answers, or None for an item that is no output."""
    kind = str(item.get("type", ""))
    if not kind.endswith("_call_output"):
        return None
    names = _OUTPUT_KEYS.get(kind, ("call_id",))
    return next((item[n] for n in names if isinstance(item.get(n), str)), None)


def _is_call(item: Item) -> bool:
    return _call_key(item) is not None


def _is_output(item: Item) -> bool:
    return _answer_key(item) is not None


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
    elif (answered := _answer_key(head)) is not None:
        base = Message(role="tool", content=_text(head.get("output")), tool_call_id=answered)
    elif (
        isinstance(head.get("role"), str)
        and head["role"] in _MESSAGE_ROLES
        and head.get("type", "message") == "message"
    ):
        base = Message(role=head["role"], content=_content(head.get("content"), head["role"]))
    else:
        base = Message(role="assistant", content=_as_part(_other_text(head)))
    if _generic_items(base) == group:
        return base
    return base.model_copy(update={"metadata": {META_KEY: {"items": group}}})


_ARGUMENTS = ("arguments", "input", "action", "operation")  # apply_patch: its diff
_BOOKKEEPING = {"type", "id", "call_id", "status", "name"}


def _tool_call(item: Item) -> ToolCall:
    """A call item as the tool call the guard counts: what the call carries (its
    arguments, input, action or patch operation; else the item less its bookkeeping)."""
    name = item.get("name") or item["type"]
    found = next((key for key in _ARGUMENTS if key in item), None)
    if found is not None:
        arguments = item[found]
    else:
        arguments = {k: v for k, v in item.items() if k not in _BOOKKEEPING}
    if not isinstance(arguments, str) or not _is_json(arguments):
        arguments = json.dumps(arguments, ensure_ascii=False)
    key = _call_key(item)
    assert key is not None  # (only call items come here)
    return ToolCall(id=key, function=FunctionCall(name=name, arguments=arguments))


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
        elif _passes_on(part, role):
            parts.append(_media.image_part(part["image_url"]))
        elif kind in _MEDIA:  # (refused by _check_media before this)
            raise _media.uncountable(f"a {role} message's {kind} part", kind)
        else:
            return _text(content)
    return parts


# the content parts that are not text: an image, a file, audio, a computer's screenshot
_MEDIA = {
    "input_image": "image",
    "input_file": "file",
    "input_audio": "audio",
    "computer_screenshot": "image",
}


# items that stand for an image: an image generation call is the generated image (its
# ``result``, base64) that the model is shown, at the server's image rates, where the
# item's JSON counted the base64 text (~290k tokens for a 1024x1024 PNG) and refused
# every request after it; a server without the tool (vLLM) cannot read it at all
_IMAGE_ITEMS = frozenset({"image_generation_call"})


def _passes_on(part: Any, role: str) -> bool:
    """An image a chat message holds as its ``image_url`` part: a user's, by URL."""
    return (
        role == "user"
        and isinstance(part, dict)
        and part.get("type") == "input_image"
        and isinstance(part.get("image_url"), str)
    )


def _check_media(item: Item, where: str) -> None:
    """Refuse an image, file or audio part the guard would count as nothing (a tool's
    output, a file, an image by file id) or as the text of its bytes (a generated
    image): UncountableContentError, with its place. A user's image by URL passes on
    as an ``image_url`` part, for the counter to decide."""
    kind = item.get("type")
    if isinstance(kind, str) and kind in _IMAGE_ITEMS:
        raise _media.uncountable(f"{where} ({kind})", "image")
    role = item.get("role")
    content = item.get("content") if isinstance(role, str) else None
    if isinstance(content, list):
        for index, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind in _MEDIA and not _passes_on(part, str(role)):
                raise _media.uncountable(f"{where}.content[{index}] ({kind})", _MEDIA[kind])
    if not _is_output(item):
        return
    output = item.get("output")
    found = [(f"{where}.output", output)] if isinstance(output, dict) else []
    if isinstance(output, list):
        found = [(f"{where}.output[{i}]", part) for i, part in enumerate(output)]
    for place, part in found:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in _MEDIA:
            raise _media.uncountable(f"{place} ({kind})", _MEDIA[kind])


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
        # a shell call's output chunk: what the command printed
        return "".join(str(value[k]) for k in ("stdout", "stderr") if isinstance(value.get(k), str))
    return json.dumps(value, default=str)


def _as_part(text: str) -> str | list[TextPart | ImagePart]:
    """An item's counted text as one text part: a text no item field holds (a summary,
    an item's JSON), so the guard may not cut it (``oversized="truncate"`` cuts only
    one-string contents; it refuses this one, MessageTooLongError, rather than the
    session rewriting the item as an assistant message of the cut text)."""
    return [TextPart(text=text)] if text else ""


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
        chunks = item["output"]
        if isinstance(chunks, list) and chunks and all(_is_shell_chunk(c) for c in chunks):
            # a shell call's output stays a list of chunks (the last one's outcome)
            return {**item, "output": [{**chunks[-1], "stdout": message.text, "stderr": ""}]}
        return {**item, "output": message.text}
    if "content" in item:
        return {**item, "content": message.text}
    return _generic_items(message)[0]


def _is_shell_chunk(value: Any) -> bool:
    return isinstance(value, dict) and isinstance(value.get("stdout"), str)
