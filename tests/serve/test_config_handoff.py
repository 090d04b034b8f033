"""The gateway's secrets (the upstream API key, the upstream URL's and the store's
passwords) in no environment of its processes: ``ctxguard serve`` put its whole config in
``CTXGUARD_SERVE_CONFIG_JSON`` for uvicorn's workers, readable in every worker's
``/proc/<pid>/environ`` and inherited by any process a worker (or the one-process
server) started. The workers now read it from a 0600 file in a 0700 directory of its
own, removed when the server stops; one worker gets the app made in process."""

from __future__ import annotations

import contextlib
import json
import os
import stat
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from faults.servers import RedisServer
from security.test_secret_property import leaks

from ctxguard.serve.config import ServeConfig

from .processes import CliGateway
from .test_secrets_in_logs import KEY, STORE_PW, UPSTREAM_PW, auth_redis  # noqa: F401
from .upstream import FakeVLLM

pytestmark = [pytest.mark.redis, pytest.mark.timeout(180)]
SECRETS = (UPSTREAM_PW, STORE_PW, KEY)
FILE_ENV = "CTXGUARD_SERVE_CONFIG_FILE"


def _settings(vllm: FakeVLLM, redis: RedisServer) -> dict[str, Any]:
    host = vllm.url.removeprefix("http://")
    return {
        "upstream": f"http://admin:{quote(UPSTREAM_PW, safe='')}@{host}",
        "url": f"redis://:{quote(STORE_PW, safe='')}@127.0.0.1:{redis.port}/0",
        "upstream_api_key": KEY,
        "namespace": "gw-handoff",
        "max_tokens": 64,
    }


def _descendants(pid: int) -> list[int]:
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return [p for c in children for p in (int(c), *_descendants(int(c)))]


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().decode("utf-8", "replace")
    return dict(item.partition("=")[::2] for item in raw.split("\0") if item)


def _leaked(environ: dict[str, str]) -> list[str]:
    text = "\n".join(f"{k}={v}" for k, v in environ.items())
    return [found for secret in SECRETS for found in leaks(text, secret)]


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs /proc")
@pytest.mark.parametrize("given", ["file", "environment"])
def test_no_worker_process_holds_a_secret_in_its_environment(
    vllm: FakeVLLM,
    auth_redis: RedisServer,  # noqa: F811
    tmp_path: Path,
    given: str,
) -> None:
    """Given in a settings file, or in the gateway's variables (there they are in the
    CLI's own environment, its business; not in its workers')."""
    settings = _settings(vllm, auth_redis)
    if given == "file":
        toml = tmp_path / "gateway.toml"
        lines = [f"{k} = {json.dumps(v)}" for k, v in settings.items()]  # (JSON is TOML here)
        toml.write_text("\n".join(lines) + "\n")
        toml.chmod(0o600)
        gateway = CliGateway("--config", str(toml), "--workers", "2")
    else:
        env = {f"CTXGUARD_SERVE_{k.upper()}": str(v) for k, v in settings.items() if k != "url"}
        gateway = CliGateway("--workers", "2", env={**env, "CTXGUARD_URL": settings["url"]})
    try:
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        for _ in range(4):  # the workers have the config: the store and the upstream answer
            response = httpx.post(
                gateway.url + "/v1/chat/completions",
                json=body,
                headers={"X-Session-Id": "s1"},
                timeout=30,
            )
            assert response.status_code == 200, response.text
        workers = _descendants(gateway.proc.pid)
        assert len(workers) >= 2, workers
        shown = workers if given == "environment" else [gateway.proc.pid, *workers]
        environs = {pid: _environ(pid) for pid in shown}
        assert {pid: _leaked(env) for pid, env in environs.items()} == {pid: [] for pid in environs}
        paths = {env[FILE_ENV] for env in environs.values() if FILE_ENV in env}
        assert len(paths) == 1, paths  # what the workers had instead: a path
        path = Path(paths.pop())
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    finally:
        gateway.stop()
    assert not path.parent.exists()  # removed when the server stopped


@pytest.mark.parametrize("workers", [1, 2])
def test_what_a_workers_child_would_inherit_holds_no_secret(
    vllm: FakeVLLM,
    auth_redis: RedisServer,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    workers: int,
) -> None:
    """The environment when uvicorn starts (workers are spawned with it; one worker runs
    in this process), and a worker's once its factory read the config."""
    import uvicorn

    from ctxguard.serve import run
    from ctxguard.serve.app import app_from_env

    config = ServeConfig(**_settings(vllm, auth_redis), workers=workers)
    seen: list[dict[str, str]] = []
    made: list[Any] = []

    def fake_run(app: Any, **options: Any) -> None:
        seen.append(dict(os.environ))
        if isinstance(app, str):  # as a worker: the factory reads the config
            made.append(app_from_env())
            seen.append(dict(os.environ))
        else:
            made.append(app)

    monkeypatch.setattr(uvicorn, "run", fake_run)
    run(config)
    assert len(made) == 1 and made[0] is not None
    assert len(seen) == (2 if workers > 1 else 1)
    assert [_leaked(env) for env in seen] == [[]] * len(seen)
    if workers > 1:
        assert FILE_ENV in seen[0] and FILE_ENV not in seen[1]  # the worker dropped it
        assert not Path(seen[0][FILE_ENV]).parent.exists()
    assert FILE_ENV not in os.environ


@pytest.mark.parametrize("metrics", [True, False])
def test_no_temporary_directory_for_the_workers_is_a_config_error(
    vllm: FakeVLLM,
    auth_redis: RedisServer,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    metrics: bool,
) -> None:
    """(an OSError with a traceback: the CLI answers only the library's errors in a line)"""
    import tempfile

    import uvicorn

    from ctxguard.errors import ConfigError
    from ctxguard.serve import run

    started: list[Any] = []
    monkeypatch.setattr(uvicorn, "run", lambda *a, **k: started.append(a))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "missing"))
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    config = ServeConfig(**_settings(vllm, auth_redis), workers=2, metrics=metrics)
    with pytest.raises(ConfigError, match="TMPDIR to a writable directory") as caught:
        run(config)
    assert started == [] and "\n" not in str(caught.value)
    assert not _leaked({"error": str(caught.value)})


def _running(pid: int) -> bool:
    """``pid`` runs (a zombie its new parent has yet to reap has ended)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in "ZX"
    except OSError:
        return False


def _pipe_of(pid: int, fd: int) -> str:
    return os.readlink(f"/proc/{pid}/fd/{fd}")


def _holders(pipe: str, pids: list[int]) -> list[int]:
    held = []
    for pid in pids:
        with contextlib.suppress(OSError):
            if any(
                os.readlink(f"/proc/{pid}/fd/{fd}") == pipe for fd in os.listdir(f"/proc/{pid}/fd")
            ):
                held.append(pid)
    return held


@pytest.mark.destructive  # (it kills the gateway it started, nothing of a shared server)
@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs /proc")
def test_a_gateway_killed_by_sigkill_leaves_no_directory_behind(
    vllm: FakeVLLM,
    auth_redis: RedisServer,  # noqa: F811
) -> None:
    """(the 0700 directory with the 0600 settings file, secrets and all, and the workers'
    metrics directory stayed in the temporary directory: a SIGKILLed parent runs no
    cleanup) A watcher per directory, holding a pipe only the parent writes, removes it
    when the parent is gone; no worker holds the pipe's write end (it would keep it open)."""
    settings = _settings(vllm, auth_redis)
    env = {f"CTXGUARD_SERVE_{k.upper()}": str(v) for k, v in settings.items() if k != "url"}
    gateway = CliGateway("--workers", "2", env={**env, "CTXGUARD_URL": settings["url"]})
    try:
        everyone = _descendants(gateway.proc.pid)
        watchers = [p for p in everyone if "dirwatch" in Path(f"/proc/{p}/cmdline").read_text()]
        workers = [p for p in everyone if p not in watchers]
        assert watchers and len(workers) >= 2, (watchers, workers)
        folders = [Path(Path(f"/proc/{p}/cmdline").read_text().split("\0")[-2]) for p in watchers]
        config = {_environ(p).get(FILE_ENV) for p in workers} - {None}
        assert {str(Path(c).parent) for c in config} <= {str(f) for f in folders}
        assert all(f.is_dir() for f in folders) and config
        for watcher in watchers:  # only the parent holds the other end of the watcher's pipe
            pipe = _pipe_of(watcher, 0)
            assert _holders(pipe, [gateway.proc.pid, *workers]) == [gateway.proc.pid]
        gateway.kill()  # the parent and its process group (the watchers have their own)
        deadline = time.monotonic() + 60  # generous: a bound, not a timing claim
        while any(f.exists() for f in folders) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert [f for f in folders if f.exists()] == []
        while any(_running(w) for w in watchers) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert [w for w in watchers if _running(w)] == []  # they exited
    finally:
        gateway.stop()
