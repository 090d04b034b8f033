"""Bad input to the framework adapters: a one-line CtxGuardError, and nothing stored.

Every public method of the three adapters (and their constructors) is called on
memory:// with an arbitrary JSON-like or non-JSON value in one argument at a
time; the only outcomes allowed are success or a one-line ``CtxGuardError``,
and on refusal the store must read back exactly as before.
"""

from __future__ import annotations

import asyncio
import copy
import inspect
import itertools
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("langchain_core")
pytest.importorskip("llama_index.core")
pytest.importorskip("agents")

from langchain_core.messages import AIMessage, HumanMessage
from llama_index.core.llms import ChatMessage
from llama_index.core.llms.mock import MockFunctionCallingLLM
from llama_index.core.tools import FunctionTool

from ctxguard.adapters.langchain import CtxGuardChatMessageHistory
from ctxguard.adapters.llamaindex import CtxGuardChatStore, CtxGuardLLM, CtxGuardMemory
from ctxguard.adapters.openai_agents import CtxGuardSession
from ctxguard.errors import CtxGuardError, InvalidInputError
from ctxguard.messages import Message

FUZZ = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
_names = itertools.count()

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=8,
)
NON_JSON = st.sampled_from(
    [
        object(),
        b"bytes",
        {1, 2},
        (1, "a"),
        {1: "int key"},
        float("nan"),
        lambda: None,
        Message(role="user", content="a ctxguard message"),
        HumanMessage(content="a langchain message"),
        ChatMessage(role="user", content="a llamaindex message"),
        {"role": "user", "content": "an item"},
        "\ud800",
        2**200,
    ]
)
VALUES = JSON | NON_JSON
VALUES_IN_LISTS = VALUES | st.lists(VALUES, max_size=3)


def fresh_url() -> str:
    return f"memory://bad-input-{next(_names)}"


def guard_ref(adapter: Any) -> Any:
    if isinstance(adapter, CtxGuardLLM):
        adapter = adapter.source
    return adapter._ref if isinstance(adapter, CtxGuardMemory) else adapter.ref


def snapshot(adapter: Any) -> Any:
    """Everything the adapter's memory:// store holds, read back field by field."""
    ref = guard_ref(adapter)
    sessions = ref.sync().store._sessions
    return {
        name: {
            **{k: copy.deepcopy(v) for k, v in vars(s).items() if k != "tokens"},
            "tokens": (list(s.tokens.values), s.tokens.total),
        }
        for name, s in sessions.items()
    }


def seeded(make: Callable[[str], Any]) -> Any:
    """An adapter over a fresh memory:// store whose session 's' holds two messages."""
    adapter = make(fresh_url())
    ref = guard_ref(adapter)
    ref.sync().append(
        "s", [Message(role="user", content="hi"), Message(role="assistant", content="hello")]
    )
    return adapter


def run(result: Any) -> Any:
    return asyncio.run(result) if inspect.isawaitable(result) else result


def assert_only_typed(make: Callable[[str], Any], call: Callable[[Any], Any]) -> None:
    adapter = seeded(make)
    before = snapshot(adapter)
    try:
        run(call(adapter))
    except CtxGuardError as exc:
        assert "\n" not in str(exc), str(exc)
        if isinstance(exc, InvalidInputError):  # a BudgetError may leave its audit record
            assert snapshot(adapter) == before, "a refused call changed the store"


def lc(url: str) -> CtxGuardChatMessageHistory:
    return CtxGuardChatMessageHistory(url, "s", limit=4000)


def ag(url: str) -> CtxGuardSession:
    return CtxGuardSession("s", url, limit=4000)


def li(url: str) -> CtxGuardChatStore:
    return CtxGuardChatStore(url, limit=4000)


def lm(url: str) -> CtxGuardMemory:
    return CtxGuardMemory.from_defaults(url, session_id="s", limit=4000)


def ll(url: str) -> CtxGuardLLM:
    return CtxGuardLLM(MockFunctionCallingLLM(), lm(url), max_tokens=64)


def echo(text: str) -> str:
    """Echo."""
    return text


TOOLS = [FunctionTool.from_defaults(echo)]
HI = [ChatMessage(role="user", content="hi")]

# name -> (adapter factory, call taking (adapter, value))
CALLS: dict[str, tuple[Callable[[str], Any], Callable[[Any, Any], Any]]] = {
    # LangChain
    "lc.add_messages": (lc, lambda a, v: a.add_messages(v)),
    "lc.aadd_messages": (lc, lambda a, v: a.aadd_messages(v)),
    "lc.add_message": (lc, lambda a, v: a.add_message(v)),
    "lc.add_user_message": (lc, lambda a, v: a.add_user_message(v)),
    "lc.add_ai_message": (lc, lambda a, v: a.add_ai_message(v)),
    "lc.budgeted_messages": (lc, lambda a, v: a.budgeted_messages(v)),
    "lc.abudgeted_messages": (lc, lambda a, v: a.abudgeted_messages(v)),
    "lc.budgeted_messages.max_tokens": (lc, lambda a, v: a.budgeted_messages(max_tokens=v)),
    "lc.budgeted_messages.tools": (lc, lambda a, v: a.budgeted_messages(tools=v)),
    "lc.window_runnable.max_tokens": (lc, lambda a, v: a.window_runnable(max_tokens=v)),
    "lc.window_runnable.tools": (lc, lambda a, v: a.window_runnable(tools=v)),
    "lc.init.session_id": (lc, lambda a, v: CtxGuardChatMessageHistory(fresh_url(), v)),
    "lc.init.guard": (lc, lambda a, v: CtxGuardChatMessageHistory(v, "s")),
    "lc.init.max_tokens": (
        lc,
        lambda a, v: CtxGuardChatMessageHistory(fresh_url(), "s", max_tokens=v),
    ),
    # OpenAI Agents
    "ag.add_items": (ag, lambda a, v: a.add_items(v)),
    "ag.get_items": (ag, lambda a, v: a.get_items(v)),
    "ag.model_input_filter.max_tokens": (ag, lambda a, v: a.model_input_filter(max_tokens=v)),
    "ag.model_input_filter.tools": (ag, lambda a, v: a.model_input_filter(tools=v)),
    "ag.init.session_id": (ag, lambda a, v: CtxGuardSession(v, fresh_url())),
    "ag.init.guard": (ag, lambda a, v: CtxGuardSession("s", v)),
    "ag.init.window": (ag, lambda a, v: CtxGuardSession("s", fresh_url(), window=v)),
    "ag.init.max_tokens": (ag, lambda a, v: CtxGuardSession("s", fresh_url(), max_tokens=v)),
    "ag.add_items.item_fields": (ag, lambda a, v: a.add_items([v])),
    # LlamaIndex chat store
    "li.set_messages": (li, lambda a, v: a.set_messages("s", v)),
    "li.aset_messages": (li, lambda a, v: a.aset_messages("s", v)),
    "li.set_messages.key": (li, lambda a, v: a.set_messages(v, [])),
    "li.get_messages.key": (li, lambda a, v: a.get_messages(v)),
    "li.aget_messages.key": (li, lambda a, v: a.aget_messages(v)),
    "li.add_message": (li, lambda a, v: a.add_message("s", v)),
    "li.async_add_message": (li, lambda a, v: a.async_add_message("s", v)),
    "li.add_message.key": (li, lambda a, v: a.add_message(v, ChatMessage(content="x"))),
    "li.delete_messages.key": (li, lambda a, v: a.delete_messages(v)),
    "li.adelete_messages.key": (li, lambda a, v: a.adelete_messages(v)),
    "li.delete_message": (li, lambda a, v: a.delete_message("s", v)),
    "li.adelete_message": (li, lambda a, v: a.adelete_message("s", v)),
    "li.delete_message.key": (li, lambda a, v: a.delete_message(v, 0)),
    "li.delete_last_message.key": (li, lambda a, v: a.delete_last_message(v)),
    "li.adelete_last_message.key": (li, lambda a, v: a.adelete_last_message(v)),
    "li.init.guard": (li, lambda a, v: CtxGuardChatStore(v)),
    # LlamaIndex memory
    "lm.put": (lm, lambda a, v: a.put(v)),
    "lm.aput": (lm, lambda a, v: a.aput(v)),
    "lm.put_messages": (lm, lambda a, v: a.put_messages(v)),
    "lm.aput_messages": (lm, lambda a, v: a.aput_messages(v)),
    "lm.set": (lm, lambda a, v: a.set(v)),
    "lm.aset": (lm, lambda a, v: a.aset(v)),
    "lm.get.initial_token_count": (lm, lambda a, v: a.get(initial_token_count=v)),
    "lm.from_defaults.session_id": (
        lm,
        lambda a, v: CtxGuardMemory.from_defaults(fresh_url(), session_id=v),
    ),
    "lm.from_defaults.max_tokens": (
        lm,
        lambda a, v: CtxGuardMemory.from_defaults(fresh_url(), max_tokens=v),
    ),
    "lm.from_defaults.chat_history": (
        lm,
        lambda a, v: CtxGuardMemory.from_defaults(fresh_url(), chat_history=v),
    ),
    # LlamaIndex LLM wrapper
    "ll.chat": (ll, lambda a, v: a.chat(v)),
    "ll.achat": (ll, lambda a, v: a.achat(v)),
    "ll.stream_chat": (ll, lambda a, v: a.stream_chat(v)),
    "ll.astream_chat": (ll, lambda a, v: a.astream_chat(v)),
    "ll.chat.max_tokens": (ll, lambda a, v: a.chat(HI, max_tokens=v)),
    "ll.complete": (ll, lambda a, v: a.complete(v)),
    "ll.acomplete": (ll, lambda a, v: a.acomplete(v)),
    "ll.chat_with_tools.tools": (ll, lambda a, v: a.chat_with_tools(v, user_msg="hi")),
    "ll.chat_with_tools.user_msg": (ll, lambda a, v: a.chat_with_tools(TOOLS, user_msg=v)),
    "ll.achat_with_tools.chat_history": (
        ll,
        lambda a, v: a.achat_with_tools(TOOLS, chat_history=v),
    ),
    "ll.stream_chat_with_tools.chat_history": (
        ll,
        lambda a, v: a.stream_chat_with_tools(TOOLS, chat_history=v),
    ),
    "ll.init.guard": (ll, lambda a, v: CtxGuardLLM(MockFunctionCallingLLM(), v)),
    "ll.init.llm": (ll, lambda a, v: CtxGuardLLM(v, a.source)),
    "ll.init.max_tokens": (
        ll,
        lambda a, v: CtxGuardLLM(MockFunctionCallingLLM(), a.source, max_tokens=v),
    ),
}


ITEM_KEYS = st.sampled_from(["role", "type", "content", "call_id", "name", "arguments", "output"])
ITEM_VALUES = st.sampled_from(["user", "assistant", "function_call", "function_call_output", "c1"])
ITEMS = st.dictionaries(ITEM_KEYS, ITEM_VALUES | VALUES, max_size=5)


@FUZZ
@given(items=st.lists(ITEMS, max_size=3))
def test_agents_items_of_any_shape_are_typed_errors(items: list[Any]) -> None:
    assert_only_typed(ag, lambda session: session.add_items(items))


@pytest.mark.parametrize("name", sorted(CALLS))
@FUZZ
@given(value=VALUES_IN_LISTS)
def test_bad_argument_is_a_typed_one_line_error(name: str, value: Any) -> None:
    make, call = CALLS[name]
    assert_only_typed(make, lambda adapter: call(adapter, value))


# -- the reported instances (issue 12 item 8) ----------------------------------------


REPORTED = {
    "lc.add_messages(None)": (lc, lambda a: a.add_messages(None)),
    "lc.add_messages([5])": (lc, lambda a: a.add_messages([5])),
    "lc.add_messages('hello')": (lc, lambda a: a.add_messages("hello")),
    "lc.budgeted_messages(None)": (lc, lambda a: a.budgeted_messages(None)),
    "ag.add_items(None)": (ag, lambda a: a.add_items(None)),
    # found by the fuzz at a larger budget: a message item whose content is a number
    "ag.add_items(content=1)": (ag, lambda a: a.add_items([{"role": "user", "content": 1}])),
    "ag.get_items('a')": (ag, lambda a: a.get_items("a")),
    "li.set_messages('k', None)": (li, lambda a: a.set_messages("s", None)),
    "li.delete_message('k', 'x')": (li, lambda a: a.delete_message("s", "x")),
    "li.add_message('k', None)": (li, lambda a: a.add_message("s", None)),
}


@pytest.mark.parametrize("name", sorted(REPORTED))
def test_reported_bad_inputs_are_refused(name: str) -> None:
    make, call = REPORTED[name]
    adapter = seeded(make)
    before = snapshot(adapter)
    with pytest.raises(InvalidInputError) as caught:
        run(call(adapter))
    assert "\n" not in str(caught.value)
    assert snapshot(adapter) == before


def test_a_refused_batch_stores_none_of_it() -> None:
    """A bad message late in a batch refuses the batch before anything is written."""
    history = seeded(lc)
    before = snapshot(history)
    with pytest.raises(InvalidInputError, match=r"messages\[1\]"):
        history.add_messages([HumanMessage(content="ok"), 5])
    assert snapshot(history) == before


def test_delete_message_past_the_end_is_none_as_in_llamaindex() -> None:
    """LlamaIndex's SimpleChatStore returns None for an index past the end; so do we."""
    store = seeded(li)
    assert store.delete_message("s", 99) is None
    assert store.delete_message("missing", 0) is None


def test_a_single_message_is_not_taken_for_a_batch() -> None:
    history = seeded(lc)
    with pytest.raises(InvalidInputError, match="wrap it in a list"):
        history.add_messages(AIMessage(content="one"))  # type: ignore[arg-type]


def test_an_empty_list_to_fit_is_refused_in_the_callers_terms() -> None:
    """Every adapter that fits a list the caller assembles refuses an empty one alike,
    saying so (before: "session 'fit' holds no messages", the scratch session's name)."""
    from ctxguard import Guard
    from ctxguard.adapters.langchain import afit_messages, fit_messages, window_runnable

    guard = Guard(fresh_url(), limit=4000, counter="approx")
    calls: list[Callable[[], Any]] = [
        lambda: fit_messages(guard, []),
        lambda: afit_messages(guard, []),
        lambda: window_runnable(guard).invoke([]),
        lambda: ll(fresh_url()).chat([]),
    ]
    try:
        from ctxguard.adapters.pydantic_ai import fit_history

        calls.append(lambda: fit_history(guard, []))
    except ImportError:  # (the pydantic_ai extra is not installed)
        pass
    for call in calls:
        with pytest.raises(InvalidInputError) as exc:
            run(call())
        text = str(exc.value)
        assert text.startswith("no messages to fit: the list is empty"), text
        assert "'fit'" not in text and "\n" not in text


def test_a_batch_too_big_to_store_names_the_callers_session() -> None:
    """A history set whole (``set_messages``-style replace, one atomic write) that the
    store refuses names the caller's session and stores nothing."""
    from ctxguard import Guard
    from ctxguard.adapters import _shared
    from ctxguard.errors import SessionFullError

    guard = Guard(fresh_url(), limit=4000, counter="approx", max_stored_messages=1)
    two = [Message(role="user", content="a"), Message(role="assistant", content="b")]
    with pytest.raises(SessionFullError, match="session 'chat-7'"):
        _shared.replace(guard, "chat-7", two)
    assert guard.store.info("chat-7") is None


@pytest.mark.parametrize(
    "make",
    [
        lambda url: CtxGuardChatMessageHistory(url, "s", max_stored_messages=1),
        lambda url: CtxGuardChatStore(url, max_stored_messages=1),
        lambda url: CtxGuardMemory.from_defaults(url, session_id="s", max_stored_messages=1),
        lambda url: CtxGuardSession("s", url, max_stored_messages=1),
    ],
    ids=["langchain-history", "llamaindex-store", "llamaindex-memory", "agents-session"],
)
def test_an_unknown_guard_option_is_a_config_error_naming_it(make: Callable[[str], Any]) -> None:
    """(An adapter passes its ``**guard_options`` on to the guard it opens: a typo was a
    bare ``TypeError`` from an internal class.)"""
    from ctxguard.errors import ConfigError

    with pytest.raises(ConfigError) as exc:
        make(fresh_url())
    text = str(exc.value)
    assert "'max_stored_messages'" in text and "limit, counter" in text and "\n" not in text


def test_guard_options_given_with_a_guard_are_refused_not_ignored() -> None:
    """(``CtxGuardChatMessageHistory(guard, "s", limit=4000)`` ran with the guard's own
    limit: the options only apply to a guard the adapter opens from a URL.)"""
    from ctxguard import AsyncGuard, Guard
    from ctxguard.errors import ConfigError

    url = fresh_url()
    for guard in (Guard(url, limit=100), AsyncGuard(url, limit=100)):
        CtxGuardChatStore(guard)  # no options: the guard's own
        with pytest.raises(ConfigError, match=r"^limit, counter given with a") as exc:
            CtxGuardChatMessageHistory(guard, "s", limit=4000, counter="approx:3")
        assert "\n" not in str(exc.value)
        with pytest.raises(ConfigError, match=r"^namespace given with a"):
            CtxGuardSession("s", guard, namespace="other")
