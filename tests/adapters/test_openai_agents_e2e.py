"""OpenAI Agents SDK end to end: the Runner over 12 turns with single and parallel tool
calls (run, run_sync, run_streamed) through CtxGuardSession and its input filter.

Every model call gets a window that fits the limit by the guard's own count (tool
schemas included), opens on a user turn once older items are left out, keeps
call/output pairs whole; the session holds every item of every turn, in order.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

pytest.importorskip("agents")

from agents import Agent, RunConfig, Runner, function_tool
from agents.testing.model import ModelStep, ScriptedModel, assistant_message, function_call

from ctxguard.adapters.openai_agents import CtxGuardSession, items_to_messages
from ctxguard.guard import AsyncGuard, Guard

from .conftest import LIMIT, RESERVE, assert_fits, assert_starts_on_user

TURNS = 12
INSTRUCTIONS = "You answer weather questions."


@function_tool
def weather(city: str) -> str:
    """The weather in a city."""
    return f"{city}: 18C, clear skies, light wind from the west. " * 2


SCHEMAS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": weather.name,
            "description": weather.description,
            "parameters": weather.params_json_schema,
        },
    }
]


def cities(turn: int) -> list[str]:
    """One tool call on odd turns, two in parallel on even ones."""
    return ["Paris", "Oslo"] if turn % 2 == 0 else ["Lima"]


def script(turn: int) -> list[ModelStep]:
    calls = [
        function_call("weather", {"city": c}, call_id=f"c{turn}-{c}", item_id=f"fc{turn}-{c}")
        for c in cities(turn)
    ]
    answer = assistant_message(f"It is mild ({turn}). " * 6, item_id=f"msg{turn}")
    return [ModelStep(output=calls), ModelStep(output=[answer])]


def expected_kinds(turns: int) -> list[tuple[str, str | None]]:
    """(item kind, call id) of every item the session must hold, in order."""
    out: list[tuple[str, str | None]] = []
    for turn in range(turns):
        ids = [f"c{turn}-{c}" for c in cities(turn)]
        out.append(("user", None))
        out += [("function_call", i) for i in ids]
        out += [("function_call_output", i) for i in ids]
        out.append(("message", None))
    return out


def kind(item: dict[str, Any]) -> tuple[str, str | None]:
    if item.get("role") == "user":
        return ("user", None)
    return (str(item.get("type", "message")), item.get("call_id"))


def _blocking_run(agent: Agent[Any], prompt: str, kw: dict[str, Any]) -> Any:
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        return Runner.run_sync(agent, prompt, **kw)
    finally:
        loop.close()


async def run_turn(mode: str, agent: Agent[Any], prompt: str, **kw: Any) -> str:
    if mode == "run":
        result = await Runner.run(agent, prompt, **kw)
    elif mode == "run_sync":
        result = await asyncio.to_thread(_blocking_run, agent, prompt, kw)
    else:
        result = Runner.run_streamed(agent, prompt, **kw)
        events = [event async for event in result.stream_events()]
        assert events
    return str(result.final_output)


@pytest.mark.parametrize("mode", ["run", "run_sync", "run_streamed"])
@pytest.mark.parametrize("which", ["url", "guard", "aguard"])
async def test_runner_fits_every_call_and_keeps_the_session(
    store_url: str, namespace: str, mode: str, which: str
) -> None:
    owner: Guard | AsyncGuard | None = None
    if which == "guard":
        owner = Guard(store_url, namespace=namespace, limit=LIMIT, counter="approx")
    elif which == "aguard":
        owner = AsyncGuard(store_url, namespace=namespace, limit=LIMIT, counter="approx")
    if owner is None:
        session = CtxGuardSession("chat", store_url, namespace=namespace, limit=LIMIT)
    else:
        session = CtxGuardSession("chat", owner)
    counting = session.ref.any_guard()
    model = ScriptedModel([step for turn in range(TURNS) for step in script(turn)])
    agent = Agent(name="w", instructions=INSTRUCTIONS, model=model, tools=[weather])
    config = RunConfig(
        call_model_input_filter=session.model_input_filter(max_tokens=RESERVE, tools=SCHEMAS),
        tracing_disabled=True,
    )
    for turn in range(TURNS):
        prompt = f"turn {turn}: what is the weather like today?"
        answer = await run_turn(mode, agent, prompt, session=session, run_config=config)
        assert answer.startswith(f"It is mild ({turn})")

    stored = await session.get_items()
    assert [kind(i) for i in stored] == expected_kinds(TURNS)  # whole and ordered
    prompts = [i["content"] for i in stored if i.get("role") == "user"]
    assert prompts == [f"turn {t}: what is the weather like today?" for t in range(TURNS)]
    history = items_to_messages(stored)
    assert len(model.calls) == 2 * TURNS
    for call in model.calls:
        assert call.streamed == (mode == "run_streamed")
        window = items_to_messages(
            [{"role": "system", "content": call.system_instructions}, *call.input]
        )
        assert window[0].role == "system"  # the instructions, pinned
        assert_fits(counting, window, RESERVE, SCHEMAS)  # includes: tool pairs whole
        assert_starts_on_user(window, history)
    assert len(model.calls[-1].input) < len(stored)  # the history outgrew the budget
    model.assert_complete()
    if isinstance(owner, AsyncGuard):
        await owner.aclose()
    elif owner is not None:
        owner.close()
