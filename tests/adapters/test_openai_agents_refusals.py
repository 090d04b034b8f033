"""A request the guard refuses stores nothing, through the Agents SDK's real Runner.

The Runner stores a run's input (``add_items``) before its first model call (the
streamed Runner after it) and each turn's items before the next call, so the
session's ``model_input_filter`` refusing a request (BudgetError) found them stored.
The session takes back what the run stored (one ``store.retract``): the store is as
before the run but for that ``retract`` audit record (tests/store_diff.py).
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("agents")

from agents import Agent, RunConfig, Runner, function_tool
from agents.testing.model import ModelStep, ScriptedModel, assistant_message, function_call

from ctxguard.adapters.openai_agents import CtxGuardSession
from ctxguard.errors import BudgetError
from tests import store_diff

from .conftest import LIMIT, RESERVE

BIG = "every word here counts " * 200  # far past LIMIT on its own


@function_tool
def lookup(city: str) -> str:
    """What is known about a city."""
    return f"{city[:20]}: mild"


def agent_for(steps: list[ModelStep]) -> tuple[Agent[Any], ScriptedModel]:
    model = ScriptedModel(steps)
    return Agent(name="a", instructions="Answer briefly.", model=model, tools=[lookup]), model


async def run(agent: Agent[Any], prompt: str, session: CtxGuardSession, streamed: bool) -> None:
    config = RunConfig(
        call_model_input_filter=session.model_input_filter(max_tokens=RESERVE),
        tracing_disabled=True,
    )
    if streamed:
        result = Runner.run_streamed(agent, prompt, session=session, run_config=config)
        async for _ in result.stream_events():
            pass
    else:
        await Runner.run(agent, prompt, session=session, run_config=config)


def turn(n: int, city: str) -> list[ModelStep]:
    call = function_call("lookup", {"city": city}, call_id=f"c{n}", item_id=f"fc{n}")
    return [ModelStep(output=[call]), ModelStep(output=[assistant_message(f"ok {n}")])]


def snapshot(session: CtxGuardSession, url: str) -> store_diff.Snapshot:
    return store_diff.take(session.ref.sync().store, url)


async def seed(session: CtxGuardSession, streamed: bool) -> None:
    """One whole run stored, whose items no later run's refusal may take back."""
    agent, model = agent_for(turn(0, "Lima"))
    await run(agent, "first question", session, streamed)
    model.assert_complete()
    assert len(await session.get_items()) == 4


@pytest.mark.parametrize("streamed", [False, True], ids=["run", "streamed"])
async def test_an_input_that_cannot_fit_stores_nothing(
    store_url: str, namespace: str, streamed: bool
) -> None:
    session = CtxGuardSession("s", store_url, namespace=namespace, limit=LIMIT)
    await seed(session, streamed)
    before = snapshot(session, store_url)
    agent, model = agent_for(turn(1, "Oslo"))
    with pytest.raises(BudgetError):
        await run(agent, BIG, session, streamed)
    assert not model.calls  # refused before the model was called
    after = snapshot(session, store_url)
    if streamed:  # (the streamed Runner stores the input after the first request fits)
        store_diff.assert_refused_only(before, after)
    else:
        store_diff.assert_taken_back(before, after)
    assert [i.get("content") for i in await session.get_items() if i.get("role") == "user"] == [
        "first question"
    ]
    await session.close()


@pytest.mark.parametrize("streamed", [False, True], ids=["run", "streamed"])
async def test_a_request_refused_mid_run_stores_nothing_of_the_run(
    store_url: str, namespace: str, streamed: bool
) -> None:
    session = CtxGuardSession("s", store_url, namespace=namespace, limit=LIMIT)
    await seed(session, streamed)
    before = snapshot(session, store_url)
    agent, model = agent_for(turn(1, BIG))  # the call (its arguments) cannot fit the next request
    with pytest.raises(BudgetError):
        await run(agent, "second question", session, streamed)
    assert len(model.calls) == 1  # the first call fitted and was answered
    store_diff.assert_taken_back(before, snapshot(session, store_url))
    assert len(await session.get_items()) == 4
    await session.close()


async def test_the_next_run_after_a_refusal_stores_its_items(
    store_url: str, namespace: str
) -> None:
    session = CtxGuardSession("s", store_url, namespace=namespace, limit=LIMIT)
    await seed(session, streamed=False)
    agent, _ = agent_for(turn(1, "Oslo"))
    with pytest.raises(BudgetError):
        await run(agent, BIG, session, streamed=False)
    agent, model = agent_for(turn(2, "Oslo"))
    await run(agent, "third question", session, streamed=False)
    model.assert_complete()
    items = await session.get_items()
    assert [i.get("content") for i in items if i.get("role") == "user"] == [
        "first question",
        "third question",
    ]
    assert len(items) == 8
    await session.close()


async def test_another_write_after_the_run_s_is_never_taken_back(
    store_url: str, namespace: str
) -> None:
    """The take-back checks the session is as the run left it: a write between (another
    process's) leaves everything stored, the refusal raised as is."""
    session = CtxGuardSession("s", store_url, namespace=namespace, limit=LIMIT)
    other = CtxGuardSession("s", store_url, namespace=namespace, limit=LIMIT)
    await seed(session, streamed=False)
    agent, _ = agent_for(turn(1, "Oslo"))
    sent = session.model_input_filter(max_tokens=RESERVE)

    async def meanwhile(data: Any) -> Any:
        await other.add_items([{"role": "user", "content": "from elsewhere"}])
        return await sent(data)

    config = RunConfig(call_model_input_filter=meanwhile, tracing_disabled=True)
    with pytest.raises(BudgetError):
        await Runner.run(agent, BIG, session=session, run_config=config)
    users = [i.get("content") for i in await session.get_items() if i.get("role") == "user"]
    assert users == ["first question", BIG, "from elsewhere"]
    await session.close()
    await other.close()


async def test_a_concurrent_run_s_items_are_never_taken_back(
    store_url: str, namespace: str
) -> None:
    """Another run on the same session object (its own wrapper) stores its input while a
    request of this run is being fitted: the refusal takes back none of it."""
    session = CtxGuardSession("s", store_url, namespace=namespace, limit=LIMIT)
    await seed(session, streamed=False)
    agent, _ = agent_for(turn(1, "Oslo"))
    sent = session.model_input_filter(max_tokens=RESERVE)

    async def meanwhile(data: Any) -> Any:
        other_run = object()
        await session.get_items(wrapper=other_run)
        await session.add_items([{"role": "user", "content": "other run"}], wrapper=other_run)
        return await sent(data)

    config = RunConfig(call_model_input_filter=meanwhile, tracing_disabled=True)
    with pytest.raises(BudgetError):
        await Runner.run(agent, BIG, session=session, run_config=config)
    users = [i.get("content") for i in await session.get_items() if i.get("role") == "user"]
    assert users == ["first question", BIG, "other run"]
    await session.close()
