"""openai-agents' session suites, on :class:`CtxGuardSession`.

Follows openai-agents 0.24.0 (installed): ``tests/memory/test_session.py``
(SQLiteSession and the Runner with a session), ``tests/memory/test_session_limit.py``
(SessionSettings limits through RunConfig) and the SDK-independent parts of
``tests/extensions/memory/test_redis_session.py`` (RedisSession). Upstream's
``FakeModel`` is the SDK's own ``agents.testing.model.ScriptedModel`` here.
Upstream's ``key_prefix`` is ctxguard's ``tenant``. Not taken: checks of
SQLite/redis-py internals (worker-thread connections, file locks, ``ping``,
``from_url``, TTL commands), the run without a session and
``SessionSettings.resolve``, which test the SDK, not a session.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable
from typing import Any

import pytest

pytest.importorskip("agents")

from agents import Agent, RunConfig, Runner
from agents.memory import SessionSettings
from agents.testing.model import ModelStep, ScriptedModel, assistant_message

from ctxguard.adapters.openai_agents import CtxGuardSession

RUNNERS = ["run", "run_sync", "run_streamed"]
MakeSession = Callable[..., CtxGuardSession]


@pytest.fixture
def make_session(any_store_url: str, namespace: str) -> MakeSession:
    """Sessions of one store, as upstream's ``SQLiteSession(session_id, db_path)``."""

    def make(session_id: str, **kw: Any) -> CtxGuardSession:
        return CtxGuardSession(session_id, any_store_url, namespace=namespace, **kw)

    return make


def _blocking_run(agent: Agent[Any], given: Any, kw: dict[str, Any]) -> Any:
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        return Runner.run_sync(agent, given, **kw)
    finally:
        loop.close()


async def turn(method: str, given: Any, reply: str, **kw: Any) -> tuple[Any, list[Any]]:
    """One run with a model that answers ``reply``: (result, the input the model got)."""
    model = ScriptedModel([ModelStep(output=[assistant_message(reply)])])
    agent: Agent[Any] = Agent(name="test", model=model)
    kw.setdefault("run_config", RunConfig(tracing_disabled=True))
    if method == "run":
        result = await Runner.run(agent, given, **kw)
    elif method == "run_sync":
        result = await asyncio.to_thread(_blocking_run, agent, given, kw)
    else:
        result = Runner.run_streamed(agent, given, **kw)
        async for _ in result.stream_events():
            pass
    return result, list(model.calls[-1].input)


def limited(limit: int | None) -> RunConfig:
    return RunConfig(tracing_disabled=True, session_settings=SessionSettings(limit=limit))


def contents(items: list[Any]) -> list[Any]:
    return [item.get("content") for item in items]


# -- tests/memory/test_session.py --------------------------------------------------


@pytest.mark.parametrize("method", RUNNERS)
async def test_basic_functionality(make_session: MakeSession, method: str) -> None:
    session = make_session("test_session_123")
    first, _ = await turn(
        method, "What city is the Golden Gate Bridge in?", "San Francisco", session=session
    )
    assert first.final_output == "San Francisco"
    second, seen = await turn(method, "What state is it in?", "California", session=session)
    assert second.final_output == "California"
    assert len(seen) > 1


@pytest.mark.parametrize("method", RUNNERS)
async def test_with_explicit_instance(make_session: MakeSession, method: str) -> None:
    session = make_session("test_session_456")
    first, _ = await turn(method, "Hi there", "Hello", session=session)
    assert first.final_output == "Hello"
    second, _ = await turn(
        method, "Do you remember what I said?", "I remember you said hi", session=session
    )
    assert second.final_output == "I remember you said hi"


@pytest.mark.parametrize("method", RUNNERS)
async def test_different_sessions(make_session: MakeSession, method: str) -> None:
    one, two = make_session("session_1"), make_session("session_2")
    assert (await turn(method, "I like cats", "I like cats", session=one))[
        0
    ].final_output == "I like cats"
    assert (await turn(method, "I like dogs", "I like dogs", session=two))[
        0
    ].final_output == "I like dogs"
    third, seen = await turn(
        method, "What did I say I like?", "Yes, you mentioned cats", session=one
    )
    assert third.final_output == "Yes, you mentioned cats"
    assert "I like dogs" not in contents(seen)


async def test_direct(make_session: MakeSession) -> None:
    session = make_session("direct_test")
    await session.add_items(
        [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi there!"}]
    )
    got = await session.get_items()
    assert len(got) == 2
    assert (got[0].get("role"), got[0].get("content")) == ("user", "Hello")
    assert (got[1].get("role"), got[1].get("content")) == ("assistant", "Hi there!")
    await session.clear_session()
    assert len(await session.get_items()) == 0


async def test_pop_item(make_session: MakeSession) -> None:
    session = make_session("pop_test")
    assert await session.pop_item() is None
    said = [("user", "Hello"), ("assistant", "Hi there!"), ("user", "How are you?")]
    await session.add_items([{"role": r, "content": c} for r, c in said])
    assert len(await session.get_items()) == 3
    popped = await session.pop_item()
    assert popped is not None and (popped.get("role"), popped.get("content")) == said[2]
    left = await session.get_items()
    assert len(left) == 2 and left[-1].get("content") == "Hi there!"
    for role, content in reversed(said[:2]):
        popped = await session.pop_item()
        assert popped is not None and (popped.get("role"), popped.get("content")) == (role, content)
    assert await session.pop_item() is None
    assert len(await session.get_items()) == 0


async def test_pop_different_sessions(make_session: MakeSession) -> None:
    one, two = make_session("session_1"), make_session("session_2")
    await one.add_items([{"role": "user", "content": "Session 1 message"}])
    await two.add_items(
        [
            {"role": "user", "content": "Session 2 message 1"},
            {"role": "user", "content": "Session 2 message 2"},
        ]
    )
    popped = await two.pop_item()
    assert popped is not None and popped.get("content") == "Session 2 message 2"
    assert contents(await one.get_items()) == ["Session 1 message"]
    assert contents(await two.get_items()) == ["Session 2 message 1"]


async def test_get_items_with_limit(make_session: MakeSession) -> None:
    session = make_session("count_test")
    texts = ["Message 1", "Response 1", "Message 2", "Response 2", "Message 3", "Response 3"]
    await session.add_items(
        [{"role": "user" if i % 2 == 0 else "assistant", "content": t} for i, t in enumerate(texts)]
    )
    every = await session.get_items()
    assert (
        len(every) == 6
        and every[0].get("content") == "Message 1"
        and every[-1].get("content") == "Response 3"
    )
    assert contents(await session.get_items(limit=2)) == texts[-2:]
    assert contents(await session.get_items(limit=4)) == texts[-4:]
    ten = await session.get_items(limit=10)
    assert (
        len(ten) == 6
        and ten[0].get("content") == "Message 1"
        and ten[-1].get("content") == "Response 3"
    )
    assert len(await session.get_items(limit=0)) == 0


@pytest.mark.parametrize("method", RUNNERS)
async def test_list_input_is_appended(make_session: MakeSession, method: str) -> None:
    session = make_session("test_validation_parametrized")
    history = [
        {"role": "user", "content": "Earlier message"},
        {"role": "assistant", "content": "Saved reply"},
    ]
    await session.add_items(history)
    given = [{"role": "user", "content": "Test message"}]
    _, seen = await turn(method, given, "This should run", session=session)
    assert seen == history + given


@pytest.mark.parametrize("method", RUNNERS)
async def test_session_input_callback(make_session: MakeSession, method: str) -> None:
    session = make_session("session_1")
    history = [
        {"role": "user", "content": "Hello there."},
        {"role": "assistant", "content": "Hi, I'm here to assist you."},
    ]
    await session.add_items(history)

    def only_user(past: list[Any], new: list[Any]) -> list[Any]:
        return [item for item in past if item["role"] == "user"] + new

    given = [{"role": "user", "content": "What your name?"}]
    config = RunConfig(tracing_disabled=True, session_input_callback=only_user)
    _, seen = await turn(method, given, "I'm gpt-4o", session=session, run_config=config)
    assert len(seen) == 2
    assert seen == [history[0], given[0]]


async def test_unicode_content(make_session: MakeSession) -> None:
    session = make_session("unicode_test")
    texts = ["こんにちは", "😊👍", "Привет"]
    await session.add_items(
        [{"role": "user" if i != 1 else "assistant", "content": t} for i, t in enumerate(texts)]
    )
    assert contents(await session.get_items()) == texts


async def test_special_characters_and_injection(make_session: MakeSession) -> None:
    session = make_session("special_chars_test")
    texts = [
        "O'Reilly",
        "DROP TABLE sessions;",
        '"SELECT * FROM users WHERE name = "admin";"',
        "Robert'); DROP TABLE students;--",
        "Normal message",
    ]
    await session.add_items(
        [{"role": "user" if i % 2 == 0 else "assistant", "content": t} for i, t in enumerate(texts)]
    )
    got = await session.get_items()
    assert len(got) == len(texts) and contents(got) == texts


async def test_concurrent_access(make_session: MakeSession) -> None:
    session = make_session("concurrent_test")

    def add(n: int) -> None:  # each thread runs its own event loop, as upstream's test does
        asyncio.run(session.add_items([{"role": "user", "content": f"Message {n}"}]))

    with concurrent.futures.ThreadPoolExecutor(max_workers=5) as pool:
        list(pool.map(add, range(10)))
    got = {c for c in contents(await session.get_items()) if isinstance(c, str)}
    assert got == {f"Message {i}" for i in range(10)}


async def test_add_items_error_reaches_a_streamed_run(make_session: MakeSession) -> None:
    session = make_session("test_exception_session")

    async def failing(items: Any, *, wrapper: Any = None) -> None:
        raise RuntimeError("Simulated session.add_items failure")

    session.add_items = failing  # type: ignore[method-assign]
    model = ScriptedModel([ModelStep(output=[assistant_message("This should not be reached")])])
    result = Runner.run_streamed(
        Agent(name="test", model=model),
        "Hello",
        session=session,
        run_config=RunConfig(tracing_disabled=True),
    )

    async def drain() -> None:
        async for _ in result.stream_events():
            pass

    with pytest.raises(RuntimeError, match=r"Simulated session\.add_items failure"):
        await asyncio.wait_for(drain(), timeout=30.0)  # a hang fails; never a timing check


async def test_settings_default(make_session: MakeSession) -> None:
    session = make_session("default_settings_test")
    assert isinstance(session.session_settings, SessionSettings)
    assert session.session_settings.limit is None


async def test_settings_constructor(make_session: MakeSession) -> None:
    session = make_session("constructor_settings_test", session_settings=SessionSettings(limit=5))
    assert session.session_settings is not None and session.session_settings.limit == 5


async def test_get_items_uses_settings_limit(make_session: MakeSession) -> None:
    session = make_session("uses_settings_limit_test", session_settings=SessionSettings(limit=3))
    await session.add_items([{"role": "user", "content": f"Message {i}"} for i in range(5)])
    assert contents(await session.get_items()) == ["Message 2", "Message 3", "Message 4"]


async def test_explicit_limit_overrides_settings(make_session: MakeSession) -> None:
    session = make_session("explicit_override_test", session_settings=SessionSettings(limit=5))
    await session.add_items([{"role": "user", "content": f"Message {i}"} for i in range(10)])
    assert contents(await session.get_items(limit=2)) == ["Message 8", "Message 9"]


async def test_runner_settings_override(make_session: MakeSession) -> None:
    session = make_session("runner_override_test", session_settings=SessionSettings(limit=100))
    await session.add_items([{"role": "user", "content": f"Turn {i}"} for i in range(10)])
    _, seen = await turn("run", "New question", "Got it", session=session, run_config=limited(2))
    assert len([i for i in seen if i.get("content") != "New question"]) == 2


# -- tests/memory/test_session_limit.py -------------------------------------------


async def _history(method: str, session: CtxGuardSession, turns: int) -> None:
    for i in range(1, turns + 1):
        await turn(method, f"Message {i}", f"Reply {i}", session=session)


@pytest.mark.parametrize("method", RUNNERS)
async def test_limit_parameter(make_session: MakeSession, method: str) -> None:
    session = make_session("limit_test")
    await _history(method, session, 3)
    assert len(await session.get_items()) == 6
    _, seen = await turn(method, "Message 4", "Reply 4", session=session, run_config=limited(2))
    assert len(seen) == 3
    assert seen[0].get("content") == "Message 3"
    assert seen[1].get("content")[0]["text"] == "Reply 3"
    assert seen[2].get("content") == "Message 4"


@pytest.mark.parametrize("method", RUNNERS)
async def test_limit_zero(make_session: MakeSession, method: str) -> None:
    session = make_session("limit_zero_test")
    await _history(method, session, 2)
    _, seen = await turn(method, "Message 3", "Reply 3", session=session, run_config=limited(0))
    assert len(seen) == 1 and seen[0].get("content") == "Message 3"


@pytest.mark.parametrize("method", RUNNERS)
async def test_limit_none_gets_all_history(make_session: MakeSession, method: str) -> None:
    session = make_session("limit_none_test")
    await _history(method, session, 5)
    assert len(await session.get_items()) == 10
    _, seen = await turn(method, "Message 6", "Reply 6", session=session, run_config=limited(None))
    assert len(seen) == 11
    assert seen[0].get("content") == "Message 1" and seen[-1].get("content") == "Message 6"


@pytest.mark.parametrize("method", RUNNERS)
async def test_limit_larger_than_history(make_session: MakeSession, method: str) -> None:
    session = make_session("limit_large_test")
    await _history(method, session, 1)
    _, seen = await turn(method, "Message 2", "Reply 2", session=session, run_config=limited(100))
    assert len(seen) == 3
    assert seen[0].get("content") == "Message 1"
    assert seen[1].get("content")[0]["text"] == "Reply 1"
    assert seen[2].get("content") == "Message 2"


async def test_negative_limit_returns_empty(make_session: MakeSession) -> None:
    session = make_session("limit_negative_test")
    await session.add_items(
        [{"role": "user", "content": "1"}, {"role": "assistant", "content": "2"}]
    )
    assert await session.get_items(limit=-1) == []
    assert await session.get_items(limit=0) == []
    assert len(await session.get_items(limit=1)) == 1
    assert len(await session.get_items()) == 2


# -- tests/extensions/memory/test_redis_session.py --------------------------------


async def test_redis_direct_ops(make_session: MakeSession) -> None:
    session = make_session("test_session_direct")
    await session.add_items(
        [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi there!"}]
    )
    assert contents(await session.get_items()) == ["Hello", "Hi there!"]
    popped = await session.pop_item()
    assert popped is not None and popped.get("content") == "Hi there!"
    assert contents(await session.get_items()) == ["Hello"]
    await session.clear_session()
    assert len(await session.get_items()) == 0


async def test_redis_runner_integration(make_session: MakeSession) -> None:
    session = make_session("test_session_runner")
    first, _ = await turn(
        "run", "What city is the Golden Gate Bridge in?", "San Francisco", session=session
    )
    assert first.final_output == "San Francisco"
    second, seen = await turn("run", "What state is it in?", "California", session=session)
    assert second.final_output == "California"
    assert len(seen) > 1
    assert any("Golden Gate Bridge" in str(item.get("content", "")) for item in seen)


async def test_redis_session_isolation(make_session: MakeSession) -> None:
    one, two = make_session("session_1"), make_session("session_2")
    await turn("run", "I like cats.", "I like cats.", session=one)
    await turn("run", "I like dogs.", "I like dogs.", session=two)
    result, _ = await turn(
        "run", "What animal did I say I like?", "You said you like cats.", session=one
    )
    assert "cats" in result.final_output.lower() and "dogs" not in result.final_output.lower()


async def test_redis_get_items_with_limit(make_session: MakeSession) -> None:
    session = make_session("test_session_limit")
    await session.add_items(
        [{"role": "user" if i % 2 else "assistant", "content": str(i)} for i in range(1, 5)]
    )
    assert contents(await session.get_items(limit=2)) == ["3", "4"]
    assert len(await session.get_items()) == 4
    assert len(await session.get_items(limit=10)) == 4
    assert len(await session.get_items(limit=0)) == 0


async def test_redis_pop_from_empty_session(make_session: MakeSession) -> None:
    session = make_session("empty_session")
    await session.clear_session()
    assert await session.pop_item() is None


async def test_redis_add_empty_items_list(make_session: MakeSession) -> None:
    session = make_session("test_session_empty")
    assert len(await session.get_items()) == 0
    await session.add_items([])
    assert len(await session.get_items()) == 0


@pytest.mark.parametrize(
    "texts",
    [
        [
            "O'Reilly",
            '{"nested": "json"}',
            'Quote: "Hello world"',
            "Line1\nLine2\tTabbed",
            "Normal message",
        ],
        [
            "O'Reilly",
            "DROP TABLE sessions;",
            '"SELECT * FROM users WHERE name = "admin";"',
            "Robert'); DROP TABLE students;--",
            '{"malicious": "json"}',
            "\\n\\t\\r Special escapes",
            "Normal message",
        ],
    ],
    ids=["json-safety", "problematic-strings"],
)
async def test_redis_strings_are_kept_exactly(make_session: MakeSession, texts: list[str]) -> None:
    session = make_session("test_session_strings")
    await session.add_items(
        [{"role": "user" if i % 2 == 0 else "assistant", "content": t} for i, t in enumerate(texts)]
    )
    got = await session.get_items()
    assert len(got) == len(texts) and contents(got) == texts


async def test_redis_concurrent_gather(make_session: MakeSession) -> None:
    session = make_session("concurrent_test")

    async def add(start: int) -> None:
        await session.add_items(
            [{"role": "user", "content": f"Message {start + i}"} for i in range(5)]
        )

    await asyncio.gather(add(0), add(5), add(10))
    got = contents(await session.get_items())
    assert len(got) == 15
    for n in range(15):
        assert f"Message {n}" in got


async def test_redis_key_prefix_isolation(any_store_url: str, namespace: str) -> None:
    # upstream's key_prefix is ctxguard's tenant (the key prefix under the namespace)
    one = CtxGuardSession("same_id", any_store_url, namespace=namespace, tenant="app1")
    two = CtxGuardSession("same_id", any_store_url, namespace=namespace, tenant="app2")
    await one.add_items([{"role": "user", "content": "app1 message"}])
    await two.add_items([{"role": "user", "content": "app2 message"}])
    assert contents(await one.get_items()) == ["app1 message"]
    assert contents(await two.get_items()) == ["app2 message"]
