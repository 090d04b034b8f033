"""The additive path refuses exactly what the render path refuses (issue 12, item 15).

An additive counter never renders the window it sends (the guard adds stored counts), so
a conversation the template refuses would go out and come back as a 400. Each counter's
``validate`` must raise ``TemplateRefusedError`` for every conversation ``count_request``
refuses, and for nothing else, in every family; and the guard must call it.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from ctxguard import Guard
from ctxguard.errors import TemplateRefusedError
from ctxguard.messages import Message
from ctxguard.tokens import load_counter
from ctxguard.tokens._protocol import validate_request

from .conftest import counter_for, require
from .conversations import CONVERSATIONS
from .refusals import EDGES, REFUSALS

Dict = dict[str, Any]

# ChatML with the checks HF templates make through raise_exception (role alternation,
# no tool role, no empty assistant turn). It stays additive: the probes it accepts add up.
STRICT_TEMPLATE = (
    "{%- set ns = namespace(prev='') -%}"
    "{%- for m in messages -%}"
    "{%- if m.role == 'tool' -%}{{ raise_exception('tool messages are not supported') }}"
    "{%- endif -%}"
    "{%- if m.role != 'system' and m.role == ns.prev -%}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant') }}"
    "{%- endif -%}"
    "{%- if m.role == 'assistant' and not m.content -%}"
    "{{ raise_exception('assistant messages need content') }}{%- endif -%}"
    "{%- if m.role != 'system' -%}{%- set ns.prev = m.role -%}{%- endif -%}"
    "<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|im_start|>assistant\n{%- endif -%}"
)
HF = ("qwen-2.5", "qwen-3", "qwen3-pkg", "deepseek-v3", "deepseek-r1", "glm-4.7-flash")
MISTRAL = ("v1", "v2", "v3", "v3-tekken", "v7")
FAMILIES = (
    *(f"hf:{name}" for name in HF),
    "hf:strict",
    *(f"mistral:{v}" for v in MISTRAL),
    "tiktoken:cl100k_base",
    "tiktoken:o200k_base",
    "approx",
)
CASES = {
    **{f"refusal/{k}": v for k, v in REFUSALS.items()},
    **{f"edge/{k}": v for k, v in EDGES.items()},
    **CONVERSATIONS,
}


@pytest.fixture(scope="session")
def strict_dir(hf_dirs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    import shutil

    target = tmp_path_factory.mktemp("strict") / "chatml-strict"
    shutil.copytree(hf_dirs["glm-4.7-flash"], target)
    (target / "chat_template.jinja").write_text(STRICT_TEMPLATE)
    return target


def counter_of(family: str, request: pytest.FixtureRequest, counters: dict[str, Any]) -> Any:
    kind, _, name = family.partition(":")
    if kind == "hf":
        dirs = request.getfixturevalue("hf_dirs")
        path = request.getfixturevalue("strict_dir") if name == "strict" else dirs[name]
        return counter_for(counters, f"hf:{path}")
    if kind == "mistral":
        require("mistral_common", "mistral-common")
        require("sentencepiece", "sentencepiece")
    return counter_for(counters, family)


def messages_of(conv: list[Dict]) -> list[Message]:
    return [Message.from_openai(d) for d in conv]


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("family", FAMILIES)
def test_additive_path_refuses_what_the_render_path_refuses(
    family: str, case: str, request: pytest.FixtureRequest, counters: dict[str, Any]
) -> None:
    counter = counter_of(family, request, counters)
    conv, tools = CASES[case]
    messages = messages_of(conv)
    try:
        counter.count_request(messages, tools=tools)
    except TemplateRefusedError as exc:
        with pytest.raises(TemplateRefusedError) as info:
            validate_request(counter, messages, tools=tools)
        assert str(info.value) == str(exc)  # the same refusal, the same message
    else:
        validate_request(counter, messages, tools=tools)  # accepted: must not refuse


def test_the_cases_are_refusals(request: pytest.FixtureRequest, counters: dict[str, Any]) -> None:
    """Each refusal case is refused by some family (so the table above tests something)."""
    refused_by: dict[str, set[str]] = {name: set() for name in REFUSALS}
    for family in FAMILIES:
        counter = counter_of(family, request, counters)
        for name, (conv, tools) in REFUSALS.items():
            try:
                counter.count_request(messages_of(conv), tools=tools)
            except TemplateRefusedError:
                refused_by[name].add(family)
    assert {name for name, families in refused_by.items() if not families} == set()
    assert "mistral:v7" in refused_by["empty_assistant_mid_conversation"]
    assert "hf:strict" in refused_by["two_assistants"]


@pytest.mark.parametrize("family", ["mistral:v7", "hf:strict"])
def test_refusing_families_are_additive(
    family: str, request: pytest.FixtureRequest, counters: dict[str, Any]
) -> None:
    """The counters the guard does not render: where validation is the only check."""
    assert counter_of(family, request, counters).additive


# -- the guard calls the check on the additive path ---------------------------------


def guard_for(family: str, request: pytest.FixtureRequest, counters: dict[str, Any]) -> Guard:
    counter = counter_of(family, request, counters)
    assert counter.additive
    return Guard(f"memory://{uuid.uuid4().hex}", counter=counter, limit=32_000, max_tokens=256)


@pytest.mark.parametrize(
    ("family", "conv"),
    [
        ("mistral:v7", REFUSALS["empty_assistant_mid_conversation"][0]),
        ("mistral:v7", REFUSALS["system_after_assistant"][0]),
        ("hf:strict", REFUSALS["two_assistants"][0]),
        ("hf:strict", REFUSALS["empty_assistant_mid_conversation"][0]),
    ],
)
def test_guard_refuses_on_the_first_turn(
    family: str, conv: list[Dict], request: pytest.FixtureRequest, counters: dict[str, Any]
) -> None:
    guard = guard_for(family, request, counters)
    with pytest.raises(TemplateRefusedError):
        guard.prepare("s", conv)


@pytest.mark.parametrize("family", ["mistral:v7", "hf:strict"])
def test_guard_refuses_on_a_cached_session(
    family: str, request: pytest.FixtureRequest, counters: dict[str, Any]
) -> None:
    """The turn planned on the guard's cached window is checked as well."""
    guard = guard_for(family, request, counters)
    guard.prepare("s", [{"role": "user", "content": "Hi"}])
    guard.complete("s", {"role": "assistant", "content": "Hello."})
    ok = guard.prepare("s", [{"role": "user", "content": "How are you?"}])
    assert ok.tokens == guard.counter.count_request(list(ok.messages))
    guard.complete("s", {"role": "assistant", "content": ""})  # the model answered nothing
    with pytest.raises(TemplateRefusedError):
        guard.prepare("s", [{"role": "user", "content": "Still there?"}])


def test_counters_without_validate_still_work() -> None:
    """``validate`` is optional on the protocol: a counter without one accepts everything."""

    class Plain:
        fingerprint, exact, additive = "plain", False, True

        def __init__(self) -> None:
            self.inner = load_counter("approx")

        def count_message(self, message: Message) -> int:
            return int(self.inner.count_message(message))

        def request_overhead(self, *, tools: Any = None) -> int:
            return int(self.inner.request_overhead(tools=tools))

        def count_request(self, messages: Any, *, tools: Any = None) -> int:
            return int(self.inner.count_request(messages, tools=tools))

    guard = Guard(f"memory://{uuid.uuid4().hex}", counter=Plain(), limit=4000)
    prepared = guard.prepare("s", REFUSALS["empty_assistant_mid_conversation"][0])
    assert len(prepared.messages) == 3
