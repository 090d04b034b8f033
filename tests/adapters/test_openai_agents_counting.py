"""OpenAI Agents SDK adapter: what a tool item carries is what the guard counts.

A shell call's output is a list of ``{"stdout", "stderr", "outcome"}`` chunks and an
apply-patch call carries its diff in ``operation``: both were counted as nothing (the
output as ``""``, the call's arguments as ``null``), so a window holding a long command
output or a long patch was sent over the limit; now their text is counted (the items
themselves still round-trip unchanged). A shell output the guard shrinks to fit keeps
its shape: a list of chunks (it became a bare string, which the Responses API refuses).
A tool search call stays with its ``tool_search_output`` (it was left out as unanswered).
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("agents")

from agents.run_config import ModelInputData

from ctxguard.adapters.openai_agents import CtxGuardSession, items_to_messages, message_to_items
from ctxguard.errors import BudgetError, MessageTooLongError
from ctxguard.guard import Guard, GuardConfig
from tests.conftest import private_memory_url

LONG = "a line of command output\n" * 400  # ~2,400 approx tokens
LIMIT, RESERVE = 1000, 50


def shell(stdout: str, stderr: str = "") -> list[dict[str, Any]]:
    return [
        {"type": "shell_call", "call_id": "c1", "action": {"commands": ["cat f"]}},
        {
            "type": "shell_call_output",
            "call_id": "c1",
            "output": [{"stdout": stdout, "stderr": stderr, "outcome": {"type": "exit"}}],
        },
    ]


def patch(diff: str) -> list[dict[str, Any]]:
    operation = {"type": "create_file", "path": "f.txt", "diff": diff}
    return [
        {"type": "apply_patch_call", "call_id": "c1", "operation": operation, "status": "done"},
        {"type": "apply_patch_call_output", "call_id": "c1", "status": "completed"},
    ]


def counted(items: list[dict[str, Any]]) -> str:
    """Every text the guard counts for ``items``: contents and call arguments."""
    out = []
    for message in items_to_messages(items):
        out.append(message.text)
        out.extend(c.function.arguments for c in message.tool_calls or ())
    return "".join(out)


@pytest.mark.parametrize(
    "items",
    [shell(LONG), shell("", LONG), patch(LONG)],
    ids=["shell-stdout", "shell-stderr", "patch-diff"],
)
def test_the_text_of_shell_and_patch_items_is_counted(items: list[dict[str, Any]]) -> None:
    assert "a line of command output" in counted(items)
    back = [i for m in items_to_messages(items) for i in message_to_items(m)]
    assert back == items


def fit(items: list[dict[str, Any]]) -> tuple[list[Any], CtxGuardSession]:
    """One model call of ``items`` after the user's "go", fitted in a 1000-token limit."""
    session = CtxGuardSession("s", Guard(private_memory_url(), limit=LIMIT, counter="approx"))
    call = [{"role": "user", "content": "go"}, *items]
    data = SimpleNamespace(model_data=ModelInputData(input=call, instructions=None))
    try:
        return asyncio.run(session.model_input_filter(max_tokens=RESERVE)(data)).input, session
    finally:
        session.ref.close()


def test_a_long_shell_output_is_shrunk_in_its_own_shape() -> None:
    """The newest turn's tool result is shrunk to fit (``degrade_tool_results``); a shell
    output stays a list of chunks (it became a bare string, which the API refuses)."""
    window, session = fit(shell(LONG))
    output = window[-1]["output"]
    assert window[-1]["type"] == "shell_call_output"
    assert isinstance(output, list) and len(output) == 1
    assert "removed by ctxguard" in output[0]["stdout"]
    assert output[0]["outcome"] == {"type": "exit"}
    prepared = session.last_prepared
    assert prepared is not None
    assert prepared.tokens + RESERVE <= LIMIT


def test_a_call_whose_patch_cannot_fit_is_refused() -> None:
    with pytest.raises(BudgetError):
        fit(patch(LONG))


def tool_search(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A client-run tool search (its output is ``tool_search_output``, not ``..._call_output``),
    then a call of the tool it found."""
    return [
        {
            "type": "tool_search_call",
            "id": "ts_1",
            "call_id": "call_ts",
            "arguments": {"query": "weather"},
            "execution": "client",
            "status": "completed",
        },
        {
            "type": "tool_search_output",
            "id": "tso_1",
            "call_id": "call_ts",
            "execution": "client",
            "status": "completed",
            "tools": tools,
        },
        {"type": "function_call", "call_id": "c1", "name": "weather", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
    ]


WEATHER = {"type": "function", "name": "weather", "parameters": {"type": "object"}}


def test_a_tool_search_call_stays_with_its_output() -> None:
    """The tool search call was taken for a call nothing answered, and the guard's
    tool-integrity policy left it out: the request held its output alone."""
    items = tool_search([WEATHER])
    window, session = fit(items)
    assert window == [{"role": "user", "content": "go"}, *items]
    assert session.last_prepared is not None and not session.last_prepared.decisions


async def test_a_windowed_session_keeps_the_tool_search_call() -> None:
    guard = Guard(private_memory_url(), limit=LIMIT, counter="approx")
    session = CtxGuardSession("s", guard, window=True, max_tokens=RESERVE)
    items = [{"role": "user", "content": "go"}, *tool_search([WEATHER])]
    await session.add_items(items)
    assert await session.get_items() == items
    guard.close()


def test_the_tools_a_tool_search_loaded_are_counted() -> None:
    tools = [{**WEATHER, "name": f"tool_{i}", "description": LONG[:200]} for i in range(40)]
    assert "tool_39" in counted(tool_search(tools))
    with pytest.raises(BudgetError):
        fit(tool_search(tools))


OVERSIZED = [
    {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": LONG}]},
    {  # (an image generation call is refused as an image: tests/adapters/test_media_parts.py)
        "type": "mcp_list_tools",
        "id": "ml_1",
        "server_label": "s",
        "tools": [{"name": "t", "description": LONG, "input_schema": {}}],
    },
    {"type": "web_search_call", "id": "ws_1", "status": "completed", "action": {"query": LONG}},
]


@pytest.mark.parametrize("item", OVERSIZED, ids=lambda item: item["type"])
async def test_an_oversized_item_with_no_text_of_its_own_is_refused_not_rewritten(
    item: dict[str, Any],
) -> None:
    """With ``oversized="truncate"``, the guard cut the middle out of such an item's
    counted text (its summary, its JSON) and the session stored, and gave back, an
    assistant message of that text in its place: now it is MessageTooLongError and
    nothing is stored, as for any message whose content is not one string."""
    config = GuardConfig(max_message_tokens=200, oversized="truncate")
    guard = Guard(private_memory_url(), limit=LIMIT, counter="approx", config=config)
    session = CtxGuardSession("s", guard)
    with pytest.raises(MessageTooLongError):
        await session.add_items([{"role": "user", "content": "go"}, item])
    assert await session.get_items() == []
    await session.add_items([{"role": "user", "content": LONG}])  # text is still cut
    assert "removed by ctxguard" in (await session.get_items())[0]["content"]
    guard.close()
