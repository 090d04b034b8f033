"""Servers a test run starts die with it, however it dies (SIGTERM, SIGKILL, a crash).

A test process that starts a server (a ``redis-server``, ``ctxguard serve``, the LiteLLM
proxy, a cluster by ``scripts/services.sh``) tells its *reaper* about it: one watchdog
process per test process, started on first use, in a session of its own (so a signal to
the test run's process group, as ``timeout`` and Ctrl-C send, does not reach it). The
watchdog reads its orders from a pipe whose only writer is the test process; when that
process is gone, by any death, the pipe reads EOF and the watchdog stops what is still
registered: each process (or process group) by SIGTERM, then SIGKILL, and each
``services.sh`` state directory by ``services.sh stop``. A process is known by its pid
AND its start time, so a pid the system has since given to another process is never
signalled. What a fixture stops itself it releases, so a normal run leaves the watchdog
nothing to do.

``scripts/test`` uses the same watchdog for the services it starts
(``python tests/reaper.py`` reading from a pipe the script holds). Standard library only.

Orders, one a line: ``proc PID START GROUP`` / ``release PID START`` (GROUP 1: signal
the process group PID leads) and ``services DIR`` / ``released DIR``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SERVICES = ROOT / "scripts" / "services.sh"
GRACE_SECONDS = 5.0


def start_time(pid: int) -> str:
    """The process's start time (clock ticks after boot, ``/proc/PID/stat`` field 22),
    "-" where there is no ``/proc``; "" when there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return "" if Path("/proc/self/stat").exists() else "-"
    except OSError:
        return ""
    return stat.rsplit(")", 1)[1].split()[19]


def alive(pid: int, started: str) -> bool:
    """``pid`` is still the process that started at ``started``, and not a zombie."""
    now = start_time(pid)
    if now == "-":  # no /proc: the pid alone
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    if not now or now != started:
        return False
    with contextlib.suppress(OSError):
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        return state not in ("Z", "X")
    return False


# -- the client side: the test process -------------------------------------------------


class Reaper:
    """The test process's end of the pipe to its watchdog (started on first use)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pid = 0  # the process the watchdog watches (a fork needs its own)
        self._pipe: int | None = None
        self._watchdog: subprocess.Popen[bytes] | None = None

    def _send(self, line: str) -> None:
        with self._lock:
            if self._pid != os.getpid():
                self._start()
            assert self._pipe is not None
            with contextlib.suppress(BrokenPipeError):  # a dead watchdog: nothing to do
                os.write(self._pipe, (line + "\n").encode())

    def _start(self) -> None:
        read, write = os.pipe()  # neither end inherited by other children (PEP 446)
        try:
            self._watchdog = subprocess.Popen(
                [sys.executable, __file__],
                stdin=read,
                stdout=subprocess.DEVNULL,
                start_new_session=True,
            )
        finally:
            os.close(read)
        self._pipe, self._pid = write, os.getpid()

    def own(self, proc: subprocess.Popen[bytes] | subprocess.Popen[str], group: bool) -> None:
        """Stop ``proc`` (its process group, if ``group``: start it with
        ``start_new_session=True``) if this process dies first."""
        self._send(f"proc {proc.pid} {start_time(proc.pid) or '-'} {int(group)}")

    def release(self, proc: subprocess.Popen[bytes] | subprocess.Popen[str]) -> None:
        self._send(f"release {proc.pid}")

    def own_services(self, state: Path) -> None:
        """Run ``services.sh stop STATE`` if this process dies first."""
        self._send(f"services {state}")

    def release_services(self, state: Path) -> None:
        self._send(f"released {state}")


REAPER = Reaper()


# -- the watchdog ------------------------------------------------------------------------


def _signal(pid: int, group: bool, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if group:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def reap(procs: dict[int, tuple[str, bool]], services: list[str]) -> None:
    """SIGTERM every registered process still alive (its group, for a group leader),
    SIGKILL what is left after a grace period, then stop every services directory."""
    live = {pid: group for pid, (started, group) in procs.items() if alive(pid, started)}
    for pid, group in live.items():
        _signal(pid, group, signal.SIGTERM)
    deadline = time.monotonic() + GRACE_SECONDS
    while time.monotonic() < deadline:
        left = [
            pid
            for pid, group in live.items()
            if alive(pid, procs[pid][0]) or (group and _group_alive(pid))
        ]
        if not left:
            break
        time.sleep(0.1)
    for pid, group in live.items():
        if group:
            # The group outlives its leader (uvicorn's workers): what is left of it.
            # A pgid is not handed out again while any process of the group lives.
            _signal(pid, True, signal.SIGKILL)
        elif alive(pid, procs[pid][0]):
            _signal(pid, False, signal.SIGKILL)
    for state in services:
        subprocess.run(
            ["bash", str(SERVICES), "stop", state],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=60,
            check=False,
        )


def watch(orders: object) -> None:
    """Follow the orders on ``orders`` (a binary file) until EOF, then reap."""
    procs: dict[int, tuple[str, bool]] = {}
    services: list[str] = []
    for raw in orders:  # type: ignore[attr-defined]
        verb, _, rest = raw.decode(errors="replace").rstrip("\n").partition(" ")
        if verb == "proc":
            pid, started, group = rest.split()
            procs[int(pid)] = (started, group == "1")
        elif verb == "release":
            procs.pop(int(rest.split()[0]), None)
        elif verb == "services" and rest not in services:
            services.append(rest)
        elif verb == "released" and rest in services:
            services.remove(rest)
    reap(procs, services)


def run_watchdog() -> None:
    with contextlib.suppress(OSError):
        os.setsid()  # out of the caller's process group: its group's signals are not ours
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)  # only EOF ends the watch
    watch(sys.stdin.buffer)


if __name__ == "__main__":
    run_watchdog()
