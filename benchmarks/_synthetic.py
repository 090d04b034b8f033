"""Synthetic chat histories for ctxguard's benchmarks (seeded, no tokenizer needed).

The shape follows /work/shared/facts/peers.md §5: message lengths are log-normal
with a median of about 79 cl100k tokens, about 18% of messages are Chinese, about
17% hold code, the rest is English prose. A history starts with one system
message and then alternates user and assistant messages.

Lengths are aimed at in cl100k tokens through per-kind rates (English ~1.1
tokens per word, Chinese ~1.16 per character, code ~0.29 per character),
measured once against tiktoken's cl100k_base; benchmarks that have the real
tokenizer report the measured distribution (see :func:`length_summary`).

>>> gen = HistoryGenerator(seed=7)
>>> [m["role"] for m in gen.history(3)]
['system', 'user', 'assistant']
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

MEDIAN_TOKENS = 79
SIGMA = 0.9
MAX_TOKENS = 1500
MIN_TOKENS = 4
SHARE_CHINESE = 0.18
SHARE_CODE = 0.17

SYSTEM_PROMPT = (
    "You are a helpful assistant for an online shop. Answer briefly and politely, "
    "in the language the customer writes in. When you show code, use fenced blocks. "
    "Never invent order numbers, prices or delivery dates; ask when you are unsure."
)

_WORDS = tuple(
    " ".join(
        (
            "the of and to in is it that for on with as was at by this be from or have an",
            "are not but what all were when we there can which their said if do will each",
            "about how up out them then she many some so these would other into has more her",
            "two like him see time could no make than first been its who now people my made",
            "over did down only way find use may water long little very after words called",
            "just where most know get through back much before go good new write our used me",
            "man too any day same right look think also around another came come work three",
            "word must because does part even place well such here take why things help put",
            "years different away again off went old number order shipping refund delivery",
            "account password invoice warranty customer address package tracking payment",
            "discount product size colour return exchange support ticket",
        )
    ).split()
)
_CHINESE = (
    "的一是在不了有和人这中大为上个国我以要他时来用们生到作地于出就分对成会可主发年动同工也能"
    "下过子说产种面而方后多定行学法所民得经十三之进着等部度家电力里如水化高自二理起小物现实加量"
    "都两体制机当使点从业本去把性好应开它合还因由其些然前外天政四日那社义事平形相全表间样与关各"
    "订单发货退款快递地址支付优惠商品尺寸颜色客服帮助问题谢谢请稍等查询"
)
_PUNCT_ZH = "，。？！、"
_CODE_LINES = (
    "def total(items):",
    "    return sum(item.price * item.qty for item in items)",
    "for order in orders:",
    "    if order.status == 'shipped':",
    "        notify(order.customer_id, order.tracking)",
    "import json, os",
    "data = json.loads(response.text)",
    "print(f'{name}: {value:.2f}')",
    "class Cart:",
    "    def __init__(self):",
    "        self.items = []",
    "SELECT id, status FROM orders WHERE customer_id = 42;",
    "const res = await fetch('/api/orders?page=' + page);",
    "if (!res.ok) throw new Error(res.statusText);",
    "result = [x for x in range(10) if x % 2 == 0]",
    "except KeyError as exc:",
    "    raise ValueError(f'missing field {exc}') from None",
)

# tokens per unit, measured once against cl100k_base on this generator's output
_TOKENS_PER_WORD = 1.10
_TOKENS_PER_HAN = 1.16
_TOKENS_PER_CODE_CHAR = 0.292


@dataclass(frozen=True)
class LengthSummary:
    """Measured token lengths of a sample (with the tokenizer the caller passed)."""

    count: int
    p50: float
    p90: float
    mean: float
    share_chinese: float
    share_code: float


class HistoryGenerator:
    """Seeded generator of OpenAI-style message dicts (``role``, ``content``)."""

    def __init__(self, seed: int = 20261, median_tokens: int = MEDIAN_TOKENS) -> None:
        self.rng = random.Random(seed)
        self.mu = math.log(median_tokens)

    def _target(self) -> int:
        n = round(self.rng.lognormvariate(self.mu, SIGMA))
        return max(MIN_TOKENS, min(MAX_TOKENS, n))

    def _english(self, tokens: int) -> str:
        words = max(1, int(tokens / _TOKENS_PER_WORD))
        out: list[str] = []
        sentence = 0
        for _ in range(words):
            word = self.rng.choice(_WORDS)
            if sentence == 0:
                word = word.capitalize()
            sentence += 1
            if sentence >= self.rng.randint(6, 16):
                word += self.rng.choice(".?!.")
                sentence = 0
            out.append(word)
        return " ".join(out)

    def _chinese(self, tokens: int) -> str:
        chars = max(1, int(tokens / _TOKENS_PER_HAN))
        out: list[str] = []
        for i in range(chars):
            out.append(self.rng.choice(_CHINESE))
            if i % 12 == 11:
                out.append(self.rng.choice(_PUNCT_ZH))
        return "".join(out)

    def _code(self, tokens: int) -> str:
        prose = max(2, tokens // 5)
        budget_chars = max(10, int((tokens - prose) / _TOKENS_PER_CODE_CHAR))
        lines: list[str] = []
        used = 0
        while used < budget_chars:
            line = self.rng.choice(_CODE_LINES)
            lines.append(line)
            used += len(line) + 1
        return self._english(prose) + "\n```python\n" + "\n".join(lines) + "\n```"

    def content(self) -> tuple[str, str]:
        """One message body and its kind (``en``, ``zh`` or ``code``)."""
        tokens = self._target()
        draw = self.rng.random()
        if draw < SHARE_CHINESE:
            return self._chinese(tokens), "zh"
        if draw < SHARE_CHINESE + SHARE_CODE:
            return self._code(tokens), "code"
        return self._english(tokens), "en"

    def message(self, role: str) -> dict[str, str]:
        return {"role": role, "content": self.content()[0]}

    def messages(self, count: int, first_role: str = "user") -> Iterator[dict[str, str]]:
        """``count`` alternating user/assistant messages starting with ``first_role``."""
        role = first_role
        for _ in range(count):
            yield self.message(role)
            role = "assistant" if role == "user" else "user"

    def history(self, count: int) -> list[dict[str, str]]:
        """A stored history of ``count`` messages: the system prompt, then the chat."""
        if count <= 0:
            return []
        return [{"role": "system", "content": SYSTEM_PROMPT}, *self.messages(count - 1)]

    def turns(self, count: int) -> list[tuple[dict[str, str], dict[str, str]]]:
        """``count`` (user message, assistant reply) pairs for timed turns."""
        return [(self.message("user"), self.message("assistant")) for _ in range(count)]


def length_summary(
    messages: Sequence[dict[str, str]], count_tokens: Callable[[str], int]
) -> LengthSummary:
    """Token lengths of message contents measured with ``count_tokens``."""
    lengths = sorted(count_tokens(m["content"]) for m in messages)
    han = sum(1 for m in messages if any("\u4e00" <= c <= "\u9fff" for c in m["content"][:8]))
    code = sum(1 for m in messages if "```" in m["content"])
    n = max(1, len(lengths))
    return LengthSummary(
        count=len(lengths),
        p50=statistics.median(lengths) if lengths else 0.0,
        p90=lengths[int(0.9 * (len(lengths) - 1))] if lengths else 0.0,
        mean=statistics.fmean(lengths) if lengths else 0.0,
        share_chinese=han / n,
        share_code=code / n,
    )
