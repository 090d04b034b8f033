"""Conversations some chat templates refuse: structure, roles, ids, empty turns, tools.

Each is valid as ctxguard Messages (the refusal is the template's, not the model's);
``EDGES`` are accepted everywhere today. test_refusals.py pairs both with every counter:
whatever the render path refuses, the additive path (``validate``) must refuse too, and
nothing else.
"""

from __future__ import annotations

from typing import Any

from .conversations import WEATHER, asst, call, result, sys_, usr

Dict = dict[str, Any]

C1 = call("abc123def", "get_weather", '{"city": "Paris"}')
C2 = call("xyz789ghi", "get_weather", '{"city": "Lyon"}')
BAD_ID = call("not-nine-chars", "get_weather", '{"city": "Paris"}')
BAD_TOOL: Dict = {
    "type": "function",
    "function": {"name": "bad name!", "description": "x", "parameters": {"type": "object"}},
}

REFUSALS: dict[str, tuple[list[Dict], list[Dict] | None]] = {
    # issue 12 item 15: Mistral v7 refuses an empty assistant turn mid-conversation
    "empty_assistant_mid_conversation": ([usr("Hi"), asst(""), usr("Still there?")], None),
    "null_assistant_without_calls": ([usr("Hi"), asst(None), usr("Still there?")], None),
    "system_after_assistant": ([usr("Hi"), asst("Hello."), sys_("Be brief."), usr("Ok")], None),
    "ends_with_assistant": ([usr("Hi"), asst("Hello.")], None),
    "only_assistant": ([asst("Hello.")], None),
    "two_assistants": ([usr("Hi"), asst("Hello."), asst("Again."), usr("Ok")], None),
    "tool_result_first": ([result("abc123def", "18C"), usr("Hi")], None),
    "tool_result_without_call": ([usr("Hi"), asst("Sure."), result("abc123def", "18C")], None),
    "more_results_than_calls": (
        [
            usr("Weather?"),
            asst(None, tool_calls=[C1]),
            result("abc123def", "1"),
            result("abc123def", "2"),
        ],
        None,
    ),
    "call_without_result": ([usr("Weather?"), asst(None, tool_calls=[C1]), usr("Well?")], None),
    "call_then_assistant": (
        [
            usr("Weather?"),
            asst(None, tool_calls=[C1, C2]),
            result("abc123def", "1"),
            asst("Hm."),
            usr("?"),
        ],
        None,
    ),
    "bad_tool_call_id": (
        [usr("Weather?"), asst(None, tool_calls=[BAD_ID]), result("not-nine-chars", "18C")],
        None,
    ),
    "content_and_tool_calls": (
        [usr("Weather?"), asst("Let me check.", tool_calls=[C1]), result("abc123def", "18C")],
        None,
    ),
    "bad_tool_schema": ([usr("Weather in Paris?")], [BAD_TOOL]),
    "tool_round_with_tools": (
        [usr("Weather?"), asst(None, tool_calls=[C1]), result("abc123def", "18C")],
        [WEATHER],
    ),
}

# Accepted by every family here today; still compared (a template update may refuse them).
EDGES: dict[str, tuple[list[Dict], list[Dict] | None]] = {
    "empty_system": ([sys_(""), usr("Hi")], None),
    "only_system": ([sys_("You are terse.")], None),
    "starts_with_assistant": ([asst("Hello."), usr("Hi")], None),
    "tools_with_one_user": ([usr("Weather in Paris?")], [WEATHER]),
    "empty_user": ([usr("")], None),
    "whitespace_assistant": ([usr("Hi"), asst("  "), usr("Ok")], None),
}
