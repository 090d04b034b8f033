"""``ctxguard report``: one self-contained HTML file per session.

The chart is inline SVG drawn here in Python, so the file needs no network,
no CDN and no JavaScript to show it (the small inline script only adds
click-to-highlight), and tests can check it without a browser too.
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import resources
from string import Template
from typing import Any

import click

from ctxguard.cli.common import (
    EXIT_CODES_HELP,
    handles_errors,
    note,
    opened_store,
    store_options,
    writable_output,
)
from ctxguard.cli.quoting import shown_id
from ctxguard.cli.report_prefix import PrefixColumns, PrefixRow, prefix_columns
from ctxguard.cli.snapshot import Snapshot, dropped_ranges, format_ranges, require_snapshot
from ctxguard.guard.sent import sent_count

WIDTH, HEIGHT = 960, 380
LEFT, RIGHT, TOP, BOTTOM = 64, 16, 16, 40

_EPILOG = f"""\b
Examples:
  ctxguard report chat-123 --html chat-123.html
  ctxguard report chat-123 --html /tmp/r.html --url redis://localhost:6379/0

{EXIT_CODES_HELP}
"""


@dataclass(frozen=True)
class TurnPoint:
    """What the chart and the table show for one request."""

    turn: int
    tokens: int
    limit: int
    reserved: int
    margin: int
    sent: int
    dropped: str
    summary_version: int
    decisions: str
    prefix: PrefixRow | None = None

    @property
    def prompt_budget(self) -> int:
        return self.limit - self.reserved - self.margin

    @property
    def over(self) -> bool:
        return self.tokens > self.prompt_budget


@click.command("report", epilog=_EPILOG)
@click.argument("session")
@click.option("--html", "html_path", required=True, help="Output HTML file.")
@click.option(
    "--counter",
    "counter_spec",
    help="Counter with token ids for the prefix-cache columns (default: the recorded one).",
)
@store_options
@handles_errors
def report_command(
    session: str,
    html_path: str,
    counter_spec: str | None,
    url: str,
    namespace: str | None,
    tenant: str | None,
) -> None:
    """Write an HTML report: prompt tokens per turn against the limit, drops, summaries,
    and per turn the tokens sent, reused and prefilled under this policy and the other."""
    with opened_store(url, namespace, tenant) as store:
        snap = require_snapshot(store, session)
    columns = prefix_columns(snap, counter_spec)
    page = render_report(snap, columns)
    with writable_output(html_path) as handle:
        handle.write(page)
    if columns.why_missing:
        note(f"prefix-cache columns: {columns.why_missing}")
    note(f"wrote {html_path} ({len(snap.requests)} turns)")


def turn_points(snap: Snapshot, columns: PrefixColumns | None = None) -> list[TurnPoint]:
    rows = columns.rows if columns is not None else []
    if len(rows) != len(snap.requests):
        return [_point(r) for r in snap.requests]
    return [_point(r, row) for r, row in zip(snap.requests, rows, strict=True)]


def _point(record: dict[str, Any], prefix: PrefixRow | None = None) -> TurnPoint:
    dropped = format_ranges(dropped_ranges(record))
    return TurnPoint(
        turn=int(record.get("turn") or 0),
        tokens=int(record.get("tokens") or 0),
        limit=int(record.get("limit") or 0),
        reserved=int(record.get("reserved_output") or 0),
        margin=int(record.get("safety_margin") or 0),
        sent=sent_count(record),
        dropped=dropped,
        summary_version=int(record.get("summary_version") or 0),
        decisions=", ".join(str(d.get("policy")) for d in record.get("decisions") or []),
        prefix=prefix,
    )


def render_report(snap: Snapshot, columns: PrefixColumns | None = None) -> str:
    points = turn_points(snap, columns)
    info = snap.info
    line = (
        f"{info.message_count} messages, {info.token_total} stored tokens, "
        f"{len(points)} turns, counter {info.counter or '-'}"
    )
    template = Template(
        resources.files("ctxguard.cli").joinpath("report_template.html").read_text()
    )
    return template.substitute(
        title=html.escape(f"ctxguard report: {shown_id(snap.session_id)}"),
        session=html.escape(shown_id(snap.session_id)),
        summary_line=html.escape(line),
        generated=datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%SZ"),
        chart=render_chart(points),
        table=render_table(points, columns),
        turn_count=str(len(points)),
    )


# -- the chart ----------------------------------------------------------------


class _Scale:
    """Maps turn index and token counts to SVG coordinates."""

    def __init__(self, count: int, top_value: int) -> None:
        self.count = max(count, 1)
        self.top_value = max(top_value, 1)

    def x(self, index: int) -> float:
        span = WIDTH - LEFT - RIGHT
        if self.count == 1:
            return LEFT + span / 2
        return LEFT + span * index / (self.count - 1)

    def y(self, value: int) -> float:
        return TOP + (HEIGHT - TOP - BOTTOM) * (1 - value / self.top_value)


def render_chart(points: list[TurnPoint]) -> str:
    top = max([p.limit for p in points] + [p.tokens for p in points] + [1])
    scale = _Scale(len(points), int(top * 1.08) + 1)
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="prompt tokens per turn">',
        f'<rect x="0" y="0" width="{WIDTH}" height="{HEIGHT}" fill="#ffffff"/>',
        *_axes(scale, points),
        _line(scale, [p.limit for p in points], "#cf222e", "6 4", "limit"),
        _line(scale, [p.prompt_budget for p in points], "#9a6700", "2 3", "prompt-budget"),
        _line(scale, [p.tokens for p in points], "#0969da", "", "tokens"),
        _line(
            scale,
            _known([p.prefix.prefilled if p.prefix else None for p in points]),
            "#1a7f37",
            "",
            "prefilled",
        ),
        _line(
            scale,
            _known([p.prefix.alt_prefilled if p.prefix else None for p in points]),
            "#1a7f37",
            "4 3",
            "alt-prefilled",
        ),
        *(_marks(scale, i, p) for i, p in enumerate(points)),
        *(_dot(scale, i, p) for i, p in enumerate(points)),
        "</svg>",
    ]
    return "\n".join(parts)


def _known(values: list[int | None]) -> list[int]:
    """A series drawn only when every turn has its number."""
    known = [v for v in values if v is not None]
    return known if len(known) == len(values) else []


def _axes(scale: _Scale, points: list[TurnPoint]) -> list[str]:
    out = []
    for step in range(6):
        value = scale.top_value * step // 5
        y = scale.y(value)
        out.append(
            f'<line x1="{LEFT}" y1="{y:.1f}" x2="{WIDTH - RIGHT}" y2="{y:.1f}" stroke="#d0d7de"/>'
        )
        out.append(f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{value}</text>')
    every = max(1, len(points) // 20)
    for index, point in enumerate(points):
        if index % every == 0:
            out.append(
                f'<text x="{scale.x(index):.1f}" y="{HEIGHT - BOTTOM + 16}" '
                f'text-anchor="middle">{point.turn}</text>'
            )
    out.append(
        f'<text x="{(WIDTH + LEFT) / 2:.0f}" y="{HEIGHT - 6}" text-anchor="middle">turn</text>'
    )
    return out


def _line(scale: _Scale, values: list[int], color: str, dash: str, name: str) -> str:
    if not values:
        return ""
    coords = " ".join(f"{scale.x(i):.1f},{scale.y(v):.1f}" for i, v in enumerate(values))
    dashed = f' stroke-dasharray="{dash}"' if dash else ""
    return (
        f'<polyline class="series-{name}" points="{coords}" fill="none" '
        f'stroke="{color}" stroke-width="2"{dashed}/>'
    )


def _marks(scale: _Scale, index: int, point: TurnPoint) -> str:
    """A triangle above turns that dropped messages, a diamond where a summary was sent."""
    x, y = scale.x(index), scale.y(point.tokens)
    out = []
    if point.dropped:
        out.append(
            f'<polygon class="mark-dropped" data-mark-turn="{point.turn}" '
            f'points="{x:.1f},{y - 16:.1f} {x - 6:.1f},{y - 6:.1f} {x + 6:.1f},{y - 6:.1f}" '
            f'fill="#bc4c00"><title>turn {point.turn}: dropped {point.dropped}</title></polygon>'
        )
    if point.summary_version:
        base = HEIGHT - BOTTOM - 4
        out.append(
            f'<polygon class="mark-summary" data-mark-turn="{point.turn}" '
            f'points="{x:.1f},{base - 12} {x + 6:.1f},{base - 6} '
            f'{x:.1f},{base} {x - 6:.1f},{base - 6}" '
            f'fill="#8250df"><title>turn {point.turn}: summary v{point.summary_version} sent'
            "</title></polygon>"
        )
    return "".join(out)


def _dot(scale: _Scale, index: int, point: TurnPoint) -> str:
    color = "#cf222e" if point.over else "#0969da"
    label = f"turn {point.turn}: {point.tokens} prompt tokens, limit {point.limit}"
    return (
        f'<circle class="point" data-turn="{point.turn}" data-tokens="{point.tokens}" '
        f'cx="{scale.x(index):.1f}" cy="{scale.y(point.tokens):.1f}" r="5" fill="{color}">'
        f"<title>{html.escape(label)}</title></circle>"
    )


# -- the table ----------------------------------------------------------------


def render_table(points: list[TurnPoint], columns: PrefixColumns | None = None) -> str:
    ours = columns.recorded if columns else "recorded"
    other = columns.alternative if columns else "alternative"
    head = (
        "<tr><th>turn</th><th>prompt tokens</th><th>reserved</th><th>margin</th>"
        "<th>limit</th><th>headroom</th><th>sent</th><th class='left'>dropped</th>"
        "<th>summary</th><th class='left'>decisions</th>"
        f"<th>{ours}: reused</th><th>{ours}: prefilled</th>"
        f"<th>{other}: tokens sent</th><th>{other}: reused</th><th>{other}: prefilled</th></tr>"
    )
    rows = [_row(p) for p in points]
    return f'<table id="turns">\n{head}\n' + "\n".join(rows) + "\n</table>"


def _row(p: TurnPoint) -> str:
    tags = []
    if p.over:
        tags.append('<span class="tag over">over</span>')
    if p.dropped:
        tags.append(f'<span class="tag dropped">{html.escape(p.dropped)}</span>')
    summary = f'<span class="tag summary">v{p.summary_version}</span>' if p.summary_version else ""
    cells = [
        str(p.turn),
        str(p.tokens),
        str(p.reserved),
        str(p.margin),
        str(p.limit),
        str(p.prompt_budget - p.tokens),
        str(p.sent),
    ]
    tds = "".join(f"<td>{c}</td>" for c in cells)
    css = ' class="over"' if p.over else ""
    return (
        f'<tr id="turn-{p.turn}"{css}>{tds}<td class="left">{" ".join(tags) or "-"}</td>'
        f'<td>{summary or "-"}</td><td class="left">{html.escape(p.decisions) or "-"}</td>'
        f"{_prefix_cells(p.prefix)}</tr>"
    )


def _prefix_cells(row: PrefixRow | None) -> str:
    """reused, prefilled (recorded policy), then tokens sent, reused, prefilled (the other)."""
    if row is None:
        return "<td>-</td>" * 5
    source = "record" if row.from_record else "model"
    values = (row.reused, row.prefilled, row.alt_tokens, row.alt_reused, row.alt_prefilled)
    names = ("reused", "prefilled", "alt-tokens", "alt-reused", "alt-prefilled")
    cells = [
        f'<td class="{name}" data-source="{source}">{"-" if v is None else v}</td>'
        if index < 2
        else f'<td class="{name}">{"-" if v is None else v}</td>'
        for index, (name, v) in enumerate(zip(names, values, strict=True))
    ]
    return "".join(cells)
