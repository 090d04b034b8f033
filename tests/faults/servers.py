"""Private Redis servers for tests that stop, restart, pause or reconfigure them.

A :class:`RedisServer` is a ``redis-server`` child process on a free port in a
temporary directory; :class:`PrivateCluster` is a 3-primary + 3-replica
cluster started by ``scripts/services.sh`` into its own state directory. Both
are always stopped by the fixtures that make them, so failing over, killing
connections or shutting a server down never disturbs the shared servers.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import redis
from reaper import REAPER

ROOT = Path(__file__).resolve().parents[2]
SERVICES = ROOT / "scripts" / "services.sh"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def need_redis_server() -> str:
    path = shutil.which("redis-server")
    if path is None:
        if os.environ.get("CI") == "true":
            pytest.fail("redis-server is not installed (CI=true: install it)")
        pytest.skip("redis-server is not installed")
    return path


class RedisServer:
    """A redis-server this test owns: start, stop (gracefully or by SIGKILL), restart."""

    def __init__(self, directory: Path, args: Sequence[str] = (), tls: bool = False) -> None:
        self.binary = need_redis_server()
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self.args = list(args)
        self.tls = tls
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def command_line(self) -> list[str]:
        port = str(self.port)
        ports = ["--port", "0", "--tls-port", port] if self.tls else ["--port", port]
        return [
            self.binary,
            *ports,
            "--bind", "127.0.0.1",
            "--dir", str(self.dir),
            "--save", "",
            "--daemonize", "no",
            "--logfile", str(self.dir / "redis.log"),
            *self.args,
        ]  # fmt: skip

    def start(self) -> RedisServer:
        # A session of its own: stopped by this object or by the reaper when the test
        # process dies (tests/reaper.py), not by a signal meant for the test run.
        self.proc = subprocess.Popen(
            self.command_line(), stdout=subprocess.DEVNULL, start_new_session=True
        )
        REAPER.own(self.proc, group=False)
        try:
            self._wait_up()
        except BaseException:
            self.stop(kill=True)  # never leave a half-started server behind
            raise
        return self

    def _wait_up(self) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                log = (self.dir / "redis.log").read_text(errors="replace")[-2000:]
                cmd = shlex.join(self.command_line())
                raise RuntimeError(f"redis-server exited ({cmd}):\n{log}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    break
            except OSError:
                time.sleep(0.05)
        else:
            raise RuntimeError(f"redis-server did not listen on {self.port}")
        if not self.tls:
            self._wait_loaded()

    def _wait_loaded(self) -> None:
        client = self.client()
        try:
            for _ in range(200):
                try:
                    if client.ping():
                        return
                except redis.BusyLoadingError:
                    time.sleep(0.05)
                except redis.AuthenticationError:  # up, and asking for a password
                    return
        finally:
            client.close()

    def client(self, **kwargs: Any) -> redis.Redis:
        kwargs.setdefault("socket_timeout", 5)
        return redis.Redis(host="127.0.0.1", port=self.port, **kwargs)

    def stop(self, kill: bool = False) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        REAPER.release(self.proc)

    def restart(self, kill: bool = False, down_for: float = 0.0) -> None:
        self.stop(kill=kill)
        time.sleep(down_for)
        self.start()


class PrivateCluster:
    """A 6-node cluster of our own, started and stopped by ``scripts/services.sh``."""

    def __init__(self, state: Path) -> None:
        need_redis_server()
        self.state = state
        self.url = ""

    def start(self) -> PrivateCluster:
        env = dict(os.environ)
        env.pop("CTXGUARD_TEST_CLUSTER_URL", None)  # never reuse the shared cluster
        # If this process dies, even while services.sh is still starting the nodes
        # (daemons, out of our process group), the reaper stops them.
        REAPER.own_services(self.state)
        starter = subprocess.Popen(
            ["bash", str(SERVICES), "start", str(self.state), "cluster"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        REAPER.own(starter, group=True)
        try:
            out, err = starter.communicate(timeout=120)
        finally:
            if starter.poll() is None:
                os.killpg(starter.pid, signal.SIGTERM)  # its trap stops what it started
                starter.wait(30)
            REAPER.release(starter)
        if starter.returncode != 0:
            raise subprocess.CalledProcessError(starter.returncode, starter.args, out, err)
        for line in out.splitlines():
            if line.startswith("export CTXGUARD_TEST_CLUSTER_URL="):
                self.url = shlex.split(line.split("=", 1)[1])[0]
        assert self.url.startswith("redis+cluster://"), out
        self.wait_healthy()
        return self

    def stop(self) -> None:
        subprocess.run(["bash", str(SERVICES), "stop", str(self.state)], timeout=60, check=False)
        REAPER.release_services(self.state)

    @property
    def ports(self) -> list[int]:
        return [int(hp.rsplit(":", 1)[1]) for hp in self.url.split("://", 1)[1].split(",")]

    def node(self, port: int) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=port, socket_timeout=5)

    def owners(self, key: str) -> tuple[int, list[int]]:
        """The primary port serving ``key``'s slot, and its replicas' ports."""
        client = self.node(self.ports[0])
        try:
            slot = int(client.execute_command("CLUSTER KEYSLOT", key))
            for start, end, primary, *replicas in client.execute_command("CLUSTER SLOTS"):
                if int(start) <= slot <= int(end):
                    return int(primary[1]), [int(r[1]) for r in replicas]
        finally:
            client.close()
        raise AssertionError(f"no node serves slot {slot}")

    def wait_healthy(self, timeout: float = 60) -> None:
        """Until every node says ok and every primary has a replica in sync."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all(self._ok(p) for p in self.ports) and self._replicated():
                return
            time.sleep(0.1)
        raise AssertionError("cluster did not return to cluster_state:ok with replicas")

    def _replicated(self) -> bool:
        client = self.node(self.ports[0])
        try:
            ranges = client.execute_command("CLUSTER SLOTS")
        except redis.RedisError:
            return False
        finally:
            client.close()
        replicas = [int(r[1]) for _, _, _, *rs in ranges for r in rs]
        if len(replicas) < len(ranges) or any(not rs for _, _, _, *rs in ranges):
            return False
        for port in replicas:
            client = self.node(port)
            try:
                if client.info("replication").get("master_link_status") != "up":
                    return False
            except redis.RedisError:
                return False
            finally:
                client.close()
        return True

    def _ok(self, port: int) -> bool:
        client = self.node(port)
        try:
            info = client.execute_command("CLUSTER INFO")  # parsed into a dict by redis-py
            return bool(info.get("cluster_state") == "ok")
        except redis.RedisError:
            return False
        finally:
            client.close()


class FaultProxy:
    """A TCP proxy in front of a Redis server that loses chosen commands or their replies.

    ``arm(match, mode)``: the next command whose bytes hold ``match`` (for example a
    script's SHA) is either dropped before it reaches the server (``"refuse"``: the
    connection closes, the command never runs) or run and its reply lost
    (``"drop_reply"``: the server executes it, then the client's connection
    closes before the reply is passed on). Each arming fires ``times`` times.
    """

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.2)
        self.port = int(self._listener.getsockname()[1])
        self._lock = threading.Lock()
        self._rules: list[list[Any]] = []  # [match, mode, times left]
        self.fired: list[str] = []
        self.reply_delay = 0.0
        self._stopping = threading.Event()
        self._sockets: set[socket.socket] = set()
        self._thread = threading.Thread(target=self._accept, daemon=True)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> FaultProxy:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join(5)
        self._listener.close()
        with self._lock:
            for sock in list(self._sockets):
                _close(sock)

    def arm(self, match: bytes | str, mode: str, times: int = 1) -> None:
        assert mode in ("refuse", "drop_reply"), mode
        raw = match.encode() if isinstance(match, str) else match
        with self._lock:
            self._rules.append([raw, mode, times])

    def disarm(self) -> None:
        with self._lock:
            self._rules.clear()

    def _take(self, chunk: bytes) -> str | None:
        with self._lock:
            for rule in self._rules:
                if rule[0] in chunk:
                    rule[2] -= 1
                    if rule[2] <= 0:
                        self._rules.remove(rule)
                    self.fired.append(rule[1])
                    return str(rule[1])
        return None

    def _accept(self) -> None:
        while not self._stopping.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port), timeout=5)
            except OSError:
                _close(client)
                continue
            upstream.settimeout(None)
            client.settimeout(None)
            with self._lock:
                self._sockets.update((client, upstream))
            state = {"drop_reply": False}
            threading.Thread(
                target=self._pump_up, args=(client, upstream, state), daemon=True
            ).start()
            threading.Thread(
                target=self._pump_down, args=(upstream, client, state), daemon=True
            ).start()

    def _pump_up(
        self, client: socket.socket, upstream: socket.socket, state: dict[str, bool]
    ) -> None:
        try:
            while chunk := client.recv(1 << 20):
                mode = self._take(chunk)
                if mode == "refuse":
                    break  # never reaches the server
                if mode == "drop_reply":
                    state["drop_reply"] = True
                upstream.sendall(chunk)
        except OSError:
            pass
        self._close_pair(client, upstream)

    def _pump_down(
        self, upstream: socket.socket, client: socket.socket, state: dict[str, bool]
    ) -> None:
        try:
            while chunk := upstream.recv(1 << 20):
                if state["drop_reply"]:
                    break  # the server ran the command; its reply is lost
                if self.reply_delay > 0:
                    if self._stopping.wait(self.reply_delay):
                        break
                    # one delay per burst of replies: what arrived meanwhile (the rest of
                    # a pipelined handshake's replies, in a second TCP read or not) goes
                    # with this chunk, so a burst is never held twice
                    chunk += _drained(upstream)
                client.sendall(chunk)
        except OSError:
            pass
        self._close_pair(client, upstream)

    def _close_pair(self, *socks: socket.socket) -> None:
        with self._lock:
            for sock in socks:
                self._sockets.discard(sock)
        for sock in socks:
            _close(sock)


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()


def _drained(sock: socket.socket) -> bytes:
    """What ``sock`` holds now, without waiting for more."""
    parts = []
    sock.setblocking(False)
    try:
        while True:
            try:
                part = sock.recv(1 << 20)
            except BlockingIOError:
                break
            if not part:
                break
            parts.append(part)
    finally:
        sock.setblocking(True)
    return b"".join(parts)
