"""A chat template that would run for hours (nested loops, a huge string, a string
doubled in a loop, a power of big integers) is refused with a one-line
``TemplateRefusedError`` / ``TokenizerError`` (tokens/_render_budget.py); the shipped
templates render exactly as transformers renders them unbounded.

jinja2's sandbox caps one ``range()`` at 100,000 items and nothing else: each template
below ran inside ``load_counter`` / ``prepare`` for hours (or until the memory ran out).
Lowered budgets keep each refusal quick; nothing here measures time.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from ctxguard import Guard, TemplateRefusedError, TokenizerError, load_counter
from ctxguard.messages import Message
from ctxguard.tokens import _render_budget
from tests.conftest import private_memory_url
from tests.tokens.conversations import CONVERSATIONS

CHATML = "<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
TAIL = "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
ENDLESS = {
    "nested ranges": (
        "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}"
    ),
    "nested loops over a long string": (
        "{% set s = 'x' * 100000 %}{% for a in s %}{% for b in s %}{% endfor %}{% endfor %}"
    ),
    "a huge string": "{{ ('x' ~ (messages | length)) * 100000000 }}",
    "a string doubled in a loop": (
        "{% set ns = namespace(s='x') %}{% for i in range(60) %}{% set ns.s = ns.s ~ ns.s %}"
        "{% endfor %}{{ ns.s | length }}"
    ),
    "a list added to itself in a loop": (
        "{% set ns = namespace(s=[1]) %}{% for i in range(60) %}{% set ns.s = ns.s + ns.s %}"
        "{% endfor %}{{ ns.s | length }}"
    ),
    "a power of big integers": "{% set n = 10 ** (100000000 + messages | length) %}",
    # (constants: jinja computes them when it compiles the template)
    "a constant power of big integers": "{% set n = 10 ** 100000000 %}",
    "a constant huge list": "{% set n = [1, 2] * 100000000 %}",
    "a constant huge string": "{{ 'x' * 100000000 }}",
}


@pytest.fixture(autouse=True)
def _small_budgets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_render_budget, "LOOP_ITEMS", 1_000_000)
    monkeypatch.setattr(_render_budget, "MAX_CHARS", 1_000_000)


def _with_template(source: Path, target: Path, template: str) -> Path:
    shutil.copytree(source, target)
    (target / "chat_template.jinja").write_text(template)
    return target


@pytest.mark.timeout(120)
@pytest.mark.parametrize("endless", ENDLESS.values(), ids=list(ENDLESS))
def test_a_template_that_never_ends_is_a_tokenizer_error_at_load(
    hf_dirs: Any, tmp_path: Path, endless: str
) -> None:
    template = endless + "{% for m in messages %}" + CHATML + "{% endfor %}" + TAIL
    broken = _with_template(hf_dirs["glm-4.7-flash"], tmp_path / "t", template)
    with pytest.raises(TokenizerError) as caught:
        load_counter(f"hf:{broken}")
    assert "\n" not in str(caught.value)
    assert "make the chat template finish" in str(caught.value)  # why, in the one line


def test_a_template_that_refuses_every_conversation_says_its_own_words_at_load(
    hf_dirs: Any, tmp_path: Path
) -> None:
    words = "this model takes only\nsystem messages"
    template = "{{ raise_exception('" + words.replace("\n", "\\n") + "') }}" + TAIL
    broken = _with_template(hf_dirs["glm-4.7-flash"], tmp_path / "t", template)
    with pytest.raises(TokenizerError, match="refuses even a one-user-message") as caught:
        load_counter(f"hf:{broken}")
    assert "this model takes only system messages" in str(caught.value)
    assert "\n" not in str(caught.value)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", list(ENDLESS))
def test_a_template_that_never_ends_on_one_conversation_refuses_it_and_stores_nothing(
    hf_dirs: Any, tmp_path: Path, name: str
) -> None:
    endless = ENDLESS[name]
    template = (
        "{% for m in messages %}{% if m.content == 'boom' %}"
        + endless
        + "{% endif %}"
        + CHATML
        + "{% endfor %}"
        + TAIL
    )
    picky = _with_template(hf_dirs["glm-4.7-flash"], tmp_path / "picky", template)
    if "constant" in name:  # computed at compile, whatever the conversation: at load
        with pytest.raises(TokenizerError):
            load_counter(f"hf:{picky}")
        return
    counter = load_counter(f"hf:{picky}")
    with pytest.raises(TemplateRefusedError, match="make the chat template finish"):
        counter.count_request([Message(role="user", content="boom")])
    guard = Guard(private_memory_url(), counter=counter, limit=4096)
    with pytest.raises(TemplateRefusedError) as caught:
        guard.prepare("s", [{"role": "user", "content": "boom"}], max_tokens=50)
    assert "\n" not in str(caught.value)
    assert guard.store.read("s") == []
    assert guard.prepare("s", [{"role": "user", "content": "fine"}], max_tokens=50).tokens > 0
    guard.close()


@pytest.mark.timeout(120)
def test_a_long_loop_reads_the_clock_item_by_item(
    hf_dirs: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A loop whose items are few enough for the item budget but each slow (no output, no
    inner loop) is still cut by the time budget: short loops are charged whole up front
    (no wrapper per item), long ones step item by item, and the clock is read every
    ``_CLOCK_EVERY`` steps. A budget already past stands for a slow body."""
    template = (
        "{% for m in messages %}{% if m.content == 'boom' %}"
        "{% for i in range(100000) %}{% set x = i %}{% endfor %}"
        "{% endif %}" + CHATML + "{% endfor %}" + TAIL
    )
    picky = _with_template(hf_dirs["glm-4.7-flash"], tmp_path / "picky", template)
    counter = load_counter(f"hf:{picky}")
    monkeypatch.setattr(_render_budget, "SECONDS", -1.0)
    with pytest.raises(TemplateRefusedError, match="ran past") as caught:
        counter.count_request([Message(role="user", content="boom")])
    assert "\n" not in str(caught.value)
    assert counter.count_request([Message(role="user", content="fine")]) > 0  # a short render


def test_the_shipped_templates_render_as_transformers_renders_them(hf_dirs: Any) -> None:
    """Each family's template through the counter (bounded) and through transformers'
    own compile of the same text (a comment appended: another cache entry, unbounded)."""
    compared = 0
    for name, path in hf_dirs.items():
        counter = load_counter(f"hf:{path}")
        renderer = counter._renderer  # type: ignore[attr-defined]
        plain = renderer.template + "{# unbounded #}"
        for messages, tools in CONVERSATIONS.values():
            try:
                ours = renderer.render_text(messages, tools)
            except TemplateRefusedError:
                continue  # (a family whose template refuses this conversation)
            theirs = renderer.tokenizer.apply_chat_template(
                _styled(renderer, messages),
                tools=[dict(t) for t in tools] if tools else None,
                chat_template=plain,
                tokenize=False,
                add_generation_prompt=True,
                **renderer.kwargs,
            )
            assert ours == theirs, name
            compared += 1
    assert compared >= len(hf_dirs) * 3


def _styled(renderer: Any, messages: Any) -> Any:
    from ctxguard.tokens._openai_dicts import styled

    return styled(messages, renderer.style)
