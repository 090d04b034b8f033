"""OpenAI Agents SDK adapter: session settings, the wrapper keyword, run_compaction."""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

import pytest

pytest.importorskip("agents")

from agents import Agent, RunConfig, Runner
from agents.memory import SessionSettings
from agents.memory.session import _session_accepts_wrapper
from agents.testing.model import ModelStep, ScriptedModel, assistant_message

from ctxguard import ConfigError, InvalidInputError, Message
from ctxguard.adapters.openai_agents import CtxGuardSession
from ctxguard.guard import AsyncGuard, Guard

from .test_openai_agents import long_items, scripted_turn, weather


def said(n: int) -> list[dict[str, Any]]:
    return [{"role": "user" if i % 2 else "assistant", "content": f"m{i}"} for i in range(n)]


async def test_settings_dict_is_coerced_and_runs(store_url: str, namespace: str) -> None:
    session = CtxGuardSession("s", store_url, namespace=namespace, session_settings={"limit": 2})
    assert session.session_settings == SessionSettings(limit=2)
    model = ScriptedModel([ModelStep(output=[assistant_message("hello")])])
    agent = Agent(name="a", model=model)
    config = RunConfig(tracing_disabled=True)
    result = await Runner.run(agent, "hi", session=session, run_config=config)
    assert result.final_output == "hello"


@pytest.mark.parametrize("bad", [{"limitt": 1}, {"limit": "x"}, 5, "limit=2"])
def test_bad_settings_are_one_line_config_errors(bad: object) -> None:
    with pytest.raises(ConfigError) as info:
        CtxGuardSession("s", session_settings=bad)
    assert "\n" not in str(info.value) and "session_settings" in str(info.value)


async def test_get_items_without_limit_uses_the_settings_limit(
    store_url: str, namespace: str
) -> None:
    session = CtxGuardSession(
        "s", store_url, namespace=namespace, session_settings=SessionSettings(limit=3)
    )
    await session.add_items(said(5))
    assert await session.get_items() == said(5)[-3:]
    assert await session.get_items(limit=1) == said(5)[-1:]  # an explicit limit wins
    assert await session.get_items(limit=10) == said(5)


def test_every_method_takes_the_wrapper_keyword() -> None:
    session = CtxGuardSession("s")
    assert _session_accepts_wrapper(session)
    for name in ("get_items", "add_items", "pop_item", "clear_session", "run_compaction"):
        parameter = inspect.signature(getattr(session, name)).parameters["wrapper"]
        assert parameter.kind is inspect.Parameter.KEYWORD_ONLY


async def test_the_runner_passes_its_wrapper(store_url: str, namespace: str) -> None:
    seen: list[str] = []

    class Spy(CtxGuardSession):
        async def get_items(self, limit: int | None = None, *, wrapper: Any = None) -> Any:
            seen.append(type(wrapper).__name__)
            return await super().get_items(limit, wrapper=wrapper)

    session = Spy("s", store_url, namespace=namespace)
    model = ScriptedModel([ModelStep(output=[assistant_message("ok")])])
    await Runner.run(
        Agent(name="a", model=model),
        "hi",
        session=session,
        run_config=RunConfig(tracing_disabled=True),
    )
    assert "RunContextWrapper" in seen


class Recorder:
    """A summarizer that remembers what it folded."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def __call__(self, previous: str | None, messages: Sequence[Message]) -> str:
        self.calls.append([m.text for m in messages])
        return f"summary of {len(messages)} messages"


async def test_run_compaction_folds_all_but_the_newest_turns(
    store_url: str, namespace: str
) -> None:
    summarizer = Recorder()
    guard = AsyncGuard(
        store_url, namespace=namespace, limit=4000, counter="approx", summarizer=summarizer
    )
    try:
        session = CtxGuardSession("s", guard, compact_keep_turns=2, compact_threshold=4)
        await session.add_items(long_items(3))  # system + 3 turns of 4 items
        await session.run_compaction()
        summary = await guard.store.get_summary("s")
        assert summary is not None and summary.covers_to == 5  # turn 0 folded, system pinned
        assert summarizer.calls[0][0].startswith("question 0")
        await session.run_compaction()  # nothing new to fold: no summarizer call
        assert len(summarizer.calls) == 1
        await session.run_compaction({"force": True})  # forced: still 2 turns kept
        assert len(summarizer.calls) == 1
        assert await session.get_items() == long_items(3)  # the raw history is whole
    finally:
        await guard.aclose()


async def test_run_compaction_waits_for_pending_tool_outputs(
    store_url: str, namespace: str
) -> None:
    summarizer = Recorder()
    guard = Guard(
        store_url, namespace=namespace, limit=4000, counter="approx", summarizer=summarizer
    )
    try:
        session = CtxGuardSession("s", guard, compact_keep_turns=1, compact_threshold=1)
        history = long_items(4)
        await session.add_items(history[:-2])  # the newest call has no output yet
        await session.run_compaction({"force": True})
        assert summarizer.calls == [] and guard.store.get_summary("s") is None
        await session.add_items(history[-2:])
        await session.run_compaction({"force": True})
        summary = guard.store.get_summary("s")
        assert summary is not None and summary.covers_to == 13  # up to the newest user turn
    finally:
        guard.close()


async def test_run_compaction_without_a_summarizer_does_nothing(aguard: AsyncGuard) -> None:
    session = CtxGuardSession("s", aguard, compact_keep_turns=1, compact_threshold=1)
    await session.add_items(long_items(3))
    await session.run_compaction({"force": True})
    assert await aguard.store.get_summary("s") is None


@pytest.mark.parametrize(
    ("args", "error"),
    [(5, InvalidInputError), ({"force": "yes"}, InvalidInputError)],
)
async def test_run_compaction_checks_its_args(args: object, error: type[Exception]) -> None:
    with pytest.raises(error):
        await CtxGuardSession("s").run_compaction(args)


@pytest.mark.parametrize("bad", [0, -1, "2", True])
def test_compaction_settings_are_checked(bad: object) -> None:
    with pytest.raises(ConfigError, match="compact_keep_turns"):
        CtxGuardSession("s", compact_keep_turns=bad)  # type: ignore[arg-type]


async def test_the_runner_compacts_after_each_turn(store_url: str, namespace: str) -> None:
    summarizer = Recorder()
    guard = AsyncGuard(
        store_url, namespace=namespace, limit=4000, counter="approx", summarizer=summarizer
    )
    try:
        model = ScriptedModel([step for i in range(6) for step in scripted_turn(i)])
        agent = Agent(name="w", instructions="Weather.", model=model, tools=[weather])
        session = CtxGuardSession("chat", guard, compact_keep_turns=2, compact_threshold=4)
        config = RunConfig(tracing_disabled=True)
        for i in range(6):
            await Runner.run(agent, f"weather in c{i}?", session=session, run_config=config)
        summary = await guard.store.get_summary("chat")
        assert summary is not None and summary.covers_to == 16  # all but the newest 2 turns
        assert len(await session.get_items()) == 6 * 4
        audit = await guard.store.read_audit("chat")
        folds = [r["covers_to"] for r in audit if r["kind"] == "summary" and r["committed"]]
        stored = await guard.store.read("chat")
        assert folds and all(stored[end].message.role == "user" for end in folds)
    finally:
        await guard.aclose()
