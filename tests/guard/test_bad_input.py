"""Bad input to the guard: a typed error that says what to do, and nothing stored."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from ctxguard import (
    BudgetError,
    ConfigError,
    Guard,
    GuardConfig,
    InvalidInputError,
    InvalidMessageError,
    MessageTooLongError,
    ModelLimit,
    ServerLimit,
    StaticLimit,
    TokenizerError,
    ToolCall,
    load_counter,
)
from ctxguard.guard.truncate import MARKER
from ctxguard.messages import Message


class Refuses:
    """A counter that cannot count one particular message (e.g. an image part)."""

    def __init__(self) -> None:
        self.inner = load_counter("approx")
        self.fingerprint, self.exact, self.additive = "refuses", False, True

    def count_message(self, message: Message) -> int:
        if "poison" in message.text:
            raise TokenizerError("this tokenizer cannot count that content")
        return self.inner.count_message(message)

    def request_overhead(self, *, tools: Any = None) -> int:
        return self.inner.request_overhead(tools=tools)

    def count_request(self, messages: Any, *, tools: Any = None) -> int:
        return self.inner.request_overhead(tools=tools) + sum(map(self.count_message, messages))


def fresh(**settings: Any) -> Guard:
    settings.setdefault("counter", "approx")
    settings.setdefault("limit", 500)
    return Guard(f"memory://{uuid.uuid4().hex}", **settings)


def test_a_batch_that_cannot_be_counted_stores_nothing() -> None:
    guard = fresh(counter=Refuses())
    batch = [{"role": "user", "content": "fine"}, {"role": "assistant", "content": "poison"}]
    with pytest.raises(TokenizerError):
        guard.append("s", batch)
    with pytest.raises(TokenizerError):
        guard.prepare("s", batch)
    assert guard.store.info("s") is None


def test_an_invalid_message_in_a_batch_stores_nothing() -> None:
    guard = fresh()
    guard.append("s", [{"role": "user", "content": "kept"}])
    with pytest.raises(InvalidMessageError, match="message 1"):
        guard.prepare("s", [{"role": "user", "content": "ok"}, {"role": "robot", "content": "x"}])
    assert [m.message.text for m in guard.store.read("s")] == ["kept"]


def test_oversized_message_is_rejected_or_truncated_visibly() -> None:
    big = "lorem ipsum dolor " * 400
    strict = fresh(max_message_tokens=100)
    with pytest.raises(MessageTooLongError) as info:
        strict.prepare("s", [{"role": "user", "content": big}])
    assert info.value.limit == 100 and info.value.needed > 100
    assert strict.store.info("s") is None

    lenient = fresh(max_message_tokens=100, oversized="truncate", limit=2000)
    req = lenient.prepare("s", [{"role": "user", "content": big}])
    stored = lenient.store.read("s")[0]
    assert stored.tokens is not None and stored.tokens <= 100
    assert MARKER.split("{n}")[0].strip() in stored.message.text
    assert stored.message.metadata["ctxguard_truncated"]["original_chars"] == len(big)
    assert req.tokens + req.reserved_output <= req.limit


def test_admission_error_carries_the_numbers() -> None:
    guard = fresh(limit=200, max_tokens=50)
    guard.append("s", [{"role": "system", "content": "rules " * 40}])
    with pytest.raises(BudgetError) as info:
        guard.prepare("s", [{"role": "user", "content": "question " * 60}])
    err = info.value
    assert err.limit == 200 and err.reserved == 50 and err.needed > err.limit
    assert "needed" in str(err) and "limit 200" in str(err)


@pytest.mark.parametrize(
    "settings",
    [
        {"max_tokens": -1},
        {"oversized": "shrug"},
        {"summary_mode": "later"},
        {"audit_mode": "never"},
        {"max_window_messages": 0},
        {"window_cache_size": -1},
        {"window_cache_bytes": "64MB"},
        {"limit": True},
        {"limit": "8k"},
        {"counter": "gpt-4"},
    ],
)
def test_bad_settings_are_config_errors(settings: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        fresh(**settings)


def test_reserving_more_than_the_limit_is_a_budget_error() -> None:
    with pytest.raises(BudgetError):
        fresh(limit=100).prepare("s", [{"role": "user", "content": "hi"}], max_tokens=100)


def test_a_store_of_the_wrong_kind_is_refused_up_front() -> None:
    from ctxguard import AsyncGuard, open_async_store, open_store

    with pytest.raises(ConfigError, match="open_store"):
        Guard(open_async_store("memory://kinds"), limit=100)
    with pytest.raises(ConfigError, match="open_async_store"):
        AsyncGuard(open_store("memory://kinds"), limit=100)


# -- issue 12, item 8: every bad input is a typed, one-line error; nothing stored -----


def _deep_tools(depth: int) -> list[dict[str, Any]]:
    value: dict[str, Any] = {}
    node = value
    for _ in range(depth):
        node["a"] = {}
        node = node["a"]
    return [value]


def _bad_calls() -> dict[str, Any]:
    msgs = [{"role": "user", "content": "hi"}]
    reply = {"role": "assistant", "content": "ok"}
    return {
        "prepare-None": lambda g: g.prepare("s", None),
        "append-None": lambda g: g.append("s", None),
        "prepare-list-session-id": lambda g: g.prepare(["x"], msgs),
        "append-int-session-id": lambda g: g.append(7, msgs),
        "tools-int": lambda g: g.prepare("s", msgs, tools=5),
        "tools-set": lambda g: g.prepare("s", msgs, tools=[{"a": {1}}]),
        "tools-2000-deep": lambda g: g.prepare("s", msgs, tools=_deep_tools(2_000)),
        "tools-nan": lambda g: g.prepare("s", msgs, tools=[{"a": float("nan")}]),
        "tools-not-dicts": lambda g: g.prepare("s", msgs, tools=["f"]),
        "max-tokens-str": lambda g: g.prepare("s", msgs, max_tokens="5"),
        "max-tokens-bool": lambda g: g.prepare("s", msgs, max_tokens=True),
        "usage-str": lambda g: g.complete("s", reply, usage="abc"),
        "usage-prompt-tokens-str": lambda g: g.complete("s", reply, usage={"prompt_tokens": "x"}),
        "usage-bytes": lambda g: g.complete("s", reply, usage={"x": b"raw"}),
        "usage-past-2**63": lambda g: g.complete("s", reply, usage={"prompt_tokens": 2**63}),
        "usage-10**400": lambda g: g.complete("s", reply, usage={"completion_tokens": 10**400}),
        "prepared-dict": lambda g: g.complete("s", reply, prepared={"turn": 1}),
        "reply-list": lambda g: g.complete("s", [reply]),
        "reply-None": lambda g: g.complete("s", None),
        "summarize-None": lambda g: g.summarize("s", None),
        "wait-timeout-str": lambda g: g.wait_for_summaries("soon"),
    }


BAD_CALLS = _bad_calls()


@pytest.mark.parametrize("case", sorted(BAD_CALLS))
def test_bad_arguments_are_one_line_typed_errors_and_store_nothing(case: str) -> None:
    guard = fresh(limit=4096, max_tokens=64)
    guard.prepare("s", [{"role": "user", "content": "before"}])
    before = (guard.store.read("s"), guard.store.read_audit("s"))
    with pytest.raises(InvalidInputError) as info:
        BAD_CALLS[case](guard)
    assert "\n" not in str(info.value)
    assert (guard.store.read("s"), guard.store.read_audit("s")) == before


def test_prepared_of_another_session_is_refused() -> None:
    guard = fresh(limit=4096, max_tokens=64)
    other = guard.prepare("a", [{"role": "user", "content": "hi"}])
    with pytest.raises(InvalidInputError, match="session 'a'"):
        guard.complete("b", {"role": "assistant", "content": "x"}, prepared=other)
    assert guard.store.info("b") is None


def test_async_guard_checks_the_same_arguments() -> None:
    import asyncio

    from ctxguard import AsyncGuard

    guard = AsyncGuard(f"memory://{uuid.uuid4().hex}", counter="approx", limit=4096)

    async def run() -> None:
        with pytest.raises(InvalidMessageError, match="got None"):
            await guard.prepare("s", None)  # type: ignore[arg-type]
        with pytest.raises(InvalidInputError, match="tools"):
            await guard.prepare("s", [], tools=5)  # type: ignore[arg-type]
        with pytest.raises(InvalidInputError, match="usage"):
            await guard.complete("s", {"role": "assistant", "content": "x"}, usage="abc")  # type: ignore[arg-type]
        with pytest.raises(InvalidInputError, match="prepared"):
            await guard.complete("s", {"role": "assistant", "content": "x"}, prepared={"turn": 1})  # type: ignore[arg-type]

    asyncio.run(run())
    assert guard.store.sync.info("s") is None  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "build",
    [
        lambda: Guard(5, limit=100),  # type: ignore[arg-type]
        lambda: Guard(limit=100, config={"max_tokens": 5}),  # type: ignore[arg-type]
        lambda: Guard(limit=100, max_tokenz=5),
        lambda: Guard(limit=100, config=GuardConfig(), max_tokens=5),
        lambda: Guard(limit=100, summary_timeout="x"),
        lambda: Guard(limit=100, summarizer=5),
        lambda: Guard(limit=100, degrade_tool_results="no"),
        lambda: Guard(limit=100, max_stored_messages=True),
        lambda: load_counter(None),  # type: ignore[arg-type]
        lambda: load_counter(5),  # type: ignore[arg-type]
        lambda: ModelLimit(5),  # type: ignore[arg-type]
        lambda: ModelLimit("llama-3.1-8b", tensor_parallel="2"),  # type: ignore[arg-type]
        lambda: ModelLimit("llama-3.1-8b", gpu_memory_gib="80"),  # type: ignore[arg-type]
        lambda: ServerLimit(5),  # type: ignore[arg-type]
        lambda: ServerLimit("http://127.0.0.1:1", timeout="x"),  # type: ignore[arg-type]
        lambda: StaticLimit(5, source=5),  # type: ignore[arg-type]
        lambda: Guard(limit=100, namespace=[[[]]] * 2),  # type: ignore[arg-type]
    ],
)
def test_bad_constructor_arguments_are_config_errors(build: Any) -> None:
    with pytest.raises(InvalidInputError) as info:
        build()
    assert "\n" not in str(info.value)


def test_tool_call_construction_errors_are_typed_and_one_line() -> None:
    with pytest.raises(InvalidMessageError) as info:
        ToolCall(id=5, function={"name": "f", "arguments": "{}"})  # type: ignore[arg-type]
    assert "\n" not in str(info.value) and "id" in str(info.value)


# -- issue 12, item 21: messages a new user meets --------------------------------------


def test_default_reserve_eating_the_limit_says_so_and_names_the_setting() -> None:
    guard = fresh(limit=1000)  # GuardConfig.max_tokens defaults to 1024
    with pytest.raises(BudgetError) as info:
        guard.prepare("s", [{"role": "user", "content": "hi"}])
    text = str(info.value)
    assert "default output reserve max_tokens=1024" in text
    assert "1000-token limit" in text and "pass max_tokens=" in text
    assert "GuardConfig.max_tokens" in text and "\n" not in text
    assert guard.store.info("s") is None


def test_an_explicit_reserve_eating_the_limit_names_the_argument() -> None:
    guard = fresh(limit=100, safety_margin=10)
    with pytest.raises(
        BudgetError, match=r"max_tokens=95 passed to prepare\(\) plus safety_margin"
    ):
        guard.prepare("s", [{"role": "user", "content": "hi"}], max_tokens=95)


def test_a_dict_where_a_list_of_messages_belongs_says_so() -> None:
    guard = fresh()
    with pytest.raises(InvalidMessageError) as info:
        guard.prepare("s", {"role": "user", "content": "hi"})  # type: ignore[arg-type]
    assert "expected a list of messages, got a dict (wrap a single message in a list)" in str(
        info.value
    )
    with pytest.raises(InvalidMessageError, match="got a dict"):
        guard.append("s", {"role": "user", "content": "hi"})  # type: ignore[arg-type]
    assert guard.store.info("s") is None


def test_a_bad_role_is_one_line_listing_the_roles() -> None:
    guard = fresh()
    with pytest.raises(InvalidMessageError) as info:
        guard.prepare("s", [{"role": "robot", "content": "x"}])
    text = str(info.value)
    assert "\n" not in text and "validation error" not in text and "pydantic" not in text
    assert "'robot'" in text and "system, developer, user, assistant, tool" in text


@pytest.mark.parametrize(
    "second",
    [
        {"role": "user", "content": "second, different"},
        {"role": "assistant", "content": "first"},
        {"role": "user", "content": "first", "name": "someone"},
        {"role": "user", "content": "first", "metadata": {"k": 1}},
    ],
)
@pytest.mark.parametrize("door", ["sync.prepare", "sync.append", "async.prepare", "async.append"])
async def test_one_id_for_two_different_messages_in_a_batch_is_refused(
    door: str, second: dict[str, Any]
) -> None:
    """(the second was dropped unseen: neither sent nor stored, no error)"""
    from ctxguard import AsyncGuard

    batch = [{"role": "user", "content": "first", "id": "d1"}, {**second, "id": "d1"}]
    url = f"memory://{uuid.uuid4().hex}"
    guard: Any = (AsyncGuard if door.startswith("async") else Guard)(
        url, counter="approx", limit=4096
    )
    call = getattr(guard, door.partition(".")[2])
    with pytest.raises(InvalidMessageError, match=r"messages 0 and 1 of the batch .* 'd1'"):
        result = call("s", batch)
        if door.startswith("async"):
            await result
    read = guard.store.read("s")
    assert (await read if door.startswith("async") else read) == []
    # the same message twice is a resend inside the batch: stored once
    same = call("s", [batch[0], dict(batch[0])])
    if door.startswith("async"):
        await same
    read = guard.store.read("s")
    stored = await read if door.startswith("async") else read
    assert [s.message.content for s in stored] == ["first"]
