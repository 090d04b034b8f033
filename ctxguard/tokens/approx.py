"""A dependency-free estimate for when no tokenizer is available. Labelled approximate.

Heuristic per character class, tuned on BPE vocabularies of 100k-200k entries:
ASCII letters ~4 per token, digits ~3, other ASCII ~1.3, CJK and kana ~1.2 tokens each,
other scripts ~2 per token, emoji and other astral characters ~2 tokens. Each message
adds ``PER_MESSAGE`` (role header and end-of-turn), each tool call ``PER_TOOL_CALL``, and
a request ``PER_REQUEST`` (generation prompt). ``exact`` is False: anything that shows
one of these counts must say it is approximate.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence

from ctxguard.messages import Message
from ctxguard.tokens._openai_dicts import text_parts
from ctxguard.tokens._protocol import Tools, fingerprint

PER_MESSAGE = 4
PER_TOOL_CALL = 4
PER_REQUEST = 3
PER_TOOL_SCHEMA = 10


def _char_weight(char: str) -> float:
    code = ord(char)
    if code < 128:
        if char.isalpha():
            return 0.25
        return 0.34 if char.isdigit() else 0.75
    if 0x3040 <= code <= 0x30FF or 0x4E00 <= code <= 0x9FFF or 0xAC00 <= code <= 0xD7AF:
        return 1.2
    return 2.0 if code > 0xFFFF else 0.5


def estimate_text(text: str) -> int:
    """Estimated tokens of ``text`` (0 for empty text)."""
    return math.ceil(sum(_char_weight(c) for c in text))


class ApproxCounter:
    """Character-class estimate; additive by construction, never exact."""

    exact = False
    additive = True
    fingerprint = fingerprint("approx", "v1")

    def count_message(self, message: Message) -> int:
        data = message.to_openai()
        total = PER_MESSAGE + estimate_text(data.get("name") or "")
        total += sum(estimate_text(t) for t in text_parts(data.get("content")))
        for call in data.get("tool_calls") or ():
            function = call["function"]
            total += PER_TOOL_CALL + estimate_text(function["name"] + function["arguments"])
        return total

    def request_overhead(self, *, tools: Tools | None = None) -> int:
        schemas = sum(
            PER_TOOL_SCHEMA + estimate_text(json.dumps(t, ensure_ascii=False)) for t in tools or ()
        )
        return PER_REQUEST + schemas

    def validate(self, messages: Sequence[Message], *, tools: Tools | None = None) -> None:
        """Nothing to refuse: an estimate has no template."""

    def count_request(self, messages: Sequence[Message], *, tools: Tools | None = None) -> int:
        return self.request_overhead(tools=tools) + sum(self.count_message(m) for m in messages)
