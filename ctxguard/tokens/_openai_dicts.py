"""OpenAI message dicts shaped the way an OpenAI-compatible server hands them to a template.

vLLM (and SGLang) do not pass the request's dicts to ``apply_chat_template`` verbatim:
``content: null`` becomes ``""``, text parts are joined for templates that only read
strings, and tool-call ``arguments`` are decoded to objects for templates that iterate
them. Which of these a template needs is detected once by probing (see ``hf.py``); this
module only applies the chosen style.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ctxguard.errors import UncountableContentError
from ctxguard.messages import Message


@dataclass(frozen=True)
class DictStyle:
    """How one template wants its messages: decoded arguments? list content?"""

    arguments_as_dict: bool = True
    content_as_parts: bool = False

    def key(self) -> str:
        """A short stable text for fingerprints."""
        return f"args={'dict' if self.arguments_as_dict else 'str'};parts={self.content_as_parts}"


def openai_dicts(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """Plain OpenAI dicts (deep copies, safe to mutate)."""
    return [copy.deepcopy(m.to_openai()) for m in messages]


def styled(messages: Sequence[dict[str, Any]], style: DictStyle) -> list[dict[str, Any]]:
    """Apply ``style`` to OpenAI dicts, returning new dicts."""
    return [_styled_one(copy.deepcopy(m), style) for m in messages]


def _styled_one(message: dict[str, Any], style: DictStyle) -> dict[str, Any]:
    content = message.get("content")
    if content is None:
        message["content"] = ""
    elif isinstance(content, list):
        _reject_images(content)
        if not style.content_as_parts:
            message["content"] = "\n".join(p["text"] for p in content)
        else:  # as a server builds them: a part's cache_control is not the template's
            message["content"] = [{"type": "text", "text": p["text"]} for p in content]
    if style.arguments_as_dict and message.get("tool_calls"):
        for call in message["tool_calls"]:
            function = call.get("function", {})
            if isinstance(function.get("arguments"), str):
                function["arguments"] = json.loads(function["arguments"])
    return message


def _reject_images(parts: list[dict[str, Any]]) -> None:
    for index, part in enumerate(parts):
        if part.get("type") != "text":
            raise UncountableContentError(
                f"content part {index} ({part.get('type')}) cannot be counted by a text "
                "tokenizer; count it with the model's image-token rule and send text parts here"
            )


def text_parts(content: Any) -> list[str]:
    """The text of an OpenAI ``content`` value as a list of strings (images refused)."""
    if content is None:
        return []
    if isinstance(content, str):
        return [content]
    _reject_images(content)
    return [p["text"] for p in content]
