"""A private directory removed when the process that made it dies, however it dies.

``ctxguard serve --workers N`` keeps directories in the temporary directory while
uvicorn may restart a worker: the workers' settings file, secrets and all
(:mod:`ctxguard.serve.handoff`), and the workers' metrics files
(:mod:`ctxguard.serve.metrics`). The gateway removes them when it stops, but a gateway
killed by SIGKILL (the OOM killer, ``kill -9``, a container stopped hard) runs no
cleanup, and they were left behind. So :func:`removed_at_exit` starts a tiny watcher: a
process running this file by path (standard library only; nothing of ctxguard is
imported) that holds the read end of a pipe whose write end only the gateway holds
(not inheritable, so no worker, nor anything a worker starts, has it: the pipe reads
EOF exactly when the gateway is gone, by any death), and removes the directory then.
The watcher is in a session of its own and ignores SIGINT, SIGTERM and SIGHUP, so what
stops the gateway's process group does not stop it first; it only waits, and exits at
EOF. A gateway that stops normally removes the directory itself at once.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator

log = logging.getLogger("ctxguard.serve")
WAIT_SECONDS = 5.0  # for the watcher to exit once the pipe is closed (it is at once)


@contextlib.contextmanager
def removed_at_exit(folder: str) -> Iterator[None]:
    """Remove ``folder`` when the block ends, and, through a watcher process, when this
    process dies before it does (SIGKILL included). Start it before anything secret is
    written in ``folder``: a watcher that cannot start is logged, and only a normal stop
    removes the folder then."""
    watcher, write = _start(folder)
    try:
        yield
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        if write is not None:
            os.close(write)  # EOF: the watcher finds the folder gone and exits
        if watcher is not None:
            try:
                watcher.wait(WAIT_SECONDS)
            except subprocess.TimeoutExpired:  # (it exits at EOF: never seen)
                log.warning("the gateway's directory watcher did not exit; it is left to end")


def _start(folder: str) -> tuple[subprocess.Popen[bytes] | None, int | None]:
    if not sys.executable:
        log.warning("no Python executable to watch %s with; it is removed at a normal stop", folder)
        return None, None
    read, write = os.pipe()  # neither end inheritable (PEP 446): no worker gets the write end
    try:
        watcher = subprocess.Popen(
            [sys.executable, "-I", "-S", os.path.abspath(__file__), folder],
            stdin=read,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,  # (never holding the gateway's stderr pipe open)
            close_fds=True,
            start_new_session=True,
        )
    except OSError as exc:
        os.close(write)
        log.warning(
            "cannot start the gateway's directory watcher (%s); the workers' directory is "
            "removed at a normal stop only",
            exc.strerror or type(exc).__name__,
        )
        return None, None
    finally:
        os.close(read)
    return watcher, write


def _watch(folder: str) -> None:
    """In the watcher: wait for EOF on standard input, then remove ``folder``."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    try:
        while os.read(0, 512):
            pass
    except OSError:  # (no pipe to watch: never started so) removing it now would be early
        return
    shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":  # the watcher process (run by path, see removed_at_exit)
    if len(sys.argv) == 2 and os.path.isabs(sys.argv[1]):
        _watch(sys.argv[1])
