"""Every public class of the adapters copies and pickles as its framework expects, or
refuses with ``NotCopyableError`` (see tests/test_copy_pickle.py for the core's).

Table-driven over each adapter module's public classes: a class added without a row
fails ``test_every_adapter_class_has_a_row``. What holds a guard's connections refuses
``copy.deepcopy`` and pickle in one typed line (a shallow ``copy.copy`` shares the
guard, as frameworks copying their components expect); the LlamaIndex components,
made to be saved, deep-copy and pickle as themselves rebuilt from their fields (the
same store); values copy equal.
"""

from __future__ import annotations

import copy
import inspect
import os
import pickle
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import pytest
from conftest import private_memory_url

from ctxguard import CtxGuardError, Guard, NotCopyableError

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no cost-map download
pytest.importorskip("litellm")
pytest.importorskip("langchain")
pytest.importorskip("llama_index.core")
pytest.importorskip("pydantic_ai")
pytest.importorskip("agents")

from llama_index.core.llms import ChatMessage, MockLLM
from pydantic_ai.messages import ModelRequest, UserPromptPart

from ctxguard.adapters import (
    langchain,
    litellm,
    llamaindex,
    openai_agents,
    pydantic_ai,
)
from ctxguard.serve.openai_errors import ApiError

COPIES: dict[str, Callable[[Any], Any]] = {
    "deepcopy": copy.deepcopy,
    "pickle": lambda o: pickle.loads(pickle.dumps(o)),
}
MODULES: dict[str, ModuleType] = {
    "langchain": langchain,
    "llamaindex": llamaindex,
    "openai_agents": openai_agents,
    "pydantic_ai": pydantic_ai,
    "litellm": litellm,
}
OPTIONS: dict[str, Any] = {"counter": "approx", "limit": 4096}


@pytest.fixture
def url() -> str:
    return private_memory_url()


@pytest.fixture
def guard(url: str) -> Iterator[Guard]:
    guard = Guard(url, **OPTIONS)
    yield guard
    guard.close()


# "module.Class" -> an instance made from (guard, url): holds a guard, so deepcopy and
# pickle refuse it, and copy.copy is the plain shallow copy
HOLDS_A_GUARD: dict[str, Callable[[Guard, str], Any]] = {
    "langchain.CtxGuardChatMessageHistory": lambda g, u: langchain.CtxGuardChatMessageHistory(
        u, "s", **OPTIONS
    ),
    "langchain.CtxGuardMiddleware": lambda g, u: langchain.CtxGuardMiddleware(g),
    "openai_agents.CtxGuardSession": lambda g, u: openai_agents.CtxGuardSession("s", u, **OPTIONS),
    "pydantic_ai.CtxGuardCapability": lambda g, u: pydantic_ai.CtxGuardCapability(g),
    "litellm.CtxGuardGuardrail": lambda g, u: litellm.CtxGuardGuardrail(
        guardrail_name="g", store=u, event_hook="pre_call", **OPTIONS
    ),
    "llamaindex.CtxGuardLLM": lambda g, u: llamaindex.CtxGuardLLM(MockLLM(), g),
}
# LlamaIndex components that are saved and rebuilt from their fields: the copy reads
# the same store as the original
REBUILT: dict[str, Callable[[Guard, str], Any]] = {
    "llamaindex.CtxGuardChatStore": lambda g, u: llamaindex.CtxGuardChatStore(u, **OPTIONS),
    "llamaindex.CtxGuardMemory": lambda g, u: llamaindex.CtxGuardMemory.from_defaults(
        u, session_id="s", **OPTIONS
    ),
}
VALUES: dict[str, Callable[[Guard, str], Any]] = {
    "pydantic_ai.Fitted": lambda g, u: pydantic_ai.fit_history(
        g, [ModelRequest(parts=[UserPromptPart(content="hi")])]
    ),
}
ERRORS: dict[str, Callable[[], CtxGuardError]] = {
    "litellm.GuardrailRefusal": lambda: litellm.GuardrailRefusal(
        ApiError(400, "does not fit; send less", code="context_length_exceeded"), "g"
    ),
}


def _public_classes() -> set[str]:
    found = set()
    for name, module in MODULES.items():
        names = getattr(module, "__all__", None) or [n for n in vars(module) if n[:1] != "_"]
        for attr in names:
            value = getattr(module, attr)  # (a framework's class imported there: not ours)
            if inspect.isclass(value) and value.__module__.startswith("ctxguard.adapters"):
                found.add(f"{name}.{attr}")
    return found


def test_every_adapter_class_has_a_row() -> None:
    assert _public_classes() == HOLDS_A_GUARD.keys() | REBUILT.keys() | VALUES.keys() | (
        ERRORS.keys()
    )


@pytest.mark.parametrize("how", COPIES)
@pytest.mark.parametrize("name", HOLDS_A_GUARD)
def test_what_holds_a_guard_refuses_in_one_typed_line(
    name: str, how: str, guard: Guard, url: str
) -> None:
    held = HOLDS_A_GUARD[name](guard, url)
    with pytest.raises(NotCopyableError) as caught:
        COPIES[how](held)
    text = str(caught.value)
    assert isinstance(caught.value, TypeError) and "\n" not in text
    assert f" {type(held).__name__} " in text and "cannot be deep-copied or pickled; " in text
    shallow = copy.copy(held)
    assert type(shallow) is type(held) and shallow is not held
    assert vars(shallow) == vars(held)


@pytest.mark.parametrize("how", COPIES)
@pytest.mark.parametrize("name", REBUILT)
def test_a_saved_component_copies_as_rebuilt_on_the_same_store(
    name: str, how: str, guard: Guard, url: str
) -> None:
    original = REBUILT[name](guard, url)
    copied = COPIES[how](original)
    assert type(copied) is type(original) and copied.model_dump() == original.model_dump()
    said = ChatMessage(role="user", content="kept")
    if isinstance(original, llamaindex.CtxGuardChatStore):
        original.add_message("k", said)
        assert [m.content for m in copied.get_messages("k")] == ["kept"]
    else:
        original.put(said)
        assert [m.content for m in copied.get_all()] == ["kept"]


@pytest.mark.parametrize("how", COPIES)
def test_an_llm_on_a_memory_copies_and_still_answers(how: str, url: str) -> None:
    memory = llamaindex.CtxGuardMemory.from_defaults(url, session_id="s", **OPTIONS)
    copied = COPIES[how](llamaindex.CtxGuardLLM(MockLLM(), memory))
    reply = copied.chat([ChatMessage(role="user", content="hi")])
    assert "hi" in str(reply)
    assert copied.last_prepared is not None


@pytest.mark.parametrize("how", [*COPIES, "copy"])
@pytest.mark.parametrize("name", VALUES)
def test_a_value_copies_equal(name: str, how: str, guard: Guard, url: str) -> None:
    original = VALUES[name](guard, url)
    copied = {**COPIES, "copy": copy.copy}[how](original)
    assert copied == original and copied is not original


@pytest.mark.parametrize("how", [*COPIES, "copy"])
@pytest.mark.parametrize("name", ERRORS)
def test_an_adapter_error_copies_whole(name: str, how: str) -> None:
    error = ERRORS[name]()
    copied = {**COPIES, "copy": copy.copy}[how](error)
    assert type(copied) is type(error) and str(copied) == str(error)
    assert vars(copied) == vars(error)
