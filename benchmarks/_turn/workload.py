"""The workload of bench_turn: the plan, the counting rule, the data, the checks."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from _synthetic import HistoryGenerator

from ctxguard.messages import Message
from ctxguard.stores import NewMessage
from ctxguard.tokens._encodings import load_named

PROMPT_BUDGET = 4096  # tokens of prompt every system may send
RESERVED_OUTPUT = 512  # ctxguard: limit = PROMPT_BUDGET + RESERVED_OUTPUT, max_tokens = 512
REPLY_PRIMING = 3  # cookbook rule, counted once per request by ctxguard and the floors
FLOOR_FETCH = 64  # newest records the floors read in their first round trip
GROWTH = 0.2  # timed turns may grow a session by at most this share of H
LLAMAINDEX_SIZES = (100, 1000)
LLAMAINDEX_WHY = (
    "LlamaIndex ChatMemoryBuffer re-tokenizes the whole remaining history after each "
    "dropped message (quadratic in H): seconds per turn at 1,000 (see the table), about "
    "20 minutes projected at 10,000 (peers.md §5), so it runs at 100 and 1,000 only"
)


# -- plans: how many turns of what --------------------------------------------


@dataclass(frozen=True)
class Plan:
    sizes: tuple[int, ...]
    turns: int  # timed turns for the floors and every ctxguard row at every size
    warmup: int
    langchain: dict[int, int]
    llamaindex: dict[int, int]


def make_plan(sizes: tuple[int, ...], turns: int | None, quick: bool) -> Plan:
    if quick:
        base = turns or 300
        return Plan(sizes, base, 30, {100: 40, 1000: 10, 10000: 2}, {100: 8, 1000: 1})
    base = turns or 2000
    return Plan(sizes, base, 100, {100: 200, 1000: 40, 10000: 5}, {100: 30, 1000: 3})


def turns_for(plan: Plan, system: str, size: int) -> int:
    if system == "langchain":
        return plan.langchain.get(size, max(2, plan.turns // max(1, size // 20)))
    if system == "llamaindex":
        return plan.llamaindex.get(size, 0) if size in LLAMAINDEX_SIZES else 0
    return plan.turns


def warmup_for(plan: Plan, system: str, size: int) -> int:
    n = turns_for(plan, system, size)
    if system in ("langchain", "llamaindex"):
        # one untimed turn is enough to import and fill caches; slow cases get none
        return 0 if (system == "llamaindex" and size >= 1000) else min(plan.warmup, max(1, n // 5))
    return plan.warmup


def sessions_needed(size: int, turns: int) -> int:
    return max(1, math.ceil(2 * turns / (GROWTH * size)))


# -- counting (the same rule everywhere) -------------------------------------


class Cl100k:
    """tiktoken cl100k_base, found offline the way ctxguard finds it."""

    def __init__(self) -> None:
        self.encoding = load_named("cl100k_base").encoding
        self.role_tokens = {
            r: len(self.encoding.encode_ordinary(r))
            for r in ("system", "user", "assistant", "tool", "developer", "human", "ai")
        }

    def text(self, text: str) -> int:
        return len(self.encoding.encode_ordinary(text))

    def message(self, role: str, content: str) -> int:
        """The OpenAI cookbook rule ctxguard's TiktokenCounter uses (no names, no tools)."""
        return 3 + self.role_tokens[role] + self.text(content)


# -- data ----------------------------------------------------------------------


@dataclass
class SizeData:
    size: int
    history: list[dict[str, str]]  # [system, user, assistant, ...]
    counts: list[int]  # cookbook count of each history message
    new_messages: list[NewMessage]  # ctxguard's records, counted once
    sessions: dict[str, list[str]] = field(default_factory=dict)


def build_size(size: int, seed: int, tok: Cl100k) -> SizeData:
    history = HistoryGenerator(seed + size).history(size)
    counts = [tok.message(m["role"], m["content"]) for m in history]
    new: list[NewMessage] = []
    for i, (m, c) in enumerate(zip(history, counts, strict=True)):
        msg = Message(role=m["role"], content=m["content"], id=f"h{size}-{i}")
        new.append(NewMessage(msg, c, msg.to_record()))
    return SizeData(size, history, counts, new)


# -- what a turn sent, and its check ---------------------------------------------


@dataclass
class Outcome:
    """What a turn sent, for the correctness check (not timed)."""

    messages: list[tuple[str, str]]  # (role, content) in order
    tokens: int | None = None
    reserved: int = 0
    limit: int | None = None


@dataclass
class Check:
    turns: int = 0
    over_budget: int = 0
    missing_user: int = 0
    missing_system: int = 0

    def add(self, out: Outcome, user: dict[str, str]) -> None:
        self.turns += 1
        if (
            out.tokens is not None
            and out.limit is not None
            and out.tokens + out.reserved > out.limit
        ):
            self.over_budget += 1
        if not out.messages or out.messages[-1] != ("user", user["content"]):
            self.missing_user += 1
        if not out.messages or out.messages[0][0] != "system":
            self.missing_system += 1

    @property
    def ok(self) -> bool:
        return self.turns > 0 and not (self.over_budget or self.missing_user or self.missing_system)


def quantile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))
    return ordered[index]
