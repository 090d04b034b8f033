"""Property: every prepared request fits, is provider-valid, keeps what must be kept.

Random conversations (tool calls, parallel calls, CJK, emoji, code, empty
content) go through the real guard turn by turn. Each prepared request is
checked against an independent full count by the same counter, against the
provider's tool-call rules, for its pinned system message, for its newest
user message and for a user turn first when older messages were left out;
or the guard raised a typed BudgetError that says why.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctxguard import BudgetError, TemplateRefusedError
from ctxguard.guard import Guard, PreparedRequest
from ctxguard.guard.policies import tool_problems
from ctxguard.tokens import load_counter
from tests.conftest import private_memory_url

from .conversations import conversation

SYSTEM = {"role": "system", "content": "You are a careful assistant. 你好。"}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Look something up",
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
        },
    }
]
COUNTER_SPECS = ["approx", "tiktoken:cl100k_base"]
_counters: dict[str, Any] = {}


def counter(spec: str) -> Any:
    if spec not in _counters:
        _counters[spec] = load_counter(spec)
    return _counters[spec]


def check(req: PreparedRequest, turn: list[dict[str, Any]], tools: Any, spec: str) -> None:
    independent = counter(spec).count_request(list(req.messages), tools=tools)
    assert req.tokens == independent
    assert req.tokens + req.reserved_output + req.safety_margin <= req.limit
    assert tool_problems(req.messages) == []
    assert req.messages[0].role == "system" and req.messages[0].content == SYSTEM["content"]
    opening = [m.role for m in req.messages if m.role != "system"][:1]
    assert opening == ["user"] or not req.dropped  # a trimmed window starts on a user turn
    newest_user = [m for m in turn if m["role"] == "user"][-1]["content"]
    assert any(m.role == "user" and m.content == newest_user for m in req.messages[-len(turn) :])


def run_conversation(
    guard: Guard, session: str, turns: list[list[dict[str, Any]]], tools: Any, spec: str
) -> int:
    guard.append(session, [SYSTEM])
    prepared = 0
    for turn in turns:
        try:
            req = guard.prepare(session, turn, tools=tools)
        except BudgetError as exc:
            assert exc.needed > exc.limit  # the error's numbers say why it cannot fit
            continue
        check(req, turn, tools, spec)
        prepared += 1
    return prepared


@pytest.mark.parametrize("spec", COUNTER_SPECS)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    turns=conversation(),
    limit=st.integers(120, 1500),
    reserve=st.integers(0, 100),
    with_tools=st.booleans(),
    window=st.one_of(st.none(), st.integers(1, 8)),
)
def test_requests_fit_and_are_valid_in_memory(
    spec: str, turns: Any, limit: int, reserve: int, with_tools: bool, window: int | None
) -> None:
    guard = Guard(
        f"memory://{uuid.uuid4().hex}",
        counter=counter(spec),
        limit=limit,
        max_tokens=reserve,
        max_window_messages=window,
    )
    run_conversation(guard, "s", turns, TOOLS if with_tools else None, spec)


@pytest.mark.redis
@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(turns=conversation(), limit=st.integers(150, 1200), with_tools=st.booleans())
def test_requests_fit_and_are_valid_on_redis(
    redis_url: str, redis_namespace: str, turns: Any, limit: int, with_tools: bool
) -> None:
    spec = "tiktoken:cl100k_base"
    guard = Guard(
        redis_url, counter=counter(spec), limit=limit, max_tokens=64, namespace=redis_namespace
    )
    try:
        run_conversation(guard, uuid.uuid4().hex, turns, TOOLS if with_tools else None, spec)
    finally:
        guard.close()


def test_history_that_fits_is_sent_whole() -> None:
    guard = Guard(
        private_memory_url(), counter="tiktoken:cl100k_base", limit=100_000, max_tokens=100
    )
    guard.append("s", [SYSTEM])
    for i in range(5):
        req = guard.prepare("s", [{"role": "user", "content": f"q{i}"}])
        guard.complete("s", {"role": "assistant", "content": f"a{i}"})
    assert len(req.messages) == 10 and req.dropped == ()


RENDERED = ["qwen-2.5", "deepseek-v3", "glm-4.7-flash", "mistral:v3-tekken"]


@pytest.fixture(scope="session")
def rendered_counters(hf_dirs: dict[str, Any]) -> dict[str, Any]:
    """Counters whose templates are not additive: the guard must render the window."""
    out = {}
    for name in RENDERED:
        spec = name if ":" in name else f"hf:{hf_dirs[name]}"
        out[name] = load_counter(spec)
    return out


@pytest.mark.parametrize("name", RENDERED)
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(turns=conversation(), limit=st.integers(300, 1500), with_tools=st.booleans())
def test_render_path_requests_fit_by_the_templates_own_count(
    rendered_counters: dict[str, Any], name: str, turns: Any, limit: int, with_tools: bool
) -> None:
    """Non-additive templates: the guard's count is the rendered prompt's length."""
    counter_ = rendered_counters[name]
    assert not counter_.additive
    tools = TOOLS if with_tools else None
    guard = Guard(f"memory://{uuid.uuid4().hex}", counter=counter_, limit=limit, max_tokens=32)
    guard.append("s", [SYSTEM])
    for turn in turns:
        try:
            req = guard.prepare("s", turn, tools=tools)
        except BudgetError as exc:
            assert exc.needed > exc.limit
            continue
        except TemplateRefusedError:
            continue  # the server would refuse this conversation too; never a guess
        assert req.tokens == counter_.count_request(list(req.messages), tools=tools)
        assert req.tokens + req.reserved_output <= req.limit
        assert tool_problems(req.messages) == []
        assert req.messages[0].content == SYSTEM["content"]
        opening = [m.role for m in req.messages if m.role != "system"][:1]
        assert opening == ["user"] or not req.dropped


@pytest.mark.redis
@settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    turns=conversation(),
    limit=st.integers(150, 900),
    window=st.one_of(st.none(), st.integers(1, 6)),
)
def test_memory_and_redis_guards_send_the_same_requests(
    redis_url: str, redis_namespace: str, turns: Any, limit: int, window: int | None
) -> None:
    """The whole stack, two backends: identical requests, token for token."""
    spec = "tiktoken:cl100k_base"
    settings_ = dict(counter=counter(spec), limit=limit, max_tokens=40, max_window_messages=window)
    in_memory = Guard(f"memory://{uuid.uuid4().hex}", **settings_)
    on_redis = Guard(redis_url, namespace=redis_namespace, **settings_)
    session = uuid.uuid4().hex
    numbered = [[{**m, "id": f"t{i}m{j}"} for j, m in enumerate(t)] for i, t in enumerate(turns)]
    try:
        for guard in (in_memory, on_redis):
            guard.append(session, [{**SYSTEM, "id": "sys"}])
        for turn in numbered:
            outcomes = []
            for guard in (in_memory, on_redis):
                try:
                    req = guard.prepare(session, turn)
                    outcomes.append(([m.id for m in req.messages], req.tokens, req.dropped))
                except BudgetError as exc:
                    outcomes.append(("budget", exc.needed, exc.limit))
            assert outcomes[0] == outcomes[1]
    finally:
        on_redis.close()
