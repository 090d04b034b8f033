"""Every public class copies and pickles whole, or refuses with ``NotCopyableError``.

Table-driven over ``ctxguard.__all__``: a class added to the public door without a row
here fails ``test_every_public_class_has_a_row``. A value (messages, configs, limits,
a prepared request, an event, every error) comes back from ``copy.copy``,
``copy.deepcopy`` and a pickle round trip equal to the original (errors: same type,
message and attributes, so they cross a process pool). What holds connections (a
guard, a store) refuses all three with one typed line saying what to do, never Python's
bare ``TypeError: cannot pickle '_thread.lock' object``.
"""

from __future__ import annotations

import copy
import inspect
import logging
import pickle
from collections.abc import Callable
from typing import Any

import pytest
from conftest import private_memory_url

import ctxguard
from ctxguard import (
    AsyncGuard,
    BudgetError,
    ContextLimit,
    CorruptRecordError,
    CtxGuardError,
    ExtractiveSummarizer,
    Guard,
    GuardClosedError,
    GuardConfig,
    Message,
    MessageIdReusedError,
    MissingDependencyError,
    ModelLimit,
    NotCopyableError,
    OpenAISummarizer,
    OperationEvent,
    OutputReserveError,
    PreparedRequest,
    ServerBusyError,
    ServerLimit,
    SessionFullError,
    StaticLimit,
    StoreConnectionError,
    TenantBudgetError,
    ToolCall,
    load_counter,
    open_async_store,
    open_store,
)
from ctxguard.observe import background, fan_out
from ctxguard.observe.tenant_budget import TenantBudget

SECRET = "hunter2-secret"
COPIES: dict[str, Callable[[Any], Any]] = {
    "copy": copy.copy,
    "deepcopy": copy.deepcopy,
    "pickle": lambda o: pickle.loads(pickle.dumps(o)),
}
ASK = [Message(role="user", content="how many tokens is this?")]


def _guard() -> Guard:
    return Guard(private_memory_url(), counter="approx", limit=4096)


def _prepared() -> PreparedRequest:
    return _guard().prepare("s", ASK, max_tokens=64)


def _event() -> OperationEvent:
    seen: list[OperationEvent] = []
    Guard(private_memory_url(), counter="approx", limit=4096, observer=seen.append).prepare(
        "s", ASK, max_tokens=64
    )
    return seen[-1]


def _same_fields(a: Any, b: Any) -> bool:
    return type(a) is type(b) and vars(a) == vars(b)


def _same_limit(a: Any, b: Any) -> bool:
    return type(a) is type(b) and a.resolve() == b.resolve()


def _same_counts(a: Any, b: Any) -> bool:
    return type(a) is type(b) and a.count_request(ASK) == b.count_request(ASK)


def _same_error(a: Any, b: Any) -> bool:
    return type(a) is type(b) and str(a) == str(b) and a.args == b.args and vars(a) == vars(b)


# name -> (an instance, how a copy is compared): a value row
VALUES: dict[str, tuple[Callable[[], Any], Callable[[Any, Any], bool]]] = {
    "Message": (lambda: ASK[0], lambda a, b: a == b),
    "ToolCall": (
        lambda: ToolCall.model_validate(
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
        ),
        lambda a, b: a == b,
    ),
    "GuardConfig": (lambda: GuardConfig(max_tokens=77), lambda a, b: a == b),
    "ContextLimit": (lambda: ContextLimit(tokens=4096, source="static"), lambda a, b: a == b),
    "StaticLimit": (lambda: StaticLimit(4096), _same_limit),
    "ModelLimit": (lambda: ModelLimit("llama-3.1-8b", max_model_len=8192), _same_limit),
    "ServerLimit": (
        lambda: ServerLimit("http://127.0.0.1:9/v1", headers={"Authorization": "Bearer x"}),
        _same_fields,
    ),
    "ExtractiveSummarizer": (lambda: ExtractiveSummarizer(max_chars=99), _same_fields),
    "OpenAISummarizer": (lambda: OpenAISummarizer("http://127.0.0.1:9/v1", "m"), _same_fields),
    "PreparedRequest": (_prepared, lambda a, b: a == b),
    "OperationEvent": (_event, lambda a, b: a == b),
}

# name -> an instance that holds connections: refuses copy, deepcopy and pickle
REFUSES: dict[str, Callable[[], Any]] = {
    "Guard": _guard,
    "AsyncGuard": lambda: AsyncGuard(private_memory_url(), counter="approx", limit=4096),
}

# what the public functions return (not classes of the door, but public objects)
RETURNED_VALUES: dict[str, tuple[Callable[[], Any], Callable[[Any, Any], bool]]] = {
    "load_counter('approx')": (lambda: load_counter("approx"), _same_counts),
    "load_counter('tiktoken:cl100k_base')": (
        lambda: load_counter("tiktoken:cl100k_base"),
        _same_counts,
    ),
    # observers that are values (pickled by name): fan_out of them is a value too
    "fan_out(print, a logger's info)": (
        lambda: fan_out(print, logging.getLogger("ctxguard.test").info),
        lambda a, b: type(a) is type(b) and a.observers == b.observers,
    ),
}
RETURNED_REFUSES: dict[str, Callable[[], Any]] = {
    "open_store(memory://)": lambda: open_store(private_memory_url()),
    "open_async_store(memory://)": lambda: open_async_store(private_memory_url()),
    "open_store(redis://)": lambda: open_store(f"redis://:{SECRET}@127.0.0.1:9/0"),
    "open_async_store(redis://)": lambda: open_async_store(f"redis://:{SECRET}@127.0.0.1:9/0"),
    # an observer holding a store connection, or a thread: fan_out of it refuses
    "fan_out(TenantBudget)": lambda: fan_out(
        print, TenantBudget(f"redis://:{SECRET}@127.0.0.1:9/0", tokens=10, window_seconds=60)
    ),
    "fan_out(background(...))": lambda: fan_out(print, _background(print)),
}


def _background(*observers: Any) -> Any:
    made = background(*observers)
    _STARTED.append(made)
    return made


_STARTED: list[Any] = []


@pytest.fixture(autouse=True)
def _close_started() -> Any:
    yield
    while _STARTED:
        _STARTED.pop().close()


# not instantiable: protocols a caller implements
PROTOCOLS = {"TokenCounter", "LimitSource"}

# errors whose __init__ takes their parts (the rest: cls(message))
ERRORS: dict[str, Callable[[], CtxGuardError]] = {
    "MessageIdReusedError": lambda: MessageIdReusedError("s", "m1"),
    "CorruptRecordError": lambda: CorruptRecordError("s", 3, "not JSON", key="k"),
    "SessionFullError": lambda: SessionFullError("s", 10),
    "StoreConnectionError": lambda: StoreConnectionError("lost it", phase="read"),
    "BudgetError": lambda: BudgetError("too long", needed=9, limit=8, reserved=2),
    "MessageTooLongError": lambda: ctxguard.MessageTooLongError(
        "one message", needed=9, limit=8, reserved=2
    ),
    "OutputReserveError": lambda: OutputReserveError(
        "no room", needed=9, limit=8, reserved=8, asked=8
    ),
    "ServerBusyError": lambda: ServerBusyError(
        "busy", kv_usage=0.97, waiting=4, kv_threshold=0.95, waiting_threshold=3
    ),
    "TenantBudgetError": lambda: TenantBudgetError(
        "spent", spent=10, budget=5, window_seconds=60, retry_after=1.5
    ),
    "GuardClosedError": lambda: GuardClosedError("Guard"),
    "MissingDependencyError": lambda: MissingDependencyError("the thing", "serve"),
    "NotCopyableError": lambda: NotCopyableError("Guard", "connections", "make another"),
    "UpstreamAuthError": lambda: ctxguard.UpstreamAuthError("refused", 401, "/v1/models"),
    "ServerAuthError": lambda: ctxguard.ServerAuthError("refused", 403, "/v1/models"),
    "TokenizerAuthError": lambda: ctxguard.TokenizerAuthError("refused", 401, "/tokenize"),
}


def _public_classes() -> set[str]:
    return {name for name in ctxguard.__all__ if inspect.isclass(getattr(ctxguard, name))}


def _error_names() -> set[str]:
    return {n for n in _public_classes() if issubclass(getattr(ctxguard, n), BaseException)}


def test_every_public_class_has_a_row() -> None:
    rows = VALUES.keys() | REFUSES.keys() | PROTOCOLS | _error_names()
    assert _public_classes() == rows


@pytest.mark.parametrize("how", COPIES)
@pytest.mark.parametrize("name", [*VALUES, *RETURNED_VALUES])
def test_a_value_copies_whole(name: str, how: str) -> None:
    make, same = {**VALUES, **RETURNED_VALUES}[name]
    original = make()
    copied = COPIES[how](original)
    assert copied is not original
    assert same(copied, original)


@pytest.mark.parametrize("how", COPIES)
@pytest.mark.parametrize("name", sorted(_error_names()))
def test_an_error_copies_and_pickles_whole(name: str, how: str) -> None:
    cls = getattr(ctxguard, name)
    error = ERRORS[name]() if name in ERRORS else cls("what was wrong; what to do")
    assert type(error) is cls
    copied = COPIES[how](error)
    assert _same_error(copied, error)
    assert isinstance(copied, CtxGuardError)


@pytest.mark.parametrize("how", COPIES)
@pytest.mark.parametrize("name", [*REFUSES, *RETURNED_REFUSES])
def test_what_holds_connections_refuses_in_one_typed_line(name: str, how: str) -> None:
    held = {**REFUSES, **RETURNED_REFUSES}[name]()
    with pytest.raises(NotCopyableError) as caught:
        COPIES[how](held)
    text = str(caught.value)
    assert isinstance(caught.value, CtxGuardError) and isinstance(caught.value, TypeError)
    assert "\n" not in text and SECRET not in text
    assert f" {type(held).__name__} holds " in text and "cannot be copied or pickled; " in text


def test_a_pickled_guard_error_keeps_its_numbers() -> None:
    error = pickle.loads(
        pickle.dumps(OutputReserveError("x", needed=9, limit=8, reserved=8, asked=8))
    )
    assert (error.needed, error.limit, error.reserved, error.asked) == (9, 8, 8, 8)
    assert pickle.loads(pickle.dumps(StoreConnectionError("x", phase="tls"))).never_reached


CONVERSATION = [
    Message(role="system", content="You are terse."),
    Message(role="user", content="how many tokens is this?"),
    Message(role="assistant", content="a few"),
    Message(role="user", content="and now?"),
]


@pytest.mark.parametrize("how", COPIES)
@pytest.mark.parametrize("kind", ["mistral:v3", "mistral:v3-tekken", "mistral:v7", "hf"])
def test_a_tokenizer_counter_copies_and_counts_the_same(
    kind: str, how: str, request: pytest.FixtureRequest
) -> None:
    """A counter is a value: a copy (a worker process's, say) counts as the original.
    (The mistral: counters raised a bare RecursionError on deepcopy and a PicklingError
    on pickle: mistral_common's tokenizer is neither; it is now made again by version.)"""
    if kind == "hf":
        directory = request.getfixturevalue("hf_dirs")["qwen-2.5"]
        counter = load_counter(f"hf:{directory}")
    else:
        pytest.importorskip("mistral_common")
        counter = load_counter(kind)
    copied = COPIES[how](counter)
    assert type(copied) is type(counter) and copied.fingerprint == counter.fingerprint
    assert copied.count_request(CONVERSATION) == counter.count_request(CONVERSATION)
    assert [copied.count_message(m) for m in CONVERSATION] == [
        counter.count_message(m) for m in CONVERSATION
    ]
