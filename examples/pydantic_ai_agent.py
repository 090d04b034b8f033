"""Pydantic AI: an agent whose every model request fits the served limit, kept in a session.

Runs offline: a ``FunctionModel`` stands in for ``OpenAIChatModel`` pointed at vLLM,
the store is memory:// (use redis://... in production). ``CtxGuardCapability`` fits
each request (instructions, tool schemas and thinking counted; tool calls and
returns kept together), leaves the run's history whole, and stores the run in the
session with the usage each response reported.

    python examples/pydantic_ai_agent.py
"""

from __future__ import annotations

import asyncio

from pydantic_ai import Agent
from pydantic_ai import messages as pai
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.usage import RequestUsage

from ctxguard import Guard
from ctxguard.adapters.pydantic_ai import CtxGuardCapability, model_profile

# In production: limit=ServerLimit("http://vllm:8000"), counter="hf:/path/to/tokenizer".
guard = Guard("memory://", counter="approx", limit=700, max_tokens=96)
sizes: list[int] = []


def scripted(messages: list[pai.ModelMessage], info: AgentInfo) -> pai.ModelResponse:
    """Calls the weather tool for each city asked about, then answers (offline)."""
    sizes.append(len(messages))
    usage = RequestUsage(input_tokens=9 * len(messages), output_tokens=20)
    last = messages[-1]
    prompt = next((p for p in last.parts if isinstance(p, pai.UserPromptPart)), None)
    if prompt is None:
        thinking = pai.ThinkingPart("Every city answered; summarise.")
        text = pai.TextPart("Mild everywhere; take a light jacket.")
        return pai.ModelResponse(parts=[thinking, text], usage=usage)
    cities = str(prompt.content).removeprefix("Weather in ").rstrip("?").split(" and ")
    calls = [pai.ToolCallPart("weather", {"city": c}, tool_call_id=f"call-{c}") for c in cities]
    return pai.ModelResponse(parts=calls, usage=usage)


# For vLLM: OpenAIChatModel(name, provider=OpenAIProvider(base_url=...),
#                           profile=model_profile(guard))
model = FunctionModel(scripted, profile=model_profile(guard))
print(f"Model context window: {model.context_window}")

capability = CtxGuardCapability(guard, session_id="user-42")
agent = Agent(
    model, instructions="You answer weather questions briefly.", capabilities=[capability]
)


@agent.tool_plain
def weather(city: str) -> str:
    """The weather in a city."""
    return f"{city}: 18C, clear skies, light wind from the west."


async def main() -> None:
    cities = ["Paris", "Oslo", "Lima", "Cairo", "Quito", "Perth", "Turin", "Leeds"]
    history: list[pai.ModelMessage] = []
    for turn in range(12):
        asked = " and ".join(cities[turn % 8 : turn % 8 + 1 + turn % 2])  # one city or two
        result = await agent.run(f"Weather in {asked}?", message_history=history)
        history = result.all_messages()
    stored = await capability.aload()  # the session, as Pydantic AI messages
    usage = [r for r in guard.store.read_audit("user-42") if r["kind"] == "usage"]
    print(f"Run history: {len(history)} messages; session: {len(stored)} messages")
    print(f"Session equals the run's history: {stored == history}")
    print(f"Usage records: {len(usage)}")
    print(f"Messages sent on the last request: {sizes[-1]} of {len(history) - 1}")
    worst = max(r["estimated"] for r in usage)
    print(f"Largest request: {worst} tokens + {guard.config.max_tokens} reserved <= 700")


asyncio.run(main())
