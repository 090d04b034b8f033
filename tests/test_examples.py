"""The examples run as a newcomer runs them (they are documentation that must not rot)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@pytest.mark.parametrize("name", ["quickstart.py", "async_backend.py"])
def test_example_runs(name: str) -> None:
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / name)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr


def test_quickstart_shows_the_window_sliding_and_a_summary() -> None:
    out = subprocess.run(
        [sys.executable, str(EXAMPLES / "quickstart.py")],
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    assert "Context limit: 592 tokens per request" in out  # Llama-3.1-8B, 24 GiB, 64 in flight
    assert "Summary v" in out and "Audit of turn 12" in out
