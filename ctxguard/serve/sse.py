"""Server-sent events, sans I/O: split a byte stream into events, assemble the reply.

:class:`EventSplitter` cuts bytes into whole events (each forwarded as soon as it is
complete, so nothing is buffered past one event); :class:`ReplyAssembler` folds chat
completion chunks into the assistant message (content, tool calls by index) and the
usage, so the reply can be stored exactly as a non-streaming call would have given it;
:func:`reply_of` is that message taken from a non-streaming answer (a refusal or an audio
transcript stored as the content of a reply that has none: :func:`said_instead`).
"""

from __future__ import annotations

import json
from typing import Any


class EventSplitter:
    """Feed bytes, get back complete events (each ending with a blank line)."""

    def __init__(self) -> None:
        self._buffer = b""
        self._cr = b""  # a trailing CR, until we know whether LF follows

    def feed(self, data: bytes) -> list[bytes]:
        """Line ends (CRLF, CR, LF, as SSE allows) are normalised to LF."""
        data, self._cr = self._cr + data, b""
        if data.endswith(b"\r"):
            data, self._cr = data[:-1], b"\r"
        self._buffer += data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        events: list[bytes] = []
        while True:
            end = self._buffer.find(b"\n\n")
            if end < 0:
                return events
            events.append(self._buffer[: end + 2])
            self._buffer = self._buffer[end + 2 :]

    def rest(self) -> bytes:
        out, self._buffer, self._cr = self._buffer + self._cr, b"", b""
        return out


def clean_event(event: bytes) -> bytes | None:
    """``event`` as a client may be shown it: the fields SSE defines (``data``, ``event``,
    ``id``, ``retry``), a comment as a bare ``:`` (a keep-alive still keeps the connection
    alive), and ``data`` only when it holds a JSON object or ``[DONE]`` (its continuation
    lines with it); None when nothing is left. Other text an upstream or a proxy in front
    of it put in the stream (an HTML error page, a line quoting a credential) was relayed
    as it came: SSE clients ignore it, but it reached them unscrubbed."""
    if event.startswith(b"data: {") and event.count(b"\n") == 2:
        return event  # (a chunk, as every server sends it: the common case, kept as it is)
    kept: list[bytes] = []
    in_json = False  # the event's data holds a JSON object: its data lines are kept
    for line in event.rstrip(b"\n").split(b"\n"):
        if line.startswith(b":"):
            kept.append(b":")
        elif line.startswith(b"data:"):
            body = line[5:].lstrip()
            in_json = in_json or body.startswith(b"{")
            if in_json or body == b"[DONE]":
                kept.append(line)
        elif line.startswith((b"event:", b"id:", b"retry:")):
            kept.append(line)
    return b"\n".join(kept) + b"\n\n" if kept else None


def event_data(event: bytes) -> str | None:
    """The event's ``data:`` payload (lines joined), or None for comments and other fields."""
    lines = [
        line[5:].lstrip() if line.startswith(b"data:") else None
        for line in event.strip(b"\n").split(b"\n")
    ]
    data = [line for line in lines if line is not None]
    if not data:
        return None
    return b"\n".join(data).decode("utf-8", "replace")


class ReplyAssembler:
    """The assistant message and usage made from a stream of chat.completion.chunk objects."""

    def __init__(self) -> None:
        self.content: list[str] = []
        self.refusal: list[str] = []  # an OpenAI-style refusal, streamed as delta.refusal
        self.transcript: list[str] = []  # an audio reply's text (delta.audio.transcript)
        self.tool_calls: dict[int, dict[str, Any]] = {}
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] | None = None
        self.chunks = 0
        self.done = False
        self.response_id: str | None = None
        self.model: str | None = None
        self.error: str | None = None  # what an error chunk said (the reply did not finish)

    def add(self, data: str) -> dict[str, Any] | None:
        """Fold one event's data in; returns the parsed chunk (None for ``[DONE]``/junk)."""
        if data.strip() == "[DONE]":
            self.done = True
            return None
        try:
            chunk = json.loads(data)
        except ValueError:
            return None
        if not isinstance(chunk, dict):
            return None
        self.add_chunk(chunk)
        return chunk

    def add_chunk(self, chunk: dict[str, Any]) -> None:
        """Fold one parsed chunk in (an error chunk, see :func:`error_of`, ends the reply
        unfinished)."""
        error = error_of(chunk)
        if error is not None:
            self.error = error
            return
        self.chunks += 1
        self.response_id = self.response_id or _str(chunk.get("id"))
        self.model = self.model or _str(chunk.get("model"))
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
        for choice in chunk.get("choices") or ():
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue  # n > 1: the first choice is the one stored
            if choice.get("finish_reason"):
                self.finish_reason = str(choice["finish_reason"])
            delta = choice.get("delta")
            if isinstance(delta, dict):
                self._delta(delta)

    def _delta(self, delta: dict[str, Any]) -> None:
        if isinstance(delta.get("content"), str):
            self.content.append(delta["content"])
        if isinstance(delta.get("refusal"), str):
            self.refusal.append(delta["refusal"])
        audio = delta.get("audio")
        if isinstance(audio, dict) and isinstance(audio.get("transcript"), str):
            self.transcript.append(audio["transcript"])
        for part in delta.get("tool_calls") or ():
            if not isinstance(part, dict):
                continue
            index = part.get("index", 0)
            call = self.tool_calls.setdefault(
                index if isinstance(index, int) else 0,
                {"id": "", "type": "function", "function": {"name": "", "arguments": ""}},
            )
            if part.get("id"):
                call["id"] = str(part["id"])
            function = part.get("function")
            if isinstance(function, dict):
                if function.get("name"):
                    call["function"]["name"] += str(function["name"])
                if isinstance(function.get("arguments"), str):
                    call["function"]["arguments"] += function["arguments"]

    @property
    def replied(self) -> bool:
        """Whether any chunk's first choice said something: text, a call, a finish."""
        said = any(self.content) or any(self.refusal) or any(self.transcript)
        return said or bool(self.tool_calls) or self.finish_reason is not None

    @property
    def finished(self) -> bool:
        return self.error is None and (self.done or self.finish_reason is not None)

    def message(self) -> dict[str, Any]:
        """The reply as an OpenAI assistant message."""
        text = "".join(self.content)
        out: dict[str, Any] = {"role": "assistant", "content": text or None}
        if self.tool_calls:
            out["tool_calls"] = [self.tool_calls[i] for i in sorted(self.tool_calls)]
        elif out["content"] is None:
            out["content"] = said_instead("".join(self.refusal), "".join(self.transcript))
        return out

    def text_chars(self) -> int:
        return sum(len(c) for c in self.content)


def error_of(chunk: dict[str, Any]) -> str | None:
    """The message of an error a server put in its stream (what vLLM does when generation
    fails after the stream started: ``{"error": {...}}``, or the older shape
    ``{"object": "error", ...}``), else None. Foreign text: the caller scrubs it."""
    error = chunk.get("error")
    if error is None and chunk.get("object") == "error":
        error = chunk
    if error is None:
        return None
    message = error.get("message") if isinstance(error, dict) else error
    return str(message) if message not in (None, "") else "no message"


def reply_of(data: Any) -> dict[str, Any]:
    """The assistant message of a non-streaming chat completion; ValueError when
    ``data`` is not one (any shape: the upstream's reply is not trusted)."""
    choices = data.get("choices") if isinstance(data, dict) else None
    choice = choices[0] if isinstance(choices, list) and choices else None
    message = choice.get("message") if isinstance(choice, dict) else None
    if not isinstance(message, dict):
        raise ValueError("no choices[0].message object")
    content = message.get("content")
    if content is not None and not isinstance(content, str):
        raise ValueError("choices[0].message.content is not a string")
    reply: dict[str, Any] = {"role": "assistant", "content": content}
    calls = message.get("tool_calls")
    if calls:
        if not isinstance(calls, list):
            raise ValueError("choices[0].message.tool_calls is not an array")
        reply["tool_calls"] = [_call_of(call) for call in calls]
    elif not content:
        audio = message.get("audio")
        transcript = audio.get("transcript") if isinstance(audio, dict) else None
        reply["content"] = said_instead(message.get("refusal"), transcript)
    return reply


def said_instead(refusal: object, transcript: object) -> str:
    """The text of a reply with no content and no tool call: its ``refusal`` (OpenAI-style
    servers answer a refused request so), else its audio's ``transcript``, else "".

    Stored as the reply's content: every template renders content and every counter
    counts it, so the next turn shows the model what it said (kept as ``refusal`` it would
    be counted by no counter, and vLLM's templates drop it; the audio's ``id`` expires and
    its ``data`` is megabytes of base64, so neither is kept). The replay of a keyed
    request gives it back as content."""
    for text in (refusal, transcript):
        if isinstance(text, str) and text:
            return text
    return ""


def finish_of(data: Any) -> str | None:
    """The ``finish_reason`` of a non-streaming chat completion's first choice, if a string."""
    choices = data.get("choices") if isinstance(data, dict) else None
    choice = choices[0] if isinstance(choices, list) and choices else None
    finish = choice.get("finish_reason") if isinstance(choice, dict) else None
    return finish if isinstance(finish, str) else None


def _call_of(call: Any) -> dict[str, Any]:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict):
        raise ValueError("a tool call without a function object")
    call_id, name = call.get("id"), function.get("name")
    arguments = function.get("arguments") or ""
    kind = call.get("type", "function")
    if not (isinstance(call_id, str) and isinstance(name, str) and isinstance(arguments, str)):
        raise ValueError("a tool call's id, name or arguments is not a string")
    if not isinstance(kind, str):
        raise ValueError("a tool call's type is not a string")
    return {"id": call_id, "type": kind, "function": {"name": name, "arguments": arguments}}


def _str(value: object) -> str | None:
    return value if isinstance(value, str) else None
