"""Hypothesis strategies for random conversations with tool calls (parallel ones too)."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import strategies as st

WORDS = st.sampled_from(
    [
        "hello",
        "weather",
        "Paris",
        "数据",
        "東京",
        "🙂",
        "def f(x):",
        "return x*2",
        "ok",
        "lorem ipsum",
    ]
)
TEXT = st.lists(WORDS, min_size=0, max_size=60).map(" ".join)


@st.composite
def tool_turn(draw: st.DrawFn, index: int) -> list[dict[str, Any]]:
    """An assistant message with 1-3 parallel tool calls, then one result per call."""
    calls = draw(st.integers(1, 3))
    ids = [f"ca{index:03d}{k:04d}" for k in range(calls)]  # 9 alphanumerics: Mistral accepts them
    assistant = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": i,
                "type": "function",
                "function": {"name": "lookup", "arguments": json.dumps({"q": draw(TEXT)[:40]})},
            }
            for i in ids
        ],
    }
    results = [{"role": "tool", "tool_call_id": i, "content": draw(TEXT)} for i in ids]
    return [assistant, *results]


@st.composite
def conversation(draw: st.DrawFn) -> list[list[dict[str, Any]]]:
    """A list of turns; each turn is what one prepare() appends (ends in a user message)."""
    turns: list[list[dict[str, Any]]] = []
    for index in range(draw(st.integers(1, 14))):
        turn: list[dict[str, Any]] = []
        if index and draw(st.booleans()):
            turn += draw(tool_turn(index))
            turn.append({"role": "assistant", "content": draw(TEXT)})
        elif index:
            turn.append({"role": "assistant", "content": draw(TEXT)})
        turn.append({"role": "user", "content": draw(TEXT) or "?"})
        turns.append(turn)
    return turns
