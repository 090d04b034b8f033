"""A summarizer the caller wrote that never returns does not keep the process alive.

The guard times the call out (``summary_timeout``) and goes on, but the call's thread
was a ``ThreadPoolExecutor``'s (``asyncio.to_thread``'s on the async guard), and Python
joins those at exit (``asyncio.run`` joins its default executor's too): the program
finished its work, closed the guard and never exited. The calls now run on daemon
threads (guard/daemon_pool.py). Each case runs in a child process that must exit on
its own; the bound is generous (the child needs about a second).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import private_memory_url

ROOT = Path(__file__).resolve().parents[2]

CHILD = textwrap.dedent(
    """
    import asyncio, sys, threading
    from ctxguard.guard import AsyncGuard, Guard

    calls = []

    def stuck(previous, messages):
        calls.append(1)
        threading.Event().wait()  # never returns
        return "never"

    url, mode = sys.argv[1], sys.argv[2]
    kwargs = dict(counter="approx", limit=400, max_tokens=50, summarizer=stuck,
                  summarize_after=4, summary_timeout=0.2, summary_max_tokens=200)
    if mode == "background":
        kwargs["summary_mode"] = "background"
    user = lambda i: [{"role": "user", "content": f"question {i} " + "about things " * 8}]
    bot = lambda i: {"role": "assistant", "content": f"answer {i} " + "it depends " * 8}

    async def run_async():
        guard = AsyncGuard(url, **kwargs)
        for i in range(8):
            await guard.prepare("s", user(i))
            await guard.complete("s", bot(i))
        audit = await guard.store.read_audit("s")
        await guard.aclose()
        return audit

    if mode == "async":
        audit = asyncio.run(run_async())
    else:
        guard = Guard(url, **kwargs)
        for i in range(8):
            guard.prepare("s", user(i))
            guard.complete("s", bot(i))
        guard.wait_for_summaries()
        audit = guard.store.read_audit("s")
        guard.close()
    failed = [r for r in audit if r["kind"] == "summary_failed" and "timed out" in r["error"]]
    print(f"calls={len(calls)} failed={len(failed)}", flush=True)
    """
)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", ["inline", "background", "async"])
def test_a_process_whose_summarizer_never_returns_still_exits(mode: str) -> None:
    try:
        done = subprocess.run(
            [sys.executable, "-c", CHILD, private_memory_url(), mode],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=ROOT,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the process did not exit within 60 s; it printed {exc.stdout!r}")
    assert done.returncode == 0, done.stderr
    words = dict(w.split("=") for w in done.stdout.split())
    # the summarizer was called and timed out (recorded): the process had a hung thread
    assert int(words["calls"]) >= 1 and int(words["failed"]) >= 1, done.stdout
