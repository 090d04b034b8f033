"""OpenAI Agents SDK adapter: every Responses item type that answers a call is paired
with its call, so a window keeps the two together.

Each call type and its output, in the Agents SDK's shape (``call_id`` on both) and in
the Responses API's own (a ``local_shell_call_output`` names its call by ``id``: read
by ``call_id`` only, it was no output, so the guard left the call out of every window
as unanswered and sent the output alone, which the API refuses). MCP approvals are not
tool calls: a request waiting for its approval stays in the window.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

pytest.importorskip("agents")

from ctxguard.adapters.openai_agents import CtxGuardSession, items_to_messages, message_to_items
from tests.conftest import private_memory_url

Item = dict[str, Any]
OUT = "a line of output " * 8

# name -> (the call, its output): every pairing type of the Responses API
PAIRS: dict[str, tuple[Item, Item]] = {
    "function": (
        {"type": "function_call", "call_id": "k1", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "k1", "output": OUT},
    ),
    "custom_tool": (
        {"type": "custom_tool_call", "call_id": "k1", "name": "g", "input": "x"},
        {"type": "custom_tool_call_output", "call_id": "k1", "output": OUT},
    ),
    "computer": (
        {
            "type": "computer_call",
            "id": "cu_1",
            "call_id": "k1",
            "action": {"type": "click", "x": 1, "y": 2, "button": "left"},
            "pending_safety_checks": [],
            "status": "completed",
        },
        {"type": "computer_call_output", "call_id": "k1", "output": OUT},
    ),
    "shell": (
        {"type": "shell_call", "call_id": "k1", "action": {"commands": ["ls"]}},
        {
            "type": "shell_call_output",
            "call_id": "k1",
            "output": [{"stdout": OUT, "stderr": "", "outcome": {"type": "exit"}}],
        },
    ),
    "apply_patch": (
        {"type": "apply_patch_call", "call_id": "k1", "operation": {"type": "delete_file"}},
        {"type": "apply_patch_call_output", "call_id": "k1", "status": "completed"},
    ),
    "local_shell (Agents SDK: call_id)": (
        {
            "type": "local_shell_call",
            "id": "ls_1",
            "call_id": "k1",
            "action": {"type": "exec", "command": ["ls"], "env": {}},
            "status": "completed",
        },
        {"type": "local_shell_call_output", "call_id": "k1", "output": OUT},
    ),
    "local_shell (Responses API: id)": (
        {
            "type": "local_shell_call",
            "id": "ls_1",
            "call_id": "k1",
            "action": {"type": "exec", "command": ["ls"], "env": {}},
            "status": "completed",
        },
        {"type": "local_shell_call_output", "id": "k1", "output": OUT},
    ),
}


def turn(call: Item, output: Item) -> list[Item]:
    older = "an older turn, long enough to be left out " * 20
    return [
        {"role": "user", "content": older},
        {"role": "assistant", "content": [{"type": "output_text", "text": older}]},
        {"role": "user", "content": "now"},
        call,
        output,
        {"role": "assistant", "content": [{"type": "output_text", "text": "done"}]},
    ]


@pytest.mark.parametrize("name", PAIRS)
def test_a_call_and_its_output_are_one_tool_group(name: str) -> None:
    call, output = PAIRS[name]
    assistant, tool = items_to_messages([call, output])
    assert [c.id for c in assistant.tool_calls or ()] == ["k1"]
    assert tool.role == "tool" and tool.tool_call_id == "k1"
    assert message_to_items(assistant) + message_to_items(tool) == [call, output]


@pytest.mark.parametrize("limit", [4096, 300])
@pytest.mark.parametrize("name", PAIRS)
def test_a_window_keeps_the_call_with_its_output(name: str, limit: int) -> None:
    call, output = PAIRS[name]
    items = turn(call, output)

    async def window() -> list[Item]:
        session = CtxGuardSession(
            "s", private_memory_url(), window=True, limit=limit, counter="approx", max_tokens=16
        )
        await session.add_items(items)
        return await session.get_items()

    got = asyncio.run(window())
    assert call in got and output in got
    assert got.index(output) == got.index(call) + 1
    if limit == 300:  # the older turn left out, the newest whole
        assert got == items[2:]
    else:
        assert got == items


def test_an_mcp_approval_request_waiting_for_its_answer_stays_in_the_window() -> None:
    request = {
        "type": "mcp_approval_request",
        "id": "mcpr_1",
        "server_label": "s",
        "name": "t",
        "arguments": "{}",
    }
    items = [{"role": "user", "content": "go"}, request]

    async def window() -> list[Item]:
        session = CtxGuardSession(
            "s", private_memory_url(), window=True, limit=4096, counter="approx"
        )
        await session.add_items(items)
        return await session.get_items()

    assert asyncio.run(window()) == items
