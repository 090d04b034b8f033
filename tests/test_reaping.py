"""Servers the suite starts die with the run that started them, however it ends.

* A pytest session terminated by SIGTERM (``timeout``, a CI runner) tears its fixtures
  down, so they stop their servers; one killed by SIGKILL leaves the servers to its
  reaper (``tests/reaper.py``), which stops them: a ``redis-server``, a cluster's six
  daemons started by ``scripts/services.sh``, and ``ctxguard serve``'s uvicorn
  supervisor and workers (``tests/reaping_session.py`` starts one of each).
* ``scripts/services.sh start`` interrupted stops what it had started, and ``stop``
  while a ``start`` still runs into the same directory ends that start first: nothing
  is left running in either case.

Processes are known by pid and start time (a pid since reused is another process);
only those these tests started are ever signalled.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from faults.servers import need_redis_server
from reaper import REAPER, alive, start_time

# it signals its own child processes only, but the suite's rule marks every module that signals
pytestmark = pytest.mark.destructive

ROOT = Path(__file__).resolve().parents[1]
SERVICES = ROOT / "scripts" / "services.sh"
GONE_WITHIN = 20.0  # seconds: a generous bound on a loaded 2-core machine

Pids = list[tuple[int, str]]


def wait_for(check: Callable[[], bool], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.1)
    return check()


def still_running(pids: Pids) -> list[int]:
    return [pid for pid, started in pids if alive(pid, started)]


def cleanup(pids: Pids, states: list[Path]) -> None:
    """Stop whatever a failed test left: only the processes it recorded, by pid and
    start time, and the services directories it made."""
    for state in states:
        subprocess.run(["bash", str(SERVICES), "stop", str(state)], timeout=60, check=False)
    for pid in still_running(pids):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


@pytest.fixture
def leftovers(tmp_path: Path) -> Iterator[Pids]:
    """Pids (with start times) a test records; killed afterwards if still running."""
    pids: Pids = []
    yield pids
    cleanup(pids, sorted(tmp_path.rglob("state")))


# pytest's exit status for an interrupted run
INTERRUPTED = 2


@pytest.mark.redis
@pytest.mark.cluster
@pytest.mark.timeout(400)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_a_terminated_test_run_leaves_no_server_running(
    sig: signal.Signals, tmp_path: Path, leftovers: Pids
) -> None:
    need_redis_server()
    out = tmp_path / "out"
    out.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("CTXGUARD_TEST_")}
    env.update(CTXGUARD_REAPING_OUT=str(out), PYTHONPATH=str(ROOT))
    log = tmp_path / "inner.log"
    with log.open("wb") as sink:
        inner = subprocess.Popen(
            [
                sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                "--basetemp", str(tmp_path / "inner"), "tests/reaping_session.py",
            ],
            cwd=ROOT,
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    REAPER.own(inner, group=True)
    try:
        ready = out / "pids"
        if not wait_for(lambda: ready.exists() or inner.poll() is not None, 240):
            pytest.fail("the inner session did not start its servers")
        assert ready.exists(), log.read_text(errors="replace")[-3000:]
        for line in ready.read_text().split("\n"):
            if line:
                pid, started = line.split()
                leftovers.append((int(pid), started))
        # a redis-server, six cluster nodes, the uvicorn supervisor and its two workers
        assert len(leftovers) >= 10, leftovers
        assert still_running(leftovers) == [pid for pid, _ in leftovers]

        inner.send_signal(sig)  # the test process only, as `kill PID` does
        inner.wait(120)
        left = []
        if not wait_for(lambda: not still_running(leftovers), GONE_WITHIN):
            left = still_running(leftovers)
        assert left == [], f"still running {GONE_WITHIN:.0f} s after {sig.name}: {left}"
        if sig == signal.SIGTERM:
            assert inner.returncode == INTERRUPTED, log.read_text(errors="replace")[-3000:]
            assert (out / "torn-down").exists(), "SIGTERM skipped the fixtures' teardown"
    finally:
        if inner.poll() is None:
            os.killpg(inner.pid, signal.SIGKILL)
            inner.wait(30)
        REAPER.release(inner)


def _server_pids(state: Path) -> Pids:
    """The redis-servers running in a folder under ``state`` (their working directory),
    found in /proc: also one whose pid file, or folder, a stop has already removed."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if (proc / "comm").read_text().strip() != "redis-server":
                continue
            if os.readlink(proc / "cwd").startswith(f"{state}/"):
                pids.append((int(proc.name), start_time(int(proc.name))))
    return pids


@pytest.mark.redis
@pytest.mark.timeout(240)
@pytest.mark.parametrize("how", ["interrupted", "stopped while starting"])
def test_services_start_cut_short_leaves_no_server_running(
    how: str, tmp_path: Path, leftovers: Pids
) -> None:
    need_redis_server()
    if not Path("/proc/self/cwd").exists():
        pytest.skip("finds the servers by their working directory in /proc (Linux)")
    state = (tmp_path / "state").resolve()
    env = {k: v for k, v in os.environ.items() if not k.startswith("CTXGUARD_TEST_")}
    env["PYTHON"] = sys.executable
    starter = subprocess.Popen(
        ["bash", str(SERVICES), "start", str(state), "cluster"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    REAPER.own(starter, group=True)
    try:
        # Two of the six nodes up: the start is well under way.
        assert wait_for(lambda: len(_server_pids(state)) >= 2, 120), "no node started"
        leftovers.extend(_server_pids(state))
        if how == "interrupted":
            starter.send_signal(signal.SIGTERM)
        else:
            subprocess.run(["bash", str(SERVICES), "stop", str(state)], timeout=120, check=True)
        starter.wait(120)
        # what the start went on to start before it ended, if anything
        leftovers.extend(p for p in _server_pids(state) if p not in leftovers)
        left = []
        if not wait_for(lambda: not still_running(leftovers), GONE_WITHIN):
            left = still_running(leftovers)
        assert left == [], f"still running after the start was {how}: {left}"
        assert not state.exists() or not list(state.rglob("redis-*.pid"))
    finally:
        if starter.poll() is None:
            os.killpg(starter.pid, signal.SIGKILL)
            starter.wait(30)
        REAPER.release(starter)
