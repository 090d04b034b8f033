"""Token ids of a whole request, for the prefix-cache model (:mod:`ctxguard.kv.prefix`).

Counters that render through a chat template (``hf:``) give the template's own ids.
The tiktoken rule has no template: its ids are the content's real token ids framed
by negative marker ids, one per token the rule adds (message frame, reply priming,
tool rules), so a request's ids are exactly as long as its count and two requests
share a prefix exactly when their messages do. Other counters give None.
"""

from __future__ import annotations

import json
from array import array
from collections.abc import Sequence
from typing import Any

from ctxguard.messages import Message
from ctxguard.tokens._openai_dicts import openai_dicts, text_parts
from ctxguard.tokens._protocol import TokenCounter, Tools

_START, _SEP, _END, _NAME, _CALL, _TOOLS, _TOOL = -1, -2, -3, -4, -5, -6, -7


# message id -> (hash of its content, its ids): what an earlier call encoded
Memo = dict[str, tuple[int, "array[int]"]]


def prompt_ids(
    counter: TokenCounter,
    messages: Sequence[Message],
    tools: Tools | None = None,
    memo: Memo | None = None,
) -> list[int] | None:
    """The request's token ids as the server would see them, or None if the counter cannot.

    With ``memo`` (the tiktoken rule only, whose messages encode independently) a
    message found there under its id and content is not encoded again; ``memo`` is
    left holding exactly this request's messages.
    """
    encoding = getattr(counter, "_encoding", None)
    if encoding is not None and getattr(counter, "additive", False):
        return _rule_ids(encoding, messages, tools, memo)
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


def _rule_ids(
    encoding: Any, messages: Sequence[Message], tools: Tools | None, memo: Memo | None
) -> list[int]:
    encode = encoding.encode_ordinary
    out: list[int] = []
    if tools:
        out += [_TOOLS] * 9
        for tool in tools:
            function = tool.get("function", tool)
            out += [_TOOL] * 3 + encode(
                json.dumps(function, ensure_ascii=False, separators=(",", ":"))
            )
    if memo is None:
        for data in openai_dicts(messages):
            out += _message_ids(encode, data)
    else:
        kept = dict(memo)
        memo.clear()
        for message in messages:
            key = hash(message.content) if isinstance(message.content, str | None) else None
            found = kept.get(message.id)
            if found is None or key is None or found[0] != key:
                found = (key or 0, array("i", _message_ids(encode, openai_dicts([message])[0])))
            if key is not None:
                memo[message.id] = found
            out += found[1]
    assistant = encode("assistant")
    out += [_START, *assistant[:1], _SEP] if len(assistant) == 1 else [_START, _SEP, _SEP]
    return out


def _message_ids(encode: Any, data: dict[str, Any]) -> list[int]:
    out = [_START, *encode(data["role"]), _SEP]
    for part in text_parts(data.get("content")):
        out += encode(part)
    if data.get("name") is not None:
        out += [_NAME, *encode(data["name"])]
    for call in data.get("tool_calls") or ():
        function = call["function"]
        out += [_CALL, _CALL, _CALL, *encode(function["name"]), *encode(function["arguments"])]
    out.append(_END)
    return out


_S = Message(role="system", content="You are terse.")
_U1 = Message(role="user", content="What is the weather in Paris?")
_A1 = Message(role="assistant", content="It is sunny.")
_U2 = Message(role="user", content="And tomorrow?")
_A2 = Message(role="assistant", content="Rain.")
_S2 = Message(role="system", content="Answer in French from now on.")
_U3 = Message(role="user", content="Merci.")
_THINK = "<think>\nThe user asks about the weather.\n</think>\n\n"
_PROBE_CALL = Message.model_validate(
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call1abcd",
                "type": "function",
                "function": {"name": "weather", "arguments": '{"city": "Paris"}'},
            }
        ],
    }
)
_PROBE_RESULT = Message(role="tool", tool_call_id="call1abcd", content="18C")


def prefix_probes(counter: TokenCounter) -> dict[str, str]:
    """Does the template keep earlier turns as they were? One outcome per probe.

    Each probe renders a request, then the next one of the same conversation, and
    checks that the first request's ids (plus the reply as generated, where the
    probe names one) are a prefix of the second's: ``"prefix"``, ``"breaks at
    token N of M"`` (the first request's M ids are not all reused: everything from N
    on is prefilled again; N close to M only costs the reply), or
    ``"refused"`` / ``"no ids"``. Probes: ``append`` (a plain next turn),
    ``reasoning_reply`` (the reply carried a ``<think>`` block, as reasoning models
    generate it; Qwen3 drops it from earlier turns), ``system_after_turns`` (a
    system message added mid-conversation; some templates move or merge it),
    ``tool_round`` (a tool call, its result, then a new user turn).
    """
    think = Message(role="assistant", content=_THINK + "It is sunny.")
    cases: dict[str, tuple[list[Message], str | None, list[Message]]] = {
        "append": ([_S, _U1], None, [_S, _U1, _A1, _U2]),
        "reasoning_reply": ([_S, _U1], _THINK + "It is sunny.", [_S, _U1, think, _U2]),
        "system_after_turns": ([_S, _U1, _A1, _U2], None, [_S, _U1, _A1, _U2, _A2, _S2, _U3]),
        "tool_round": (
            [_S, _U1, _PROBE_CALL, _PROBE_RESULT],
            None,
            [_S, _U1, _PROBE_CALL, _PROBE_RESULT, _A1, _U2],
        ),
    }
    return {name: _probe(counter, *case) for name, case in cases.items()}


def _probe(
    counter: TokenCounter, first: list[Message], reply: str | None, second: list[Message]
) -> str:
    from ctxguard.errors import TemplateRefusedError

    try:
        before = prompt_ids(counter, first)
        after = prompt_ids(counter, second)
    except TemplateRefusedError:
        return "refused"
    if before is None or after is None:
        return "no ids"
    if reply is not None:
        before += reply_ids(counter, reply) or []
    for index, (a, b) in enumerate(zip(before, after, strict=False)):
        if a != b:
            return f"breaks at token {index} of {len(before)}"
    if len(before) > len(after):
        return f"breaks at token {len(after)} of {len(before)}"
    return "prefix"
