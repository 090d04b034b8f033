"""OpenAI Agents SDK: a ctxguard Session, and every model call fitted to the served limit.

Runs offline: the SDK's ``ScriptedModel`` stands in for a model served by vLLM, the
store is memory:// (use redis://... in production). The session keeps every item;
``model_input_filter`` fits each model call (instructions + history + this run's
tool turns) with the guard's counter.

    python examples/openai_agents_session.py
"""

from __future__ import annotations

import asyncio

from agents import Agent, RunConfig, Runner, function_tool
from agents.testing.model import ModelStep, ScriptedModel, assistant_message, function_call

from ctxguard import Guard
from ctxguard.adapters.openai_agents import CtxGuardSession, items_to_messages

# In production: limit=ServerLimit("http://vllm:8000"), counter="hf:/path/to/tokenizer".
guard = Guard("memory://", counter="approx", limit=700, max_tokens=96)
CITIES = ["Paris", "Oslo", "Lima", "Cairo", "Quito", "Perth", "Turin", "Leeds"]


@function_tool
def weather(city: str) -> str:
    """The weather in a city."""
    return f"{city}: 18C, clear skies, light wind from the west."


def scripted_turn(turn: int) -> list[ModelStep]:
    """One tool call, then the answer (offline stand-in for the model)."""
    city = CITIES[turn % 8]
    call = function_call("weather", {"city": city}, call_id=f"call_{turn}", item_id=f"fc_{turn}")
    answer = assistant_message(f"{city} is mild; take a light jacket.", item_id=f"msg_{turn}")
    return [ModelStep(output=[call]), ModelStep(output=[answer])]


async def main() -> None:
    model = ScriptedModel([step for turn in range(12) for step in scripted_turn(turn)])
    agent = Agent(
        name="weather",
        instructions="You answer weather questions briefly.",
        model=model,
        tools=[weather],
    )
    session = CtxGuardSession("user-42", guard)
    # the SDK does not hand the tools to the filter: name their schemas so they are counted
    schema = {"name": weather.name, "description": weather.description}
    tools = [{"type": "function", "function": {**schema, "parameters": weather.params_json_schema}}]
    fit = session.model_input_filter(tools=tools)
    config = RunConfig(call_model_input_filter=fit, tracing_disabled=True)
    for turn in range(12):
        question = f"Weather in {CITIES[turn % 8]}?"
        result = await Runner.run(agent, question, session=session, run_config=config)
        assert str(result.final_output).startswith(CITIES[turn % 8])

    items = await session.get_items()
    print(f"Session items: {len(items)} (user, call, output, answer per turn)")
    worst = 0
    for call in model.calls:
        sent = [{"role": "system", "content": call.system_instructions}, *call.input]
        worst = max(worst, guard.counter.count_request(items_to_messages(sent), tools=tools))
    print(f"Model calls: {len(model.calls)}; items on the last call: {len(model.calls[-1].input)}")
    print(f"Largest request: {worst} tokens + {guard.config.max_tokens} reserved <= 700")


asyncio.run(main())
