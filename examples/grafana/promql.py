"""A tiny PromQL evaluator for exactly the forms ctxguard's dashboard uses.

Not Prometheus: enough of it to draw the dashboard's panels from samples taken in
a test run (``render.py``). Supported, and nothing else (anything else is a
:class:`PromQLError`, so a new panel cannot be drawn wrong without notice):

* selectors ``name`` and ``name{label="value", ...}`` (``=`` only);
* ``rate(selector[$__rate_interval])`` over the samples taken;
* ``sum(...)``, ``max(...)``, ``sum by (a, b) (...)``;
* ``histogram_quantile(q, <vector with an le label>)``, interpolated as Prometheus does;
* ``+ - * /`` between vectors whose label sets match one to one (or a number),
  parentheses.

``rate`` is the increase over the window divided by the window's seconds; a series
missing at the window's start counts from 0 (prometheus_client creates a labelled
series at its first increment), and counters never reset within a run.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

Labels = frozenset[tuple[str, str]]
Vector = dict[Labels, float]
# a series: (sample name, labels) -> [(time, value)] in time order
Series = Mapping[tuple[str, Labels], Sequence[tuple[float, float]]]

TOKEN = re.compile(
    r"\s*(?:(?P<num>\d+(?:\.\d+)?)|(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)"
    r'|(?P<str>"[^"]*")|(?P<range>\[[^\]]+\])|(?P<op>[(){},=+\-*/]))'
)


class PromQLError(ValueError):
    """An expression outside the supported forms."""


@dataclass(frozen=True)
class Node:
    kind: str  # selector, rate, agg, quantile, binary, number
    name: str = ""
    matchers: tuple[tuple[str, str], ...] = ()
    by: tuple[str, ...] = ()
    args: tuple[Node, ...] = ()
    value: float = 0.0


def tokens(expr: str) -> list[str]:
    out, pos = [], 0
    expr = expr.strip()
    while pos < len(expr):
        match = TOKEN.match(expr, pos)
        if match is None or match.end() == pos:
            raise PromQLError(f"cannot read {expr[pos : pos + 20]!r}")
        out.append(match.group().strip())
        pos = match.end()
    return [t for t in out if t]


class Parser:
    def __init__(self, expr: str) -> None:
        self.expr, self.toks, self.i = expr, tokens(expr), 0

    def peek(self) -> str:
        return self.toks[self.i] if self.i < len(self.toks) else ""

    def take(self, want: str | None = None) -> str:
        tok = self.peek()
        if not tok or (want is not None and tok != want):
            raise PromQLError(f"expected {want or 'more'} at {tok!r} in {self.expr!r}")
        self.i += 1
        return tok

    def parse(self) -> Node:
        node = self.sum_()
        if self.peek():
            raise PromQLError(f"unexpected {self.peek()!r} in {self.expr!r}")
        return node

    def sum_(self) -> Node:
        node = self.product()
        while self.peek() in ("+", "-"):
            node = Node("binary", name=self.take(), args=(node, self.product()))
        return node

    def product(self) -> Node:
        node = self.factor()
        while self.peek() in ("*", "/"):
            node = Node("binary", name=self.take(), args=(node, self.factor()))
        return node

    def factor(self) -> Node:
        tok = self.take()
        if tok == "(":
            node = self.sum_()
            self.take(")")
            return node
        if re.fullmatch(r"\d+(?:\.\d+)?", tok):
            return Node("number", value=float(tok))
        if tok in ("sum", "max"):
            by: tuple[str, ...] = ()
            if self.peek() == "by":
                self.take()
                by = self.labels()
            self.take("(")
            inner = self.sum_()
            self.take(")")
            return Node("agg", name=tok, by=by, args=(inner,))
        if tok == "rate":
            self.take("(")
            selector = self.selector(self.take())
            window = self.take()
            if window != "[$__rate_interval]":
                raise PromQLError(f"rate window {window} (only [$__rate_interval])")
            self.take(")")
            return Node("rate", args=(selector,))
        if tok == "histogram_quantile":
            self.take("(")
            q = float(self.take())
            self.take(",")
            inner = self.sum_()
            self.take(")")
            return Node("quantile", value=q, args=(inner,))
        if re.fullmatch(r"[A-Za-z_:][A-Za-z0-9_:]*", tok) and self.peek() != "(":
            return self.selector(tok)
        raise PromQLError(f"unsupported {tok!r} in {self.expr!r}")

    def labels(self) -> tuple[str, ...]:
        self.take("(")
        names = [self.take()]
        while self.peek() == ",":
            self.take()
            names.append(self.take())
        self.take(")")
        return tuple(names)

    def selector(self, name: str) -> Node:
        matchers: list[tuple[str, str]] = []
        if self.peek() == "{":
            self.take()
            while self.peek() != "}":
                label = self.take()
                self.take("=")
                value = self.take()
                if not value.startswith('"'):
                    raise PromQLError(f"matcher value {value!r} in {self.expr!r}")
                matchers.append((label, value.strip('"')))
                if self.peek() == ",":
                    self.take()
            self.take("}")
        return Node("selector", name=name, matchers=tuple(matchers))


def parse(expr: str) -> Node:
    return Parser(expr).parse()


class Evaluator:
    """Evaluates parsed expressions at a time ``t`` over ``series`` (rate over ``window`` s)."""

    def __init__(self, series: Series, window: float) -> None:
        self.series, self.window = series, window

    def at(self, node: Node, t: float) -> Vector:
        handler: Callable[[Node, float], Vector] = getattr(self, "_" + node.kind)
        return handler(node, t)

    def _select(self, node: Node) -> list[tuple[Labels, Sequence[tuple[float, float]]]]:
        want = set(node.matchers)
        return [
            (labels, points)
            for (name, labels), points in self.series.items()
            if name == node.name and want <= labels
        ]

    @staticmethod
    def _value(points: Sequence[tuple[float, float]], t: float) -> float | None:
        found = None
        for when, value in points:
            if when > t:
                break
            found = value
        return found

    def _selector(self, node: Node, t: float) -> Vector:
        out: Vector = {}
        for labels, points in self._select(node):
            value = self._value(points, t)
            if value is not None:
                out[labels] = value
        return out

    def _rate(self, node: Node, t: float) -> Vector:
        out: Vector = {}
        for labels, points in self._select(node.args[0]):
            now = self._value(points, t)
            if now is None:
                continue
            before = self._value(points, t - self.window) or 0.0
            out[labels] = (now - before) / self.window
        return out

    def _agg(self, node: Node, t: float) -> Vector:
        groups: dict[Labels, list[float]] = {}
        for labels, value in self.at(node.args[0], t).items():
            key = frozenset((k, v) for k, v in labels if k in node.by)
            groups.setdefault(key, []).append(value)
        pick = sum if node.name == "sum" else max
        return {key: float(pick(values)) for key, values in groups.items()}

    def _quantile(self, node: Node, t: float) -> Vector:
        buckets: dict[Labels, list[tuple[float, float]]] = {}
        for labels, value in self.at(node.args[0], t).items():
            le = dict(labels).get("le")
            if le is None:
                raise PromQLError("histogram_quantile over a vector without le")
            key = frozenset((k, v) for k, v in labels if k != "le")
            buckets.setdefault(key, []).append((float(le), value))
        return {key: bucket_quantile(node.value, sorted(b)) for key, b in buckets.items()}

    def _binary(self, node: Node, t: float) -> Vector:
        left, right = (self.at(arg, t) for arg in node.args)
        if node.args[1].kind == "number":
            right = dict.fromkeys(left, node.args[1].value)
        return {k: apply(node.name, v, right[k]) for k, v in left.items() if k in right}

    def _number(self, node: Node, t: float) -> Vector:
        return {frozenset(): node.value}


def apply(op: str, a: float, b: float) -> float:
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    return a / b if b else math.nan  # Prometheus: NaN (0/0) or Inf; a gap on the graph


def bucket_quantile(q: float, buckets: Sequence[tuple[float, float]]) -> float:
    """Prometheus's ``bucketQuantile``: linear interpolation inside the bucket holding rank q."""
    if len(buckets) < 2 or buckets[-1][0] != math.inf:
        return math.nan
    total = buckets[-1][1]
    if total == 0:
        return math.nan
    rank = q * total
    b = next(i for i, (_, count) in enumerate(buckets) if count >= rank)
    if b == len(buckets) - 1:
        return buckets[-2][0]
    if b == 0 and buckets[0][0] <= 0:
        return buckets[0][0]
    start, end, count = 0.0, buckets[b][0], buckets[b][1]
    if b > 0:
        start = buckets[b - 1][0]
        count -= buckets[b - 1][1]
        rank -= buckets[b - 1][1]
    return start + (end - start) * (rank / count) if count else math.nan
