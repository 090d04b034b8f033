"""Build-time probes that decide whether a template is additive.

A counter is additive when, for a conversation the template accepts,
``render(conv, tools) == request_overhead(tools) + sum(count_message(m))``. Each probe
below exercises one way templates are known to break that (system prompts moved or
merged, default system text, consecutive turns merged, reasoning dropped from history,
tool results grouped, tool schemas folded into another message). A probe the template
refuses says nothing and is skipped; any probe that disagrees makes the counter
non-additive. The per-probe outcome is kept in ``counter.probe_report``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from ctxguard.errors import TemplateRefusedError, TokenizerError
from ctxguard.messages import Message
from ctxguard.tokens._protocol import Tools

Dict = dict[str, Any]

WEATHER_TOOL: Dict = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "City name"}},
            "required": ["city"],
        },
    },
}
_S = {"role": "system", "content": "You are a terse assistant."}
_S2 = {"role": "system", "content": "Answer in English."}
_U = {"role": "user", "content": "What is the weather in Paris?"}
_U2 = {"role": "user", "content": "And tomorrow?"}
_A = {"role": "assistant", "content": "It is sunny."}
_A_THINK = {"role": "assistant", "content": "<think>\nCheck the sky.\n</think>\n\nSunny."}
_A_EMPTY = {"role": "assistant", "content": ""}
_PARTS = {
    "role": "user",
    "content": [{"type": "text", "text": "First part."}, {"type": "text", "text": "Second."}],
}
_NAMED = {"role": "user", "content": "Hi, I am Ann.", "name": "ann"}


def _call(*ids: str, content: str | None = None) -> Dict:
    calls = [
        {
            "id": i,
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
        }
        for i in ids
    ]
    return {"role": "assistant", "content": content, "tool_calls": calls}


def _result(call_id: str, text: str) -> Dict:
    return {"role": "tool", "tool_call_id": call_id, "content": text}


_ID1, _ID2 = "call1abcd", "call2efgh"
_TOOLS = [WEATHER_TOOL]

PROBES: dict[str, tuple[list[Dict], Tools | None]] = {
    "one_user": ([_U], None),
    "system_user": ([_S, _U], None),
    "user_assistant_user": ([_U, _A, _U2], None),
    "multi_turn_with_system": ([_S, _U, _A, _U2, _A, _U], None),
    "tool_call_and_result": ([_U, _call(_ID1), _result(_ID1, '{"sky": "clear"}')], None),
    "tool_round_then_user": ([_U, _call(_ID1), _result(_ID1, "18C"), _A, _U2], None),
    "parallel_tool_calls": (
        [_U, _call(_ID1, _ID2), _result(_ID1, "18C"), _result(_ID2, "20C")],
        None,
    ),
    "content_in_two_parts": ([_PARTS], None),
    "named_user": ([_NAMED, _A, _U2], None),
    "consecutive_users": ([_U, _U2], None),
    "two_systems": ([_S, _S2, _U], None),
    "two_systems_no_punctuation": (
        [
            {"role": "system", "content": "Be brief"},
            {"role": "system", "content": "Use English"},
            _U,
        ],
        None,
    ),
    "two_tool_rounds": (
        [_U, _call(_ID1), _result(_ID1, "18C"), _A, _U2, _call(_ID2), _result(_ID2, "20C")],
        None,
    ),
    "system_after_turns": ([_U, _A, _S, _U2], None),
    "reasoning_in_history": ([_U, _A_THINK, _U2], None),
    "reasoning_before_tool_result": (
        [_U, _call(_ID1, content="<think>\nNeed data.\n</think>\n\n"), _result(_ID1, "18C")],
        None,
    ),
    "empty_assistant": ([_U, _A_EMPTY, _U2], None),
    "tools_one_user": ([_U], _TOOLS),
    "tools_system_user": ([_S, _U], _TOOLS),
    "tools_tool_round": ([_S, _U, _call(_ID1), _result(_ID1, "18C")], _TOOLS),
    "tools_multi_turn": ([_U, _A, _U2], _TOOLS),
}


class _Probed(Protocol):
    def count_message(self, message: Message) -> int: ...

    def request_overhead(self, *, tools: Tools | None = None) -> int: ...

    def count_request(self, messages: Sequence[Message], *, tools: Tools | None = None) -> int: ...


def run_probes(counter: _Probed) -> dict[str, str]:
    """Outcome per probe: ``ok``, ``refused`` or ``differs by N``."""
    return {name: _probe(counter, conv, tools) for name, (conv, tools) in PROBES.items()}


def _probe(counter: _Probed, conversation: list[Dict], tools: Tools | None) -> str:
    messages = [Message.from_openai(d) for d in conversation]
    try:
        full = counter.count_request(messages, tools=tools)
    except TemplateRefusedError:
        return "refused"
    try:
        parts = counter.request_overhead(tools=tools)
        parts += sum(counter.count_message(m) for m in messages)
    except TokenizerError as exc:
        return f"cannot split ({exc})"
    return "ok" if parts == full else f"differs by {full - parts:+d}"


def failures(report: dict[str, str]) -> int:
    """How many probes disagreed (refused probes do not count)."""
    return sum(1 for outcome in report.values() if outcome != "ok" and outcome != "refused")
