"""Token ids of a whole request, for the prefix-cache model (:mod:`ctxguard.kv.prefix`).

Counters that render through a chat template (``hf:``) give the template's own ids.
The tiktoken rule has no template: its ids are the content's real token ids framed
by negative marker ids, one per token the rule adds (message frame, reply priming,
tool rules), so a request's ids are exactly as long as its count and two requests
share a prefix exactly when their messages do. Other counters give None.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ctxguard.messages import Message
from ctxguard.tokens._openai_dicts import openai_dicts, text_parts
from ctxguard.tokens._protocol import TokenCounter, Tools

_START, _SEP, _END, _NAME, _CALL, _TOOLS, _TOOL = -1, -2, -3, -4, -5, -6, -7


def prompt_ids(
    counter: TokenCounter, messages: Sequence[Message], tools: Tools | None = None
) -> list[int] | None:
    """The request's token ids as the server would see them, or None if the counter cannot."""
    encoding = getattr(counter, "_encoding", None)
    if encoding is not None and getattr(counter, "additive", False):
        return _rule_ids(encoding, messages, tools)
    renderer = getattr(counter, "_renderer", None)
    ids = getattr(renderer, "ids", None)
    if ids is None:
        return None
    return list(ids(openai_dicts(messages), tools))


def reply_ids(counter: TokenCounter, text: str) -> list[int] | None:
    """A reply's ids as the server generated them (text, then end of turn), or None."""
    encoding = getattr(counter, "_encoding", None)
    if encoding is not None:
        return [*encoding.encode_ordinary(text), _END]
    make = getattr(getattr(counter, "_renderer", None), "reply_ids", None)
    return None if make is None else list(make(text))


def _rule_ids(encoding: Any, messages: Sequence[Message], tools: Tools | None) -> list[int]:
    encode = encoding.encode_ordinary
    out: list[int] = []
    if tools:
        out += [_TOOLS] * 9
        for tool in tools:
            function = tool.get("function", tool)
            out += [_TOOL] * 3 + encode(
                json.dumps(function, ensure_ascii=False, separators=(",", ":"))
            )
    for data in openai_dicts(messages):
        out += [_START, *encode(data["role"]), _SEP]
        for part in text_parts(data.get("content")):
            out += encode(part)
        if data.get("name") is not None:
            out += [_NAME, *encode(data["name"])]
        for call in data.get("tool_calls") or ():
            function = call["function"]
            out += [_CALL, _CALL, _CALL, *encode(function["name"]), *encode(function["arguments"])]
        out.append(_END)
    assistant = encode("assistant")
    out += [_START, *assistant[:1], _SEP] if len(assistant) == 1 else [_START, _SEP, _SEP]
    return out
