"""Anthropic-style ``cache_control`` on content parts (common in LiteLLM traffic) is kept on
the message and in its record, and counts as nothing: a server hands a template the part's
text, not its cache marker (a template that reads parts saw the marker before)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tokenizer_files import require

from ctxguard.messages import Message

from .conftest import counter_for

MARK = {"type": "ephemeral"}


def parts(marked: bool) -> Message:
    first: dict[str, Any] = {"type": "text", "text": "a long shared preamble"}
    if marked:
        first["cache_control"] = MARK
    content = [first, {"type": "text", "text": "the question"}]
    return Message.from_openai({"role": "user", "content": content})


@pytest.mark.parametrize("spec", ["approx", "tiktoken:o200k_base", "qwen-2.5", "mistral:v7"])
def test_a_cache_marker_changes_no_count(
    spec: str, hf_dirs: dict[str, Path], counters: dict[str, Any]
) -> None:
    if spec.startswith("mistral"):
        require("mistral_common", "mistral-common")
        require("sentencepiece", "sentencepiece")
    elif spec in hf_dirs:
        spec = f"hf:{hf_dirs[spec]}"
    counter = counter_for(counters, spec)
    system = Message.from_openai({"role": "system", "content": "be brief"})
    marked, plain = [system, parts(True)], [system, parts(False)]
    assert counter.count_request(marked) == counter.count_request(plain)
    assert counter.count_message(marked[1]) == counter.count_message(plain[1])


def test_a_cache_marker_is_kept_in_the_record_and_given_back() -> None:
    message = parts(True)
    again = Message.from_record(message.to_record())
    assert again == message
    assert again.to_openai()["content"][0]["cache_control"] == MARK
    assert "cache_control" not in parts(False).to_record()  # (records without it unchanged)


def test_a_cache_marker_that_is_no_object_is_refused_by_its_path() -> None:
    from ctxguard.errors import InvalidMessageError

    bad = {"role": "user", "content": [{"type": "text", "text": "x", "cache_control": "yes"}]}
    with pytest.raises(InvalidMessageError, match=r"content\[0\]\.cache_control: "):
        Message.from_openai(bad)
