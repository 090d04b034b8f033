"""Reading a model server's ``/metrics`` text: its KV usage and waiting queue.

Pure (no I/O): :class:`~ctxguard.observe.pressure.PressureMonitor` feeds it each reply.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:token_usage")
WAITING = ("vllm:num_requests_waiting", "sglang:num_queue_reqs")


@dataclass(frozen=True, slots=True)
class Pressure:
    """One reading of the server: KV usage 0-1 and queued requests (None: not served)."""

    kv_usage: float | None
    waiting: float | None
    at: float  # time.monotonic() of the reading


def parse_metrics(text: str) -> tuple[float | None, float | None]:
    """KV usage (the highest over engines/models) and waiting requests (their sum)."""
    usage, waiting, _ = read_metrics(text)
    return usage, waiting


# the metric's name: what a sample line starts with, up to blanks or its label set
_NAME = re.compile(r"[^\s{]+")
# a sample's value as the text format writes one (Go's ParseFloat; NaN and Inf are
# left out after)
_NUMBER = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?", re.ASCII)


def read_metrics(text: str) -> tuple[float | None, float | None, float | None]:
    """:func:`parse_metrics` and the highest KV usage reading past 1 that was left out.

    Lines as the Prometheus text format allows them: tokens apart by any number of
    blanks or tabs, leading and trailing blanks ignored. The KV gauges are fractions
    (vLLM documents both ``kv_cache_usage_perc`` and ``gpu_cache_usage_perc`` as "1
    means 100 percent usage"; SGLang's ``token_usage`` is used/total): a reading past 1
    is no reading ctxguard knows how to take. Read as a fraction it would be a cache
    fuller than full (every budget lowered or refused); read as a percent, a guess
    (1.5: 1.5% or 150%?). It is left out, as a server that does not export the gauge
    would be (the queue still counts), and answered third for the monitor to report.
    """
    usage: float | None = None
    waiting: float | None = None
    past_one: float | None = None
    for line in text.splitlines():
        line = line.strip()
        if not line or line[0] == "#":
            continue
        found = _NAME.match(line)
        if found is None:
            continue
        name = found.group()
        if name not in KV_USAGE and name not in WAITING:
            continue
        rest = line[found.end() :].lstrip()
        if rest[:1] == "{":  # (a label value may hold blanks, braces too: the value
            rest = rest.rpartition("}")[2]  # follows the last brace)
        raw = rest.split()
        if not raw or not _NUMBER.fullmatch(raw[0]):  # float() also reads "1_000" and
            continue  # non-ASCII digits, which no exporter writes: garbage, not a queue
        value = float(raw[0])
        if not math.isfinite(value) or value < 0:  # no usage or queue is negative: a
            continue  # -100 waiting would have cancelled another engine's real queue
        if name in KV_USAGE:
            if value > 1:
                past_one = value if past_one is None else max(past_one, value)
                continue
            usage = value if usage is None else max(usage, value)
        else:
            waiting = value if waiting is None else waiting + value
    return usage, waiting, past_one
