"""LangChain v1: a create_agent agent whose every model call fits the served limit.

Runs offline: a scripted chat model stands in for ``ChatOpenAI`` pointed at vLLM,
the store is memory:// (use redis://... in production). ``CtxGuardMiddleware`` fits
each call (system prompt and tool schemas counted), stores the conversation in the
session named by the run's ``thread_id`` and audits the usage the model reported.

    python examples/langchain_agent.py
"""

from __future__ import annotations

from typing import Any

from langchain.agents import create_agent
from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, trim_messages
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver

from ctxguard import Guard
from ctxguard.adapters.langchain import CtxGuardMiddleware, model_profile, token_counter

# In production: limit=ServerLimit("http://vllm:8000"), counter="hf:/path/to/tokenizer".
guard = Guard("memory://", counter="approx", limit=700, max_tokens=96)


@tool
def weather(city: str) -> str:
    """The weather in a city."""
    return f"{city}: 18C, clear skies, light wind from the west."


class ScriptedChatModel(BaseChatModel):
    """Calls the weather tool for each city asked about, then answers (offline)."""

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> ChatResult:
        usage = {"input_tokens": 9 * len(messages), "output_tokens": 20, "total_tokens": 0}
        last = messages[-1]
        if isinstance(last, HumanMessage):
            cities = str(last.content).removeprefix("Weather in ").rstrip("?").split(" and ")
            calls = [{"name": "weather", "args": {"city": c}, "id": f"call-{c}"} for c in cities]
            reply = AIMessage("", tool_calls=calls, usage_metadata=usage)
        else:
            reply = AIMessage("Mild everywhere; take a light jacket.", usage_metadata=usage)
        return ChatResult(generations=[ChatGeneration(message=reply)])


# For vLLM: ChatOpenAI(base_url="http://vllm:8000/v1", model=..., profile=model_profile(guard))
model = ScriptedChatModel(profile=model_profile(guard))
print(f"Model profile: {model.profile}")

agent = create_agent(
    model,
    tools=[weather],
    system_prompt="You answer weather questions briefly.",
    middleware=[CtxGuardMiddleware(guard)],  # last in the list: it fits what is sent
    checkpointer=InMemorySaver(),
)
config = {"configurable": {"thread_id": "user-42"}}
cities = ["Paris", "Oslo", "Lima", "Cairo", "Quito", "Perth", "Turin", "Leeds"]
for turn in range(12):
    asked = " and ".join(cities[turn % 8 : turn % 8 + 1 + turn % 2])  # one city or two
    agent.invoke({"messages": [HumanMessage(f"Weather in {asked}?")]}, config)

state = agent.get_state(config).values["messages"]
stored = guard.store.read("user-42")
usage = [r for r in guard.store.read_audit("user-42") if r["kind"] == "usage"]
print(f"Agent state: {len(state)} messages; ctxguard session: {len(stored)} messages")
print(f"Usage records: {len(usage)}")
worst = max(r["estimated"] for r in usage)
print(f"Largest request: {worst} tokens + {guard.config.max_tokens} reserved <= 700")

# The same exact count for LangChain's own tools (trim_messages, SummarizationMiddleware,
# ContextEditingMiddleware(token_counter=...)):
count = token_counter(guard, tools=[weather])
trimmed = trim_messages(state, max_tokens=300, token_counter=count, start_on="human")
print(f"trim_messages kept {len(trimmed)} of {len(state)} messages ({count(trimmed)} tokens)")
