"""A chat template whose own expressions raise (1/0, a macro that calls itself,
10.0 ** 999) refuses the conversation typed, like ``raise_exception`` does.

Before, only jinja's errors and five builtin classes (TypeError, ValueError, KeyError,
IndexError, AttributeError) were taken for a refusal: a ZeroDivisionError,
OverflowError or RecursionError from the template escaped ``load_counter`` and
``Guard.prepare`` bare.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from ctxguard import Guard, TemplateRefusedError, TokenizerError, load_counter
from ctxguard.messages import Message
from tests.conftest import private_memory_url

CHATML = "<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
TAIL = "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
ALWAYS = {
    "1/0": "{{ 1/0 }}",
    "10.0 ** 999": "{{ 10.0 ** 999 }}",
    "a macro that calls itself": "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
}


def _with_template(source: Path, target: Path, template: str) -> Path:
    shutil.copytree(source, target)
    (target / "chat_template.jinja").write_text(template)
    return target


@pytest.mark.parametrize("template", ALWAYS.values(), ids=list(ALWAYS))
def test_a_template_that_always_raises_is_a_tokenizer_error_at_load(
    hf_dirs: Any, tmp_path: Path, template: str
) -> None:
    broken = _with_template(hf_dirs["glm-4.7-flash"], tmp_path / "t", template)
    with pytest.raises(TokenizerError) as caught:
        load_counter(f"hf:{broken}")
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("expression", ["1/0", "10.0 ** 999"])
def test_a_template_that_raises_on_one_conversation_refuses_it_and_nothing_is_stored(
    hf_dirs: Any, tmp_path: Path, expression: str
) -> None:
    template = (
        "{% for m in messages %}{% if m.content == 'boom' %}{{ " + expression + " }}"
        "{% endif %}" + CHATML + "{% endfor %}" + TAIL
    )
    picky = _with_template(hf_dirs["glm-4.7-flash"], tmp_path / "picky", template)
    counter = load_counter(f"hf:{picky}")
    with pytest.raises(TemplateRefusedError, match="the chat template refused"):
        counter.count_request([Message(role="user", content="boom")])
    guard = Guard(private_memory_url(), counter=counter, limit=4096)
    with pytest.raises(TemplateRefusedError):
        guard.prepare("s", [{"role": "user", "content": "boom"}], max_tokens=50)
    assert guard.store.read("s") == []
    assert guard.prepare("s", [{"role": "user", "content": "fine"}], max_tokens=50).tokens > 0
