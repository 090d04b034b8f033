"""Prompt ids and the probes that find templates rewriting earlier turns."""

from __future__ import annotations

from pathlib import Path

from ctxguard import Message
from ctxguard.tokens import load_counter, prefix_probes, prompt_ids
from ctxguard.tokens.prompt_ids import reply_ids


def test_cl100k_ids_are_as_long_as_the_count_and_keep_every_prefix() -> None:
    counter = load_counter("tiktoken:cl100k_base")
    messages = [
        Message(role="system", content="Be brief."),
        Message(role="user", content="数据 and code: def f(x): return x", name="ann"),
    ]
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    ids = prompt_ids(counter, messages, tools)
    assert ids is not None and len(ids) == counter.count_request(messages, tools=tools)
    assert set(prefix_probes(counter).values()) == {"prefix"}
    # the reply as generated extends the request to the next request's ids
    reply = Message(role="assistant", content="Sure.")
    nxt = prompt_ids(counter, [*messages, reply, Message(role="user", content="ok")])
    assert nxt is not None
    plain = prompt_ids(counter, messages)
    assert plain is not None
    generated = plain + (reply_ids(counter, "Sure.") or [])
    assert nxt[: len(generated)] == generated


def test_a_counter_without_ids_says_so() -> None:
    counter = load_counter("approx")
    assert prompt_ids(counter, [Message(role="user", content="hi")]) is None
    assert set(prefix_probes(counter).values()) == {"no ids"}


def test_qwen3_drops_earlier_think_blocks_and_the_probe_finds_it(hf_dirs: dict[str, Path]) -> None:
    qwen3 = prefix_probes(load_counter(f"hf:{hf_dirs['qwen-3']}"))
    assert qwen3["append"] == "prefix"
    assert qwen3["reasoning_reply"].startswith("breaks at token")
    qwen25 = prefix_probes(load_counter(f"hf:{hf_dirs['qwen-2.5']}"))
    assert qwen25["reasoning_reply"] == "prefix"
