"""openai-agents' context-aware session suite, on :class:`CtxGuardSession`.

Follows openai-agents 0.24.0 (installed): ``tests/memory/test_session_context_wrapper.py``.
Upstream's ``ContextAwareSession`` is a test double that keeps one item list per
tenant of the run context; here the session under test is ``CtxGuardSession``
(recording each call and the wrapper it got), whose scope is its session id and
tenant, not the run context (it takes ``wrapper=`` and ignores it, as the SDK
allows). So upstream's "other scope untouched" item (``keep``) lives in a second
session of the same store, and "the tenant-a scope" is the session itself.
Upstream's ``FakeModel`` is the SDK's ``ScriptedModel``. Not taken: the legacy and
partial sessions and ``_session_method_accepts_wrapper`` on plain methods, which
test the SDK's detection, not a session.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

pytest.importorskip("agents")

from agents import Agent, RunConfig, RunContextWrapper, Runner, function_tool
from agents.exceptions import InputGuardrailTripwireTriggered
from agents.guardrail import GuardrailFunctionOutput, InputGuardrail
from agents.memory import OpenAIResponsesCompactionSession
from agents.memory.session import _session_accepts_wrapper
from agents.run_internal.session_persistence import rewind_session_items
from agents.testing.model import ModelStep, ScriptedModel, assistant_message, function_call

from ctxguard.adapters.openai_agents import CtxGuardSession

KEEP = {"role": "user", "content": "keep"}
CONFIG = RunConfig(tracing_disabled=True)


@dataclass
class TenantContext:
    tenant_id: str


class Recording(CtxGuardSession):
    """CtxGuardSession that records each history call and the wrapper it was given."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.calls: list[tuple[str, Any]] = []

    async def get_items(self, limit: int | None = None, *, wrapper: Any = None) -> Any:
        self.calls.append(("get_items", wrapper))
        return await super().get_items(limit, wrapper=wrapper)

    async def add_items(self, items: list[Any], *, wrapper: Any = None) -> None:
        self.calls.append(("add_items", wrapper))
        await super().add_items(items, wrapper=wrapper)

    async def pop_item(self, *, wrapper: Any = None) -> Any:
        self.calls.append(("pop_item", wrapper))
        return await super().pop_item(wrapper=wrapper)

    async def clear_session(self, *, wrapper: Any = None) -> None:
        self.calls.append(("clear_session", wrapper))
        await super().clear_session(wrapper=wrapper)


Make = Callable[..., Recording]


@pytest.fixture
def make(any_store_url: str, namespace: str) -> Make:
    def build(session_id: str = "tenant-a", cls: type[Recording] = Recording) -> Recording:
        return cls(session_id, any_store_url, namespace=namespace)

    return build


async def other_scope(make: Make) -> Recording:
    """Upstream's "default" scope holding ``keep``: another session of the same store."""
    default = make("default")
    await default.add_items([dict(KEEP)])
    return default


def text_model(text: str) -> ScriptedModel:
    return ScriptedModel([ModelStep(output=[assistant_message(text)])])


@pytest.mark.parametrize("streamed", [False, True])
async def test_runner_passes_same_wrapper_to_context_aware_session(
    make: Make, streamed: bool
) -> None:
    session = make()
    default = await other_scope(make)
    agent = Agent(name="test", model=text_model("ok"))
    context = TenantContext(tenant_id="tenant-a")
    if streamed:
        result: Any = Runner.run_streamed(
            agent, "hello", context=context, session=session, run_config=CONFIG
        )
        async for _ in result.stream_events():
            pass
    else:
        result = await Runner.run(
            agent, "hello", context=context, session=session, run_config=CONFIG
        )
    assert result.final_output == "ok"
    assert [name for name, _ in session.calls] == ["get_items", "add_items", "add_items"]
    assert all(wrapper is result.context_wrapper for _, wrapper in session.calls)
    assert await default.get_items() == [KEEP]
    assert len(await session.get_items()) == 2


async def test_retry_rewind_uses_same_context_scope_for_reads_pops_and_cleanup(
    make: Make,
) -> None:
    session = make()
    default = await other_scope(make)
    wrapper = RunContextWrapper(context=TenantContext(tenant_id="tenant-a"))
    items: list[Any] = [
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": "hi"},
    ]
    await session.add_items(items, wrapper=wrapper)
    session.calls.clear()

    await rewind_session_items(session, items, wrapper=wrapper)

    assert await session.get_items() == []
    assert await default.get_items() == [KEEP]
    assert [name for name, _ in session.calls[:4]] == [
        "get_items",
        "pop_item",
        "pop_item",
        "get_items",
    ]
    assert all(call_wrapper is wrapper for _, call_wrapper in session.calls[:4])


class FailingSecondPop(Recording):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.pop_count = 0

    async def pop_item(self, *, wrapper: Any = None) -> Any:
        self.pop_count += 1
        if self.pop_count == 2:
            self.calls.append(("pop_item", wrapper))
            raise RuntimeError("pop failed")
        return await super().pop_item(wrapper=wrapper)


async def test_retry_rewind_restores_partial_pops_in_the_same_context_scope(
    make: Make,
) -> None:
    session = make(cls=FailingSecondPop)
    default = await other_scope(make)
    wrapper = RunContextWrapper(context=TenantContext(tenant_id="tenant-a"))
    items: list[Any] = [
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": "hi"},
    ]
    await session.add_items(list(items))
    session.calls.clear()

    await rewind_session_items(session, items, wrapper=wrapper)

    assert [name for name, _ in session.calls] == [
        "get_items",
        "pop_item",
        "pop_item",
        "add_items",
    ]
    assert all(call_wrapper is wrapper for _, call_wrapper in session.calls)
    assert await session.get_items() == items
    assert await default.get_items() == [KEEP]


@pytest.mark.parametrize("streamed", [False, True])
async def test_input_guardrail_persists_in_the_context_scope(make: Make, streamed: bool) -> None:
    def guardrail_function(
        _context: RunContextWrapper[Any], _agent: Agent[Any], _input: Any
    ) -> GuardrailFunctionOutput:
        return GuardrailFunctionOutput(output_info=None, tripwire_triggered=True)

    session = make()
    default = await other_scope(make)
    context = TenantContext(tenant_id="tenant-a")
    agent = Agent(
        name="test",
        model=text_model("not persisted"),
        input_guardrails=[InputGuardrail(guardrail_function=guardrail_function)],
    )
    with pytest.raises(InputGuardrailTripwireTriggered):
        if streamed:
            result = Runner.run_streamed(
                agent, "hello", context=context, session=session, run_config=CONFIG
            )
            async for _ in result.stream_events():
                pass
        else:
            await Runner.run(agent, "hello", context=context, session=session, run_config=CONFIG)

    assert await default.get_items() == [KEEP]
    assert await session.get_items() == [{"role": "user", "content": "hello"}]
    assert all(
        wrapper is not None and wrapper.context is context for _, wrapper in session.calls[:-1]
    )


@pytest.mark.parametrize("streamed", [False, True])
async def test_resumed_run_persists_in_the_context_scope(make: Make, streamed: bool) -> None:
    async def test_tool() -> str:
        return "tool result"

    tool = function_tool(test_tool, name_override="test_tool", needs_approval=True)
    model = ScriptedModel(
        [
            ModelStep(output=[function_call("test_tool", "{}", call_id="call-resume")]),
            ModelStep(output=[assistant_message("done")]),
        ]
    )
    agent = Agent(name="test", model=model, tools=[tool])
    session = make()
    default = await other_scope(make)
    context = TenantContext(tenant_id="tenant-a")

    if streamed:
        first: Any = Runner.run_streamed(
            agent, "hello", context=context, session=session, run_config=CONFIG
        )
        async for _ in first.stream_events():
            pass
    else:
        first = await Runner.run(
            agent, "hello", context=context, session=session, run_config=CONFIG
        )

    assert len(first.interruptions) == 1
    state = first.to_state()
    state.approve(first.interruptions[0])
    session.calls.clear()

    if streamed:
        resumed: Any = Runner.run_streamed(agent, state, session=session, run_config=CONFIG)
        async for _ in resumed.stream_events():
            pass
    else:
        resumed = await Runner.run(agent, state, session=session, run_config=CONFIG)

    assert resumed.final_output == "done"
    assert await default.get_items() == [KEEP]
    assert all(wrapper is resumed.context_wrapper for _, wrapper in session.calls)
    assert any(
        isinstance(item, dict)
        and item.get("type") == "function_call_output"
        and item.get("call_id") == "call-resume"
        for item in await session.get_items()
    )


async def test_compaction_session_keeps_context_aware_underlying_on_legacy_scope(
    make: Make,
) -> None:
    underlying = make("default")
    await underlying.add_items([{"role": "user", "content": "existing"}])
    underlying.calls.clear()
    session = OpenAIResponsesCompactionSession(
        session_id="compaction",
        underlying_session=underlying,
        should_trigger_compaction=lambda _: False,
    )
    result = await Runner.run(
        Agent(name="test", model=text_model("done")),
        "hello",
        context=TenantContext(tenant_id="tenant-a"),
        session=session,
        run_config=CONFIG,
    )
    assert result.final_output == "done"
    assert not _session_accepts_wrapper(session)
    assert len(await underlying.get_items()) == 3
    assert underlying.calls
    assert all(wrapper is None for _, wrapper in underlying.calls)


def test_session_wrapper_opt_in_requires_all_history_operations(make: Make) -> None:
    session = make()
    assert _session_accepts_wrapper(session)

    async def legacy_clear() -> None:
        pass

    session.clear_session = legacy_clear  # type: ignore[method-assign, assignment]
    assert not _session_accepts_wrapper(session)
