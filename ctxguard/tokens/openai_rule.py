"""OpenAI models through a tiktoken encoding and the cookbook chat-counting rule.

OpenAI does not publish how its servers frame chat messages. The rule here is the
OpenAI cookbook's ``num_tokens_from_messages`` (3 tokens per message, the tokens of every
value, +1 per ``name``, +3 to prime the reply), extended by ctxguard for what the
cookbook leaves out; all of it is an approximation of an unpublished rule:

* content given as text parts counts each part's tokens;
* each tool call adds ``3 + tokens(function.name) + tokens(function.arguments)``;
  call ids and ``tool_call_id`` are routing keys and are not counted;
* tool schemas sent with the request add ``9`` once plus, per tool,
  ``3 + tokens(compact JSON of the tool's "function" object)``;
* other keys (``reasoning_content``, ``refusal``...) are not counted.

Text is encoded with ``encode_ordinary``: text that looks like a special token counts
as text. The rule is additive by construction.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from ctxguard.messages import Message
from ctxguard.tokens._encodings import LoadedEncoding
from ctxguard.tokens._openai_dicts import text_parts
from ctxguard.tokens._protocol import Tools, fingerprint

TOKENS_PER_MESSAGE = 3
TOKENS_PER_NAME = 1
REPLY_PRIMING = 3
TOKENS_PER_TOOL_CALL = 3
TOOLS_BLOCK = 9
TOKENS_PER_TOOL = 3
RULE_VERSION = "openai-cookbook+ctxguard-tools/1"


class TiktokenCounter:
    """Cookbook rule over one tiktoken encoding. Additive, exact only as far as the rule is."""

    exact = True
    additive = True

    def __init__(self, loaded: LoadedEncoding) -> None:
        self._encoding = loaded.encoding
        self.encoding_name = loaded.name
        self.fingerprint = fingerprint("tiktoken", RULE_VERSION, loaded.name, loaded.sha256)
        self._roles: dict[str, int] = {}

    def _tokens(self, text: str) -> int:
        return len(self._encoding.encode_ordinary(text))

    def _role_tokens(self, role: str) -> int:
        count = self._roles.get(role)
        if count is None:
            count = self._roles[role] = self._tokens(role)
        return count

    def count_message(self, message: Message) -> int:
        """3 + every counted value's tokens (+1 for a name, + the tool-call rule)."""
        content = message.content
        if message.name is None and not message.tool_calls and type(content) is str:
            # the common case, counted without building the OpenAI dict: the same rule
            return TOKENS_PER_MESSAGE + self._role_tokens(message.role) + self._tokens(content)
        data = message.to_openai()
        total = TOKENS_PER_MESSAGE + self._role_tokens(data["role"])
        total += sum(self._tokens(t) for t in text_parts(data.get("content")))
        if data.get("name") is not None:
            total += self._tokens(data["name"]) + TOKENS_PER_NAME
        for call in data.get("tool_calls") or ():
            function = call["function"]
            total += TOKENS_PER_TOOL_CALL + self._tokens(function["name"])
            total += self._tokens(function["arguments"])
        return total

    def request_overhead(self, *, tools: Tools | None = None) -> int:
        """Reply priming plus the tool-schema rule."""
        if not tools:
            return REPLY_PRIMING
        return REPLY_PRIMING + TOOLS_BLOCK + sum(self._tool_tokens(t) for t in tools)

    def _tool_tokens(self, tool: Mapping[str, Any]) -> int:
        function = tool.get("function", tool)
        compact = json.dumps(function, ensure_ascii=False, separators=(",", ":"))
        return TOKENS_PER_TOOL + self._tokens(compact)

    def validate(self, messages: Sequence[Message], *, tools: Tools | None = None) -> None:
        """Nothing to refuse: the rule counts every conversation a Message can hold."""

    def count_request(self, messages: Sequence[Message], *, tools: Tools | None = None) -> int:
        """Overhead plus the per-message counts (the rule is additive)."""
        return self.request_overhead(tools=tools) + sum(self.count_message(m) for m in messages)
