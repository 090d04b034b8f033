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


@dataclass(frozen=True, slots=True)
class Page:
    """What one ``/metrics`` reply says, for one model (or for every line of the page)."""

    kv_usage: float | None  # the highest KV usage (0-1) over engines
    waiting: float | None  # the requests waiting, summed over engines
    past_one: float | None  # the highest KV reading past 1, left out
    models: tuple[str, ...]  # the model_name values of the pressure gauges, sorted


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
    page = read_page(text)
    return page.kv_usage, page.waiting, page.past_one


def read_page(text: str, model: str | None = None) -> Page:
    """:func:`read_metrics` of the lines whose ``model_name`` label is ``model`` (None:
    every line), and every ``model_name`` the pressure gauges carry (vLLM and SGLang
    label each sample with the model it serves; one page can hold several)."""
    usage: float | None = None
    waiting: float | None = None
    past_one: float | None = None
    models: set[str] = set()
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
        served: str | None = None
        if rest[:1] == "{":  # (a label value may hold blanks, braces too: the value
            labels, _, rest = rest[1:].rpartition("}")  # follows the last brace)
            served = _model_name(labels)
        raw = rest.split()
        if not raw or not _NUMBER.fullmatch(raw[0]):  # float() also reads "1_000" and
            continue  # non-ASCII digits, which no exporter writes: garbage, not a queue
        value = float(raw[0])
        if not math.isfinite(value) or value < 0:  # no usage or queue is negative: a
            continue  # -100 waiting would have cancelled another engine's real queue
        if served is not None:
            models.add(served)
        if model is not None and served != model:
            continue
        if name in KV_USAGE:
            if value > 1:
                past_one = value if past_one is None else max(past_one, value)
                continue
            usage = value if usage is None else max(usage, value)
        else:
            waiting = value if waiting is None else waiting + value
    return Page(usage, waiting, past_one, tuple(sorted(models)))


# one label of a sample's label set: name="value", the value with \\, \" and \n escaped
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')
_UNESCAPE = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


def _model_name(labels: str) -> str | None:
    """The ``model_name`` label's value in a sample's label set (None: not there)."""
    if "model_name" not in labels:  # (most lines: no regex run)
        return None
    at = 0
    while (found := _LABEL.match(labels, at)) is not None:
        if found.group(1) == "model_name":
            return re.sub(r"\\.", lambda m: _UNESCAPE.get(m.group(), m.group()), found.group(2))
        at = found.end()
    return None
