"""A ``/v1/responses`` request's ``instructions``, ``input`` and ``tools`` as chat
completions messages and tools, checked in the request's terms (``input[i]``): the
Guard would refuse the same in chat-completions terms, naming ids the client never saw."""

from __future__ import annotations

import json
from typing import Any

from ctxguard._validate import show
from ctxguard.serve import identity
from ctxguard.serve.inbound import check_function_tool
from ctxguard.serve.openai_errors import bad_request, json_kind


def _text_of(content: object, where: str, name: str = "content") -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for index, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") not in (
                "input_text",
                "output_text",
                "text",
            ):
                raise bad_request(
                    f"{where}: only text content parts are supported yet", param="input"
                )
            text = part.get("text")
            if not isinstance(text, str):  # (not its repr, stored and sent as the text)
                field = f"{where}.{name}[{index}].text"
                raise bad_request(f"{field} must be a string, got {json_kind(text)}", param=field)
            parts.append(text)
        return "".join(parts)
    raise bad_request(f"{where}: content must be a string or a list of parts", param="input")


def input_messages(body: dict[str, Any], places: list[str] | None = None) -> list[dict[str, Any]]:
    """The request's ``instructions`` and ``input`` as chat messages; ``places``, when
    given, gets each message's place in the request (``instructions``, ``input[i]``).

    Function calls and their outputs are checked here, in the request's terms (the Guard
    would refuse the same in chat-completions terms, naming ids the client never saw)."""
    out: list[dict[str, Any]] = []
    where_of: list[str] = [] if places is None else places
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise bad_request("'instructions' must be a string", param="instructions")
        digest = identity.reply_id([instructions], "instructions")
        out.append({"role": "system", "content": instructions, "id": "gw-i-" + digest[5:]})
        where_of.append("instructions")
    items = body.get("input")
    if isinstance(items, str):
        where_of.append("input")
        return [*out, {"role": "user", "content": items}]
    if not isinstance(items, list) or not items:
        raise bad_request("'input' must be a string or a non-empty array of items", param="input")
    waiting: int | None = None  # the last function_call not followed by an output or user
    answered: dict[str, int] = {}  # call_id -> the output in the current run of outputs
    for index, item in enumerate(items):
        where = f"input[{index}]"
        if not isinstance(item, dict):
            raise bad_request(f"{where} must be an object", param="input")
        kind = item.get("type", "message")
        if kind != "function_call_output":
            answered.clear()
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise bad_request(f"{where}: unknown role {role!r}", param="input")
            out.append({"role": role, "content": _text_of(item.get("content"), where)})
            if role == "user":
                waiting = None
        elif kind == "function_call_output":
            call_id = _text_field(item, "call_id", where, "the id of the call it answers")
            if call_id in answered:
                raise bad_request(
                    f"{where} and input[{answered[call_id]}] both answer call_id {call_id!r}; "
                    "send one function_call_output per call",
                    param=f"{where}.call_id",
                )
            answered[call_id] = index
            output = item.get("output")
            out.append(
                {
                    "role": "tool",
                    "tool_call_id": call_id,
                    "content": output
                    if isinstance(output, str)
                    else _text_of(output, where, "output"),
                }
            )
            waiting = None
        elif kind == "function_call":
            call = {
                "id": _text_field(item, "call_id", where, "the call's id"),
                "type": "function",
                "function": {
                    "name": _text_field(item, "name", where, "the function called"),
                    "arguments": _arguments(item, where),
                },
            }
            out.append({"role": "assistant", "content": None, "tool_calls": [call]})
            waiting = index
        else:
            raise bad_request(f"{where}: item type {kind!r} is not supported yet", param="input")
        where_of.append(where)
    if waiting is not None:  # (the Guard refuses it too, in its own terms)
        raise bad_request(
            f"input[{waiting}]: this function_call has no function_call_output after it; "
            "send its output after it, or leave it out (the gateway stores the model's "
            "calls itself)",
            param=f"input[{waiting}]",
        )
    return out


def _text_field(item: dict[str, Any], name: str, where: str, what: str) -> str:
    value = item.get(name)
    if not isinstance(value, str) or not value:
        raise bad_request(
            f"{where}.{name} must be a non-empty string ({what}), got {json_kind(value)}",
            param=f"{where}.{name}",
        )
    return value


def _arguments(item: dict[str, Any], where: str) -> str:
    value = item.get("arguments")
    if isinstance(value, str):
        try:
            json.loads(value)
            return value
        except (ValueError, RecursionError):
            pass
    shown = json_kind(value) if not isinstance(value, str) else show(value, 40)
    raise bad_request(
        f"{where}.arguments must be a string holding the call's arguments as JSON, got {shown}",
        param=f"{where}.arguments",
    )


def chat_tools(tools: object) -> list[dict[str, Any]] | None:
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise bad_request("'tools' must be an array", param="tools")
    out = []
    for index, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type") != "function":
            raise bad_request("only function tools are supported yet", param="tools")
        function = {k: tool[k] for k in ("name", "description", "parameters") if k in tool}
        check_function_tool(function, "function", f"tools[{index}]")
        out.append({"type": "function", "function": function})
    return out or None


FORMATS = ("text", "json_object", "json_schema")


def chat_response_format(text: object) -> dict[str, Any] | None:
    """The chat completions ``response_format`` for a Responses ``text`` field (its
    ``format``: ``text``, ``json_object``, or ``json_schema`` with ``name`` and ``schema``
    at its top level where chat nests them in ``json_schema``); None for plain text.
    (It was not forwarded: a client asking for JSON got free text and a 200.)"""
    if text is None:
        return None
    if not isinstance(text, dict):
        raise bad_request(f"'text' must be an object, got {json_kind(text)}", param="text")
    fmt = text.get("format")
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind not in FORMATS:
        raise bad_request(
            f"'text.format' must be an object whose type is one of {', '.join(FORMATS)}",
            param="text.format",
        )
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    name, schema = fmt.get("name"), fmt.get("schema")
    if not isinstance(name, str) or not name or not isinstance(schema, dict):
        raise bad_request(
            "a 'json_schema' text.format needs a 'name' (a string) and a 'schema' (an object)",
            param="text.format",
        )
    spec = {k: fmt[k] for k in ("name", "description", "schema", "strict") if k in fmt}
    return {"type": "json_schema", "json_schema": spec}
