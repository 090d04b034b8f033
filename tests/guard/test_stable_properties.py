"""Property: the stable policy keeps every invariant, and between two cuts each request's
token ids extend the previous request's (through cl100k ids and the Qwen3 template).

Random conversations (tool calls, CJK, emoji, empty content) go through the real
guard turn by turn with ``window_policy="stable"``; each request is checked as in
test_properties (fits by an independent count, provider-valid, pinned system first,
newest user message sent), then against the previous one: while the window start
and the summary are unchanged, the previous prompt's ids are a strict prefix of
this prompt's ids; when they change, the window starts at a user message.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctxguard import BudgetError, TemplateRefusedError
from ctxguard.guard import Guard, PreparedRequest
from ctxguard.guard.replay import (
    ReplayOverrides,
    core_for_record,
    replay_turn,
    summaries_from_audit,
)
from ctxguard.tokens import load_counter
from ctxguard.tokens.prompt_ids import prompt_ids

from .conversations import conversation
from .test_properties import SYSTEM, TOOLS, check, counter

LOW_WATER = st.one_of(st.integers(0, 400), st.floats(0.05, 0.95))


def start_of(req: PreparedRequest) -> tuple[Any, int]:
    found = [d for d in req.decisions if d["policy"] == "stable"]
    assert len(found) == 1
    return found[0]["first_seq"], req.summary_version


def run_stable(
    guard: Guard, turns: list[list[dict[str, Any]]], tools: Any, counter_: Any, spec: str | None
) -> list[PreparedRequest]:
    guard.append("s", [SYSTEM])
    previous: tuple[tuple[Any, int], list[int]] | None = None
    sent = []
    for turn in turns:
        try:
            req = guard.prepare("s", turn, tools=tools)
        except BudgetError as exc:
            assert exc.needed > exc.limit
            continue
        except TemplateRefusedError:
            continue
        if spec is not None:
            check(req, turn, tools, spec)
        else:
            assert req.tokens == counter_.count_request(list(req.messages), tools=tools)
            assert req.tokens + req.reserved_output <= req.limit
            assert req.messages[0].content == SYSTEM["content"]
        ids = prompt_ids(counter_, list(req.messages), tools)
        assert ids is not None and len(ids) == req.tokens
        where = start_of(req)
        if previous is not None and previous[0] == where:
            assert len(ids) > len(previous[1]) and ids[: len(previous[1])] == previous[1]
        elif req.dropped:
            # a window that leaves messages out (a cut) opens on a user turn; one that
            # starts at the history's first message opens with whatever was stored first
            # (seq 0 is the system message, so ``first_seq != 0`` said nothing)
            body = [m for m in req.messages if m.role != "system"]
            assert body[0].role == "user"
        previous = (where, ids)
        sent.append(req)
    return sent


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    turns=conversation(),
    limit=st.integers(120, 1500),
    reserve=st.integers(0, 100),
    low=LOW_WATER,
    with_tools=st.booleans(),
    window=st.one_of(st.none(), st.integers(1, 8)),
)
def test_stable_requests_keep_the_invariants_and_the_prefix_cl100k(
    turns: Any, limit: int, reserve: int, low: Any, with_tools: bool, window: int | None
) -> None:
    spec = "tiktoken:cl100k_base"
    guard = Guard(
        f"memory://{uuid.uuid4().hex}",
        counter=counter(spec),
        limit=limit,
        max_tokens=reserve,
        max_window_messages=window,
        window_policy="stable",
        low_water=low,
    )
    run_stable(guard, turns, TOOLS if with_tools else None, counter(spec), spec)


@pytest.fixture(scope="session")
def qwen3(hf_dirs: dict[str, Any]) -> Any:
    return load_counter(f"hf:{hf_dirs['qwen-3']}")


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(turns=conversation(), limit=st.integers(300, 1500), low=LOW_WATER)
def test_stable_requests_keep_the_prefix_through_the_qwen3_template(
    qwen3: Any, turns: Any, limit: int, low: Any
) -> None:
    guard = Guard(
        f"memory://{uuid.uuid4().hex}",
        counter=qwen3,
        limit=limit,
        max_tokens=32,
        window_policy="stable",
        low_water=low,
    )
    run_stable(guard, turns, None, qwen3, None)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(turns=conversation(), limit=st.integers(150, 900), low=LOW_WATER)
def test_a_cold_guard_and_a_replay_decide_the_same_stable_windows(
    turns: Any, limit: int, low: Any
) -> None:
    """The cut point is derived from history + budget: no cache, no recorded state needed."""
    spec = "tiktoken:cl100k_base"
    url = f"memory://{uuid.uuid4().hex}"
    common = dict(counter=counter(spec), limit=limit, max_tokens=40, low_water=low)
    warm = Guard(url, window_policy="stable", **common)
    cold = Guard(
        f"memory://{uuid.uuid4().hex}", window_policy="stable", window_cache_size=0, **common
    )
    numbered = [[{**m, "id": f"t{i}m{j}"} for j, m in enumerate(t)] for i, t in enumerate(turns)]
    warm.append("s", [{**SYSTEM, "id": "sys"}])
    cold.append("s", [{**SYSTEM, "id": "sys"}])
    for turn in numbered:
        outcomes: list[Any] = []
        for guard in (warm, cold):
            try:
                req = guard.prepare("s", turn)
                outcomes.append(([m.id for m in req.messages], req.tokens))
            except BudgetError as exc:
                outcomes.append(("budget", exc.needed))
        assert outcomes[0] == outcomes[1]
    history = warm.store.read("s")
    audit = warm.store.read_audit("s")
    summaries = summaries_from_audit(audit)
    for record in (r for r in audit if r["kind"] == "request"):
        assert record["policy"]["window_policy"] == "stable"
        core = core_for_record(counter(spec), record, ReplayOverrides())  # the CLI's path
        summary = summaries.get(int(record.get("summary_version") or 0))
        replayed = replay_turn(core, history, record, summary, ReplayOverrides())
        assert replayed.same, (replayed.recorded_ids, replayed.replayed_ids)


@pytest.mark.redis
@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(turns=conversation(), limit=st.integers(150, 900), low=LOW_WATER)
def test_memory_and_redis_guards_send_the_same_stable_requests(
    redis_url: str, redis_namespace: str, turns: Any, limit: int, low: Any
) -> None:
    spec = "tiktoken:cl100k_base"
    common = dict(
        counter=counter(spec), limit=limit, max_tokens=40, window_policy="stable", low_water=low
    )
    in_memory = Guard(f"memory://{uuid.uuid4().hex}", **common)
    on_redis = Guard(redis_url, namespace=redis_namespace, **common)
    session = uuid.uuid4().hex
    numbered = [[{**m, "id": f"t{i}m{j}"} for j, m in enumerate(t)] for i, t in enumerate(turns)]
    try:
        for guard in (in_memory, on_redis):
            guard.append(session, [{**SYSTEM, "id": "sys"}])
        for turn in numbered:
            outcomes: list[Any] = []
            for guard in (in_memory, on_redis):
                try:
                    req = guard.prepare(session, turn)
                    outcomes.append(([m.id for m in req.messages], req.tokens))
                except BudgetError as exc:
                    outcomes.append(("budget", exc.needed))
            assert outcomes[0] == outcomes[1]
    finally:
        on_redis.close()
