"""report: one self-contained HTML file, checked as text and in real headless Chromium
(charted turns, and the prefix-cache columns read by header from the rendered table)."""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from ctxguard import Guard
from ctxguard.stores.base import SessionStore

from . import png
from .conftest import CHAT, Cli, long_text

pytestmark = pytest.mark.redis

CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1200,900",
)


# What scripts/install-chromium.sh installs, lightest first; $CTXGUARD_CHROMIUM overrides.
BROWSERS = ("chromium-headless-shell", "chromium")


@pytest.fixture(scope="session")
def chromium() -> str:
    """Path to a headless Chromium; missing is a failure under CI=true."""
    candidates = [os.environ.get("CTXGUARD_CHROMIUM", "")]
    candidates += [f"/usr/bin/{name}" for name in BROWSERS]
    candidates += [shutil.which(name) or "" for name in BROWSERS]
    path = next((c for c in candidates if c and os.access(c, os.X_OK)), None)
    if path is None:
        message = "no headless Chromium is installed (run scripts/install-chromium.sh)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return path


@pytest.fixture
def report(run: Cli, sessions: None, tmp_path: Path) -> Path:
    out = tmp_path / "report.html"
    result = run("report", CHAT, "--html", str(out))
    assert result.exit_code == 0, result.stderr
    return out


def _turns(store: SessionStore) -> list[dict[str, object]]:
    return [r for r in store.read_audit(CHAT) if r["kind"] == "request"]


def test_report_is_self_contained_and_charts_every_turn(report: Path, store: SessionStore) -> None:
    page = report.read_text()
    urls = set(re.findall(r"https?://[^\s\"'<>]+", page))
    assert urls <= {"http://www.w3.org/2000/svg"}  # the SVG namespace, never fetched
    assert "<link" not in page and " src=" not in page
    turns = _turns(store)
    charted = re.findall(r'<circle class="point" data-turn="(\d+)"', page)
    assert [int(t) for t in charted] == [r["turn"] for r in turns]
    dropped = {r["turn"] for r in turns if r.get("dropped")}
    summarized = {r["turn"] for r in turns if r.get("summary_version")}
    assert dropped and summarized
    assert {int(t) for t in re.findall(r'mark-dropped" data-mark-turn="(\d+)"', page)} == dropped
    assert {int(t) for t in re.findall(r'mark-summary" data-mark-turn="(\d+)"', page)} == summarized
    assert len(re.findall(r'<tr id="turn-\d+"', page)) == len(turns)
    assert CHAT.replace("[", "") in page.replace("[", "")


def _chromium(chromium: str, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    profile = tmp_path / "profile"
    command = [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)


def test_report_renders_in_headless_chromium(
    report: Path, store: SessionStore, chromium: str, tmp_path: Path
) -> None:
    expected = len(_turns(store))
    dom = _chromium(chromium, tmp_path, "--dump-dom", report.as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    points = re.findall(r'<circle class="point" data-turn="\d+"', dom.stdout)
    assert len(points) == expected
    # the inline script ran in the browser and counted the same points
    assert f'data-rendered-turns="{expected}"' in dom.stdout
    assert f"{expected} turns charted" in dom.stdout

    shot = tmp_path / "report.png"
    result = _chromium(chromium, tmp_path, f"--screenshot={shot}", report.as_uri())
    assert result.returncode == 0 and shot.exists(), result.stderr[-2000:]
    width, height, _ = png.decode(shot.read_bytes())
    assert (width, height) == (1200, 900)
    seen = png.colours(shot.read_bytes())
    background = max(seen.values())
    assert len(seen) > 20, "screenshot is (nearly) one colour"
    assert background < 0.97 * sum(seen.values())
    blue = sum(n for px, n in seen.items() if px[2] > 180 and px[0] < 60)
    assert blue > 0, "no pixels of the tokens line/points (#0969da)"


# Run in the browser after the table: per row of #turns, each cell's rendered text
# (innerText follows the CSS) and whether it takes space on the page, by column.
_READ_TABLE = """<script>
(function () {
  var rows = Array.prototype.map.call(document.querySelectorAll("#turns tr"), function (tr) {
    return Array.prototype.map.call(tr.cells, function (cell) {
      var box = cell.getBoundingClientRect();
      return [cell.innerText.trim(), box.width > 0 && box.height > 0];
    });
  });
  var out = document.createElement("pre");
  out.id = "rendered-table";
  out.textContent = JSON.stringify(rows);
  document.body.appendChild(out);
})();
</script>
</body>"""


@pytest.fixture(params=["sliding", "stable"])
def prefix_session(request: pytest.FixtureRequest, redis_url: str, redis_namespace: str) -> str:
    """A cl100k session (estimate in its records) under one policy; the report adds the other."""
    policy = request.param
    guard = Guard(
        redis_url,
        counter="tiktoken:cl100k_base",
        limit=1400,
        namespace=redis_namespace,
        max_tokens=100,
        prefix_block_size=16,
        window_policy=policy,
    )
    session = f"rendered-{policy}"
    try:
        guard.append(session, [{"role": "system", "content": "You are terse. " * 8}])
        for turn in range(12):
            req = guard.prepare(session, [{"role": "user", "content": long_text(turn)}])
            reply = {"role": "assistant", "content": long_text(turn, 30)}
            guard.complete(session, reply, prepared=req)
    finally:
        guard.close()
    return session


def test_chromium_renders_sent_reused_and_prefilled_for_both_policies(
    run: Cli, store: SessionStore, prefix_session: str, chromium: str, tmp_path: Path
) -> None:
    out = tmp_path / "report.html"
    result = run("report", prefix_session, "--html", str(out))
    assert result.exit_code == 0, result.stderr
    page = out.read_text()
    assert page.count("</body>") == 1
    probe = tmp_path / "probe.html"
    probe.write_text(page.replace("</body>", _READ_TABLE))
    dom = _chromium(chromium, tmp_path, "--dump-dom", probe.as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    found = re.search(r'<pre id="rendered-table">(.*?)</pre>', dom.stdout, re.S)
    assert found is not None, "the table reader did not run"
    head, *body = json.loads(html.unescape(found[1]))
    assert all(visible for _, visible in head) and all(v for row in body for _, v in row)
    column = {text: index for index, (text, _) in enumerate(head)}

    ours = prefix_session.removeprefix("rendered-")
    other = "stable" if ours == "sliding" else "sliding"
    records = [r for r in store.read_audit(prefix_session) if r["kind"] == "request"]
    replayed = run.json("replay", prefix_session, "--policy", other)
    assert len(body) == len(records) == len(replayed)
    shown: dict[str, list[int]] = {}
    for row, record, turn in zip(body, records, replayed, strict=True):

        def cell(name: str, row: list[list[Any]] = row) -> int:
            value = int(row[column[name]][0])
            shown.setdefault(name, []).append(value)
            return value

        assert cell("turn") == record["turn"]
        assert cell("prompt tokens") == record["tokens"] == turn["recorded_tokens"]
        reused, prefilled = cell(f"{ours}: reused"), cell(f"{ours}: prefilled")
        assert (reused, prefilled) == (turn["recorded_reused"], turn["recorded_prefilled"])
        if "reused" in record:  # the guard's own estimate, as recorded
            assert (reused, prefilled) == (record["reused"], record["prefilled"])
        assert reused + prefilled == record["tokens"]
        assert cell(f"{other}: tokens sent") == turn["replayed_tokens"]
        assert cell(f"{other}: reused") == turn["replayed_reused"]
        assert cell(f"{other}: prefilled") == turn["replayed_prefilled"]
    # the page shows the saving: the stable window re-prefills less than the sliding one
    stable = shown["stable: prefilled"][1:]
    sliding = shown["sliding: prefilled"][1:]
    assert sum(stable) < sum(sliding)
    assert any(r.get("dropped") for r in records)
