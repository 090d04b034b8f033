"""No piece of a secret survives an error that echoes text cut at a length limit.

A password (1-15 characters, drawn from letters used nowhere else so that any one of
them in the output is a leak) straddles the cut at every position: behind a user name
of 0-160 characters in a URL, or as a named value. The redaction helpers hide it before
they cut (``show``, ``redact_text``, ``describe``); the echoes that cut raw text first
(a gateway setting's environment variable, a tool call's arguments, a Responses
``function_call``'s arguments, ``ctxguard import``'s value preview) showed its first
characters: they go through the same helpers now.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ctxguard._secrets import describe, redact_text
from ctxguard._validate import show
from ctxguard.cli.import_file import _preview
from ctxguard.errors import ConfigError, InvalidMessageError
from ctxguard.messages import ToolCall
from ctxguard.serve.config import load_config
from ctxguard.serve.openai_errors import ApiError
from ctxguard.serve.responses_input import _arguments

SECRET = "ЖЗИЙКЛ"
passwords = st.text(alphabet=SECRET, min_size=1, max_size=15)
FORMS = [
    "redis://{u}:{p}@cache:6379/0",
    "rediss://{u}:{p}@cache/0",
    "redis+cluster://{u}:{p}@a:1,b:2",
    "https://{u}:{p}@api.example.com/v1",
    "redis://cache:6379/0?username={u}&password={p}",
    "password={p}",
    '"api_key": "{p}"',
    "Authorization: Bearer {p}",
]
texts = st.builds(
    lambda pre, form, user, p, post: "y" * pre + " " + form.format(u="u" * user, p=p) + post,
    st.integers(0, 120),
    st.sampled_from(FORMS),
    st.integers(0, 160),
    passwords,
    st.sampled_from(["", " and so on", '"}', "\nnext line"]),
)
CUTS = settings(max_examples=400, deadline=None)


def leaks(out: str) -> bool:
    """Any secret letter, as itself or JSON-escaped (U+0416..U+041B: ``\\u041x``)."""
    return any(c in out for c in SECRET) or "\\u041" in out


@CUTS
@given(text=texts, limit=st.integers(1, 400))
def test_the_helpers_hide_every_prefix_at_every_cut(text: str, limit: int) -> None:
    assert not leaks(show(text, limit))
    assert not leaks(redact_text(text, limit))
    assert not leaks(describe(ValueError(text), limit))


@CUTS
@given(user=st.integers(0, 60), p=passwords, form=st.sampled_from(FORMS[:5]))
def test_a_gateway_setting_from_the_environment(user: int, p: str, form: str) -> None:
    value = form.format(u="u" * user, p=p)
    with pytest.raises(ConfigError) as caught:
        load_config({}, environ={"CTXGUARD_SERVE_LIMIT": value})
    assert "CTXGUARD_SERVE_LIMIT" in str(caught.value) and not leaks(str(caught.value))


def _broken_json(user: int, p: str, form: str) -> str:
    return '{"to": "' + form.format(u="u" * user, p=p) + '", '  # (unterminated: not JSON)


@CUTS
@given(user=st.integers(0, 120), p=passwords, form=st.sampled_from(FORMS))
def test_a_tool_calls_arguments(user: int, p: str, form: str) -> None:
    arguments = _broken_json(user, p, form)
    with pytest.raises(InvalidMessageError) as caught:
        ToolCall(id="c1", type="function", function={"name": "f", "arguments": arguments})
    assert "arguments" in str(caught.value) and not leaks(str(caught.value))


@CUTS
@given(user=st.integers(0, 120), p=passwords, form=st.sampled_from(FORMS))
def test_a_responses_function_calls_arguments(user: int, p: str, form: str) -> None:
    item: dict[str, Any] = {"arguments": _broken_json(user, p, form)}
    with pytest.raises(ApiError) as caught:
        _arguments(item, "input[0]")
    assert "arguments" in caught.value.message and not leaks(caught.value.message)


@CUTS
@given(user=st.integers(0, 120), p=passwords, form=st.sampled_from(FORMS))
def test_an_import_files_value_preview(user: int, p: str, form: str) -> None:
    shown = _preview(form.format(u="u" * user, p=p))
    assert len(shown) <= 40 and not leaks(shown)
