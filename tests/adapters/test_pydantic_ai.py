"""Pydantic AI adapter: lossless parts, every model request within budget, the session kept."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from typing import Any

import pytest

pytest.importorskip("pydantic_ai")

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic_ai import Agent
from pydantic_ai import messages as pai
from pydantic_ai.capabilities import ProcessHistory
from pydantic_ai.models.function import AgentInfo, DeltaToolCall, FunctionModel
from pydantic_ai.models.test import TestModel

from ctxguard import ContextLimit, ModelLimit
from ctxguard.adapters.pydantic_ai import (
    CtxGuardCapability,
    dump,
    fit_history,
    from_stored,
    history_processor,
    load,
    model_profile,
    openai_tools,
    to_pieces,
)
from ctxguard.errors import BudgetError, ConfigError, CtxGuardError, InvalidMessageError
from ctxguard.guard import AsyncGuard, Guard
from ctxguard.guard.policies import tool_problems
from ctxguard.messages import Message
from tests import store_diff
from tests.conftest import private_memory_url

from .conftest import LIMIT, assert_starts_on_user
from .pydantic_ai_parts import (
    NOT_ROUND_TRIPPED,
    REQUEST_PARTS,
    RESPONSE_PARTS,
    T,
    as_message,
    union_members,
)

RESERVE = 48
PARTS = REQUEST_PARTS + RESPONSE_PARTS


def part_id(part: Any) -> str:
    return type(part).__name__


# -- every part type round-trips ---------------------------------------------------------


def test_every_part_type_has_an_example() -> None:
    # (a member may be a base: capability parts are subclasses of CapabilityPart)
    known = {kind for p in PARTS for kind in type(p).__mro__} | NOT_ROUND_TRIPPED
    assert union_members(pai.ModelRequestPart) <= known
    assert union_members(pai.ModelResponsePart) <= known


@pytest.mark.parametrize("part", PARTS, ids=part_id)
def test_part_round_trips_through_the_conversion(part: Any) -> None:
    message = as_message(part)
    back = from_stored(to_pieces([message], keep=True).messages)
    assert [dump(m) for m in back] == [dump(message)]
    assert back == [load(dump(message))]  # exactly what Pydantic AI's own JSON gives


@pytest.mark.parametrize("part", PARTS, ids=part_id)
def test_part_round_trips_through_the_store(guard: Guard, part: Any) -> None:
    message = as_message(part)
    stored = CtxGuardCapability(guard, session_id="parts")
    guard.append("parts", to_pieces([message], keep=True).messages)
    assert [dump(m) for m in stored.load()] == [dump(message)]


@st.composite
def histories(draw: st.DrawFn) -> list[pai.ModelMessage]:
    out: list[pai.ModelMessage] = []
    for _ in range(draw(st.integers(0, 6))):
        if draw(st.booleans()):
            parts = draw(st.lists(st.sampled_from(REQUEST_PARTS), max_size=4))
            out.append(pai.ModelRequest(parts=parts, timestamp=T, instructions=draw(text)))
        else:
            parts = draw(st.lists(st.sampled_from(RESPONSE_PARTS), min_size=1, max_size=4))
            out.append(pai.ModelResponse(parts=parts, timestamp=T, model_name=draw(text)))
    return out


text = st.none() | st.text(max_size=12)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(histories())
def test_any_history_round_trips(history: list[pai.ModelMessage]) -> None:
    pieces = to_pieces(history, keep=True)
    assert [dump(m) for m in from_stored(pieces.messages)] == [dump(m) for m in history]
    responses = [i for i, m in enumerate(history) if isinstance(m, pai.ModelResponse)]
    assert [i for i, _ in pieces.places if i in responses] == responses  # one piece each


def test_thinking_and_provider_parts_are_counted(guard: Guard) -> None:
    def tokens(*parts: Any) -> int:
        message = pai.ModelResponse(parts=[pai.TextPart("answer"), *parts])
        return guard.counter.count_request(to_pieces([message]).messages)

    plain = tokens()
    assert tokens(pai.ThinkingPart("a long chain of thought " * 20)) > plain + 100
    assert tokens(pai.NativeToolCallPart("web_search", {"q": "ctxguard " * 30})) > plain + 30


def test_stored_messages_of_other_writers_read_as_pydantic_ai(guard: Guard) -> None:
    guard.append(
        "plain",
        [
            {"role": "system", "content": "sys"},
            {"role": "user", "content": "hi"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "42"},
        ],
    )
    history = CtxGuardCapability(guard, session_id="plain").load()
    assert isinstance(history[0].parts[0], pai.SystemPromptPart)
    assert isinstance(history[2].parts[0], pai.ToolCallPart)
    assert history[3].parts[0] == pai.ToolReturnPart(
        "f", "42", tool_call_id="c1", timestamp=history[3].parts[0].timestamp
    )


# -- fitting -------------------------------------------------------------------------------


def long_history(turns: int) -> list[pai.ModelMessage]:
    out: list[pai.ModelMessage] = [
        pai.ModelRequest(parts=[pai.SystemPromptPart("You answer weather questions.")])
    ]
    for i in range(turns):
        call_a, call_b = f"a{i}", f"b{i}"
        out += [
            pai.ModelRequest(parts=[pai.UserPromptPart(f"weather {i} in Paris and Oslo?")]),
            pai.ModelResponse(
                parts=[
                    pai.ThinkingPart(f"two cities, two calls ({i})"),
                    pai.ToolCallPart("weather", {"city": "Paris"}, tool_call_id=call_a),
                    pai.ToolCallPart("weather", {"city": "Oslo"}, tool_call_id=call_b),
                ]
            ),
            pai.ModelRequest(
                parts=[
                    pai.ToolReturnPart("weather", "18C and clear", tool_call_id=call_a),
                    pai.ToolReturnPart("weather", "-2C and snowing", tool_call_id=call_b),
                ]
            ),
            pai.ModelResponse(parts=[pai.TextPart(f"Paris 18C, Oslo -2C ({i}).")]),
        ]
    return out


def window_tokens(
    guard: Guard | AsyncGuard,
    window: list[pai.ModelMessage],
    instructions: str | None,
    tools: list[dict[str, Any]] | None,
) -> int:
    """ctxguard's count of a window as sent; checks its tool pairs on the way."""
    pieces = to_pieces(window).messages
    assert tool_problems(pieces) == []
    head = [Message(role="system", content=instructions)] if instructions else []
    return guard.counter.count_request(head + pieces, tools=tools)


def test_fit_history_pins_the_system_prompt_and_keeps_pairs(guard: Guard) -> None:
    history = long_history(12)
    fitted = fit_history(guard, history, instructions="Be terse.", max_tokens=RESERVE)
    window = fitted.messages
    assert window[0] is history[0]  # pinned, the caller's own object
    assert window[-1] is history[-1]
    assert len(window) < len(history)
    assert window_tokens(guard, window, "Be terse.", None) + RESERVE <= LIMIT
    assert all(any(w is h for h in history) for w in window)  # nothing rebuilt or split


def test_a_request_keeps_only_its_pinned_part_when_the_rest_is_dropped(guard: Guard) -> None:
    first = pai.ModelRequest(parts=[pai.SystemPromptPart("sys"), pai.UserPromptPart("x " * 600)])
    history = [first, pai.ModelResponse(parts=[pai.TextPart("ok")])]
    history += [pai.ModelRequest(parts=[pai.UserPromptPart("newest")])]
    window = fit_history(guard, history, max_tokens=RESERVE).messages
    assert isinstance(window[0], pai.ModelRequest)
    assert window[0].parts == [first.parts[0]]
    assert window[-1] is history[-1]


async def test_history_processor_fits_each_request(guard: Guard) -> None:
    seen: list[list[pai.ModelMessage]] = []

    def reply(messages: list[pai.ModelMessage], info: AgentInfo) -> pai.ModelResponse:
        seen.append(messages)
        return pai.ModelResponse(parts=[pai.TextPart("fine " * 20)])

    agent = Agent(
        FunctionModel(reply),
        instructions="Be terse.",
        capabilities=[ProcessHistory(history_processor(guard, max_tokens=RESERVE))],
    )
    history: list[pai.ModelMessage] = []
    for i in range(12):
        history = (await agent.run(f"question {i} " * 5, message_history=history)).all_messages()
    for window in seen:
        assert window_tokens(guard, window, "Be terse.", None) + RESERVE <= LIMIT
    assert len(seen[-1]) < 2 * 12


# -- the capability end to end ------------------------------------------------------------


def weather_model(calls: list[tuple[list[pai.ModelMessage], AgentInfo]]) -> FunctionModel:
    """Turn i: a single tool call (odd i) or two in parallel (even i), then an answer."""

    def decide(messages: list[pai.ModelMessage]) -> list[tuple[str, str]] | None:
        last = messages[-1]
        assert isinstance(last, pai.ModelRequest)
        prompt = next((p for p in last.parts if isinstance(p, pai.UserPromptPart)), None)
        if prompt is None:
            return None  # tool results came back: answer
        turn = int(str(prompt.content).split()[1].rstrip(":"))
        cities = ["Paris", "Oslo"] if turn % 2 == 0 else ["Lima"]
        return [(f"c{turn}-{city}", city) for city in cities]

    def reply(messages: list[pai.ModelMessage], info: AgentInfo) -> pai.ModelResponse:
        calls.append((messages, info))
        wanted = decide(messages)
        if wanted is None:
            return pai.ModelResponse(
                parts=[pai.ThinkingPart("summing up"), pai.TextPart("It is mild. " * 6)],
                usage=pai_usage(messages),
            )
        return pai.ModelResponse(
            parts=[pai.ToolCallPart("weather", {"city": c}, tool_call_id=i) for i, c in wanted],
            usage=pai_usage(messages),
        )

    async def stream(messages: list[pai.ModelMessage], info: AgentInfo) -> AsyncIterator[Any]:
        calls.append((messages, info))
        wanted = decide(messages)
        if wanted is None:
            for word in ("It ", "is ", "mild. ") * 6:
                yield word
            return
        yield {
            n: DeltaToolCall(name="weather", json_args=f'{{"city": "{c}"}}', tool_call_id=i)
            for n, (i, c) in enumerate(wanted)
        }

    return FunctionModel(reply, stream_function=stream)


def pai_usage(messages: list[pai.ModelMessage]) -> Any:
    from pydantic_ai.usage import RequestUsage

    return RequestUsage(input_tokens=10 * len(messages), output_tokens=7)


def weather_agent(model: FunctionModel, capability: CtxGuardCapability) -> Agent[None, str]:
    agent = Agent(model, capabilities=[capability], instructions="You answer weather questions.")

    @agent.tool_plain
    def weather(city: str) -> str:
        """The weather in a city."""
        return f"{city}: 18C, clear skies, light wind from the west. " * 2

    return agent


async def run_turns(agent: Agent[None, str], mode: str, turns: int) -> list[pai.ModelMessage]:
    history: list[pai.ModelMessage] = []
    for turn in range(turns):
        prompt = f"turn {turn}: what is the weather like today?"
        if mode == "sync":
            result = await asyncio.to_thread(agent.run_sync, prompt, message_history=history)
            history = result.all_messages()
        elif mode == "async":
            history = (await agent.run(prompt, message_history=history)).all_messages()
        else:
            async with agent.run_stream(prompt, message_history=history) as streamed:
                assert (await streamed.get_output()).startswith("It is mild.")
            history = streamed.all_messages()
    return history


@pytest.mark.parametrize("mode", ["sync", "async", "stream"])
@pytest.mark.parametrize("which", ["guard", "aguard"])
async def test_capability_fits_every_call_and_keeps_the_run(
    store_url: str, namespace: str, mode: str, which: str
) -> None:
    kind = AsyncGuard if which == "aguard" else Guard
    guard = kind(store_url, namespace=namespace, limit=LIMIT, counter="approx")
    calls: list[tuple[list[pai.ModelMessage], AgentInfo]] = []
    capability = CtxGuardCapability(guard, session_id="weather", max_tokens=RESERVE)
    history = await run_turns(weather_agent(weather_model(calls), capability), mode, 12)

    assert len(calls) == 24  # a tool call and an answer per turn
    tools = openai_tools(calls[0][1].function_tools)
    whole = to_pieces(history).messages
    for window, info in calls:
        assert info.model_settings is not None and info.model_settings["max_tokens"] == RESERVE
        tokens = window_tokens(guard, window, info.instructions, tools)
        assert tokens + RESERVE <= LIMIT, (tokens, len(window))
        assert isinstance(window[-1], pai.ModelRequest)
        responses = [m for m in window if isinstance(m, pai.ModelResponse)]
        assert all(any(r is h for h in history) for r in responses)  # never split
        assert_starts_on_user(to_pieces(window).messages, whole)
    assert len(calls[-1][0]) < len(history)  # the history outgrew the budget: trimmed

    stored = await capability.aload()
    assert [dump(m) for m in stored] == [dump(m) for m in history]  # whole and ordered
    audit = await read_audit(guard, "weather")
    usage = [r for r in audit if r["kind"] == "usage"]
    assert len(usage) == len(calls)
    assert all(r["estimated"] + RESERVE <= LIMIT for r in usage)
    if mode != "stream":  # a streamed FunctionModel reports its own estimate
        assert [r["prompt_tokens"] for r in usage] == [10 * len(w) for w, _ in calls]
    await close(guard)


async def close(guard: Guard | AsyncGuard) -> None:
    if isinstance(guard, AsyncGuard):
        await guard.aclose()
    else:
        guard.close()


async def test_capability_with_an_exact_counter() -> None:
    pytest.importorskip("tiktoken")
    guard = Guard(private_memory_url(), limit=LIMIT, counter="tiktoken:cl100k_base")
    assert guard.counter.exact
    calls: list[tuple[list[pai.ModelMessage], AgentInfo]] = []
    capability = CtxGuardCapability(guard, session_id="exact", max_tokens=RESERVE)
    history = await run_turns(weather_agent(weather_model(calls), capability), "async", 12)
    tools = openai_tools(calls[0][1].function_tools)
    whole = to_pieces(history).messages
    for window, info in calls:
        assert window_tokens(guard, window, info.instructions, tools) + RESERVE <= LIMIT
        assert_starts_on_user(to_pieces(window).messages, whole)
    assert len(calls[-1][0]) < len(history)
    assert [dump(m) for m in capability.load()] == [dump(m) for m in history]


async def read_audit(guard: Guard | AsyncGuard, session: str) -> list[dict[str, Any]]:
    if isinstance(guard, AsyncGuard):
        return await guard.store.read_audit(session)
    return guard.store.read_audit(session)


async def test_capability_with_test_model_and_a_later_run_from_the_session(guard: Guard) -> None:
    capability = CtxGuardCapability(guard, session_id="tm", max_tokens=RESERVE)
    agent = Agent(TestModel(), capabilities=[capability])

    @agent.tool_plain
    def lookup(key: str) -> str:
        return f"value of {key}"

    first = await agent.run("look something up")
    second = await agent.run("again", message_history=capability.load())
    assert [dump(m) for m in capability.load()] == [dump(m) for m in second.all_messages()]
    assert len(second.all_messages()) > len(first.all_messages())


async def test_a_history_other_writers_stored_is_not_stored_again(guard: Guard) -> None:
    """A session written by the guard, the gateway or another adapter, loaded and passed
    to a run: only the run's own messages are appended."""
    earlier = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    guard.append("other", earlier)
    capability = CtxGuardCapability(guard, session_id="other", max_tokens=RESERVE)
    result = await Agent(TestModel(), capabilities=[capability]).run(
        "again", message_history=capability.load()
    )
    stored = [s.message for s in guard.store.read("other")]
    assert [m.text for m in stored[:2]] == ["hi", "hello"]
    assert len(stored) == len(result.all_messages())  # 2 earlier + request + response
    changed = capability.load()
    changed[0] = dataclasses.replace(changed[0], parts=[pai.UserPromptPart("hi, edited")])
    await Agent(TestModel(), capabilities=[capability]).run("more", message_history=changed)
    texts = [s.message.text for s in guard.store.read("other")]
    assert texts.count("hi") == 1 and texts.count("hi, edited") == 1  # a changed one is new


async def test_usage_is_stored_before_the_next_request(guard: Guard) -> None:
    audits: list[int] = []

    def reply(messages: list[pai.ModelMessage], info: AgentInfo) -> pai.ModelResponse:
        audits.append(len([r for r in guard.store.read_audit("live") if r["kind"] == "usage"]))
        if len(messages) == 1:
            return pai.ModelResponse(parts=[pai.ToolCallPart("lookup", {"key": "k"})])
        return pai.ModelResponse(parts=[pai.TextPart("done")])

    capability = CtxGuardCapability(guard, session_id="live", max_tokens=RESERVE)
    agent = Agent(FunctionModel(reply), capabilities=[capability])

    @agent.tool_plain
    def lookup(key: str) -> str:
        return key

    await agent.run("go")
    assert audits == [0, 1]  # the first call's usage was stored before the second call
    assert len([r for r in guard.store.read_audit("live") if r["kind"] == "usage"]) == 2


async def test_run_without_a_session_name_uses_the_conversation_id(guard: Guard) -> None:
    capability = CtxGuardCapability(guard, max_tokens=RESERVE)
    result = await Agent(TestModel(), capabilities=[capability]).run("hi")
    conversation = result.all_messages()[-1].conversation_id
    assert conversation is not None
    assert len(capability.load(conversation)) == len(result.all_messages())


async def test_a_refused_request_stores_nothing(guard: Guard) -> None:
    capability = CtxGuardCapability(guard, session_id="refused", max_tokens=RESERVE)
    agent = Agent(TestModel(), capabilities=[capability])
    await agent.run("hello")
    before = guard.store.read("refused")
    with pytest.raises(BudgetError):
        await agent.run("far too long " * 400, message_history=capability.load())
    assert guard.store.read("refused") == before


@pytest.mark.parametrize("which", ["guard", "aguard"])
async def test_a_request_refused_mid_run_stores_nothing_of_the_run(
    store_url: str, namespace: str, which: str
) -> None:
    """The run's earlier messages (its first request, the tool call the model answered)
    were stored before the next request was fitted: a refused fit left them stored,
    the tool call without its result. Now they are stored only once a request fits."""
    kind = AsyncGuard if which == "aguard" else Guard
    guard = kind(store_url, namespace=namespace, limit=LIMIT, counter="approx")

    def reply(messages: list[pai.ModelMessage], info: AgentInfo) -> pai.ModelResponse:
        if any(isinstance(p, pai.UserPromptPart) for p in messages[-1].parts):
            # a call the next request must send whole, with its result: it cannot fit
            call = pai.ToolCallPart("lookup", {"key": "far too long " * 400})
            return pai.ModelResponse(parts=[call])
        return pai.ModelResponse(parts=[pai.TextPart("done")])

    capability = CtxGuardCapability(guard, session_id="mid", max_tokens=RESERVE)
    agent = Agent(FunctionModel(reply), capabilities=[capability])

    @agent.tool_plain
    def lookup(key: str) -> str:
        return "found"

    await Agent(TestModel(), capabilities=[capability]).run("hello")  # the session exists
    before = store_diff.take(guard.store, store_url)
    with pytest.raises(BudgetError):
        await agent.run("look it up", message_history=await capability.aload())
    store_diff.assert_refused_only(before, store_diff.take(guard.store, store_url))
    await close(guard)


class FailsOnMarked:
    """The approx counter, raising on a message that says BOOM."""

    def __init__(self) -> None:
        from ctxguard.tokens import load_counter

        self.inner = load_counter("approx")
        self.fingerprint, self.exact, self.additive = "marked", False, True

    def count_message(self, message: Message) -> int:
        if "BOOM" in (message.text or ""):
            raise RuntimeError("counter broke on the reply")
        return self.inner.count_message(message)

    def request_overhead(self, *, tools: Any = None) -> int:
        return self.inner.request_overhead(tools=tools)

    def count_request(self, messages: Any, *, tools: Any = None) -> int:
        return sum(self.count_message(m) for m in messages) + self.request_overhead(tools=tools)


@pytest.mark.parametrize("which", ["guard", "aguard"])
async def test_a_reply_the_guard_refuses_stores_nothing_of_its_request(
    store_url: str, namespace: str, which: str
) -> None:
    """The request was stored, then the reply's count failed: the request stood without
    its reply. Now they go in one append, and the refusal stores neither."""
    kind = AsyncGuard if which == "aguard" else Guard
    guard = kind(store_url, namespace=namespace, limit=LIMIT, counter=FailsOnMarked())
    capability = CtxGuardCapability(guard, session_id="boom", max_tokens=RESERVE)
    await Agent(TestModel(), capabilities=[capability]).run("hello")  # the session exists

    def reply(messages: list[pai.ModelMessage], info: AgentInfo) -> pai.ModelResponse:
        return pai.ModelResponse(parts=[pai.TextPart("BOOM")])

    before = store_diff.take(guard.store, store_url)
    with pytest.raises(CtxGuardError):
        await Agent(FunctionModel(reply), capabilities=[capability]).run(
            "again", message_history=await capability.aload()
        )
    store_diff.assert_refused_only(before, store_diff.take(guard.store, store_url))
    await close(guard)


async def test_persist_false_only_fits(guard: Guard) -> None:
    capability = CtxGuardCapability(guard, session_id="nothing", persist=False, max_tokens=RESERVE)
    await Agent(TestModel(), capabilities=[capability]).run("hi")
    assert guard.store.info("nothing") is None


# -- the served limit as the context window ------------------------------------------------


def test_model_profile_is_the_served_limit(guard: Guard) -> None:
    assert model_profile(guard) == {"context_window": LIMIT}
    assert model_profile(4096) == {"context_window": 4096}
    assert model_profile(ContextLimit(1000, "test")) == {"context_window": 1000}
    served = ModelLimit("meta-llama/Llama-3.1-8B-Instruct", max_model_len=8192)
    assert model_profile(served) == {"context_window": 8192}
    model = FunctionModel(lambda m, i: pai.ModelResponse(parts=[]), profile=model_profile(guard))
    assert model.context_window == LIMIT


# -- bad input: one-line typed errors ------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [{"session_id": ""}, {"session_id": 3}, {"max_tokens": -1}, {"persist": "yes"}],
)
def test_bad_capability_arguments(guard: Guard, kwargs: dict[str, Any]) -> None:
    with pytest.raises(CtxGuardError) as info:
        CtxGuardCapability(guard, **kwargs)
    assert "\n" not in str(info.value)


def test_bad_history_and_limits(guard: Guard) -> None:
    with pytest.raises(InvalidMessageError):
        to_pieces(["not a message"])  # type: ignore[list-item]
    for history in (None, "hi", pai.ModelRequest(parts=[])):
        with pytest.raises(InvalidMessageError):
            fit_history(guard, history)  # type: ignore[arg-type]
    with pytest.raises(CtxGuardError):
        history_processor(guard, tools=[{"type": "function"}])  # type: ignore[list-item]
    with pytest.raises(CtxGuardError):
        fit_history(guard, [], instructions=3)  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        model_profile("8192")  # type: ignore[arg-type]
    with pytest.raises(CtxGuardError):
        CtxGuardCapability("not a guard")  # type: ignore[arg-type]


@pytest.mark.skipif(not hasattr(pai, "DataCapabilityPart"), reason="Pydantic AI before 2.78")
def test_capability_data_is_conversation_and_the_operators_instruction_is_pinned() -> None:
    data, rule = [p for p in REQUEST_PARTS if isinstance(p, pai.CapabilityPart)]
    [piece] = to_pieces([as_message(data)]).messages
    assert (piece.role, piece.text) == ("user", "<weather>18C in Paris</weather>")
    [piece] = to_pieces([as_message(rule)]).messages
    assert (piece.role, piece.text) == ("system", "Answer in French.")
    # an instruction from a source without operator authority reaches the user's turn
    downgraded = dataclasses.replace(rule, source=pai.UserSource())
    [piece] = to_pieces([pai.ModelRequest(parts=[downgraded], timestamp=T)]).messages
    assert piece.role == "user"
