"""The sans-I/O SSE pieces: events cut at any byte, replies assembled from chunks."""

from __future__ import annotations

import itertools
import json

from hypothesis import given
from hypothesis import strategies as st

from ctxguard.serve.sse import EventSplitter, ReplyAssembler, event_data


def chunk(delta: dict[str, object], finish: str | None = None) -> str:
    return json.dumps(
        {"id": "c", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    )


STREAM = [
    chunk({"role": "assistant", "content": ""}),
    chunk({"content": "Let me "}),
    chunk({"content": "check."}),
    chunk(
        {"tool_calls": [{"index": 0, "id": "call_a", "function": {"name": "f", "arguments": ""}}]}
    ),
    chunk(
        {"tool_calls": [{"index": 1, "id": "call_b", "function": {"name": "g", "arguments": "{}"}}]}
    ),
    chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"x": '}}]}),
    chunk({"tool_calls": [{"index": 0, "function": {"arguments": "1}"}}]}),
    chunk({}, "tool_calls"),
    json.dumps({"id": "c", "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 2}}),
    "[DONE]",
]
WIRE = b"".join(b"data: " + p.encode() + b"\r\n\r\n" for p in STREAM)


@given(st.lists(st.integers(min_value=0, max_value=len(WIRE)), max_size=12))
def test_events_come_out_whole_however_the_bytes_are_cut(cuts: list[int]) -> None:
    splitter = EventSplitter()
    points = [0, *sorted(cuts), len(WIRE)]
    events = [e for a, b in itertools.pairwise(points) for e in splitter.feed(WIRE[a:b])]
    assert [event_data(e) for e in events] == STREAM
    assert splitter.rest() == b""


def test_the_reply_is_assembled_with_tool_calls_in_order() -> None:
    assembler = ReplyAssembler()
    for payload in STREAM:
        assembler.add(payload)
    assert assembler.finished and assembler.done
    assert assembler.usage == {"prompt_tokens": 5, "completion_tokens": 2}
    assert assembler.message() == {
        "role": "assistant",
        "content": "Let me check.",
        "tool_calls": [
            {
                "id": "call_a",
                "type": "function",
                "function": {"name": "f", "arguments": '{"x": 1}'},
            },
            {"id": "call_b", "type": "function", "function": {"name": "g", "arguments": "{}"}},
        ],
    }


def test_comments_and_junk_are_ignored() -> None:
    assert event_data(b": keep-alive\n\n") is None
    assembler = ReplyAssembler()
    assert assembler.add("not json") is None
    assert assembler.add("[1, 2]") is None
    assert not assembler.finished
    assert assembler.message() == {"role": "assistant", "content": ""}
