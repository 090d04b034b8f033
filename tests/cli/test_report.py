"""report: one self-contained HTML file, checked as text and in real headless Chromium."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from ctxguard.stores.base import SessionStore

from . import png
from .conftest import CHAT, Cli

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
