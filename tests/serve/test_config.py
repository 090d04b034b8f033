"""`ctxguard serve` settings: flags over environment over TOML; typed errors; no secrets shown."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from ctxguard.cli import cli
from ctxguard.errors import ConfigError
from ctxguard.serve.config import (
    ENV_PREFIX,
    MAX_IDEMPOTENCY_WINDOW,
    MAX_WORKERS,
    ServeConfig,
    load_config,
)
from ctxguard.serve.handoff import CONFIG_FILE_ENV


def test_flags_win_over_environment_over_file(tmp_path: Path) -> None:
    file = tmp_path / "gateway.toml"
    file.write_text(
        '[serve]\nupstream = "http://file:8000"\nlimit = 1000\nport = 9001\nworkers = 2\n'
        '[serve.api_keys]\n"sk-a" = "acme"\n'
    )
    env = {"CTXGUARD_SERVE_LIMIT": "2000", "CTXGUARD_SERVE_PORT": "9002"}
    config = load_config({"port": 9003, "limit": None}, config_file=file, environ=env)
    assert config.upstream == "http://file:8000"
    assert (config.limit, config.port, config.workers) == (2000, 9003, 2)
    assert config.api_keys == {"sk-a": "acme"}
    assert config.counter_spec == "vllm:http://file:8000"


def test_metrics_switch_and_lease_from_environment_file_and_flags(tmp_path: Path) -> None:
    base = {"CTXGUARD_SERVE_UPSTREAM": "http://vllm:8000"}
    config = load_config({}, environ=base)
    assert (config.metrics, config.idempotency_lease) == (True, 10.0)
    env = {**base, "CTXGUARD_SERVE_METRICS": "off", "CTXGUARD_SERVE_IDEMPOTENCY_LEASE": "2.5"}
    config = load_config({}, environ=env)
    assert (config.metrics, config.idempotency_lease) == (False, 2.5)
    assert load_config({"metrics": True}, environ=env).metrics is True
    file = tmp_path / "gateway.toml"
    file.write_text("metrics = false\n")
    assert load_config({}, config_file=file, environ=base).metrics is False
    with pytest.raises(ConfigError, match="METRICS must be"):
        load_config({}, environ={**base, "CTXGUARD_SERVE_METRICS": "maybe"})
    with pytest.raises(ConfigError, match="metrics must be true or false"):
        ServeConfig(upstream="http://vllm:8000", metrics="yes")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="idempotency_lease"):
        ServeConfig(upstream="http://vllm:8000", idempotency_lease=0)


def test_environment_alone_and_the_store_url_variable() -> None:
    env = {
        "CTXGUARD_SERVE_UPSTREAM": "http://vllm:8000",
        "CTXGUARD_URL": "redis://:pw@redis:6379/0",
        "CTXGUARD_SERVE_API_KEYS": "k1=acme, k2=globex",
    }
    config = load_config({}, environ=env)
    assert config.url == "redis://:pw@redis:6379/0"
    assert config.api_keys == {"k1": "acme", "k2": "globex"}


@pytest.mark.parametrize(
    ("flags", "env", "match"),
    [
        ({}, {}, "no upstream"),
        ({"upstream": "vllm:8000"}, {}, "http"),
        ({"upstream": "http://x", "workers": 0}, {}, "workers"),
        ({"upstream": "http://x"}, {"CTXGUARD_SERVE_LIMIT": "lots"}, "number"),
        ({"upstream": "http://x", "tenant": "a b"}, {}, "tenant"),
        ({"upstream": "http://x"}, {"CTXGUARD_SERVE_API_KEYS": "nokey"}, "key=tenant"),
        ({"upstream": "http://x", "upstream_timeout": -1.0}, {}, "upstream_timeout"),
        # (these started a server: port 70000 listened on 4464, the others failed later
        # with a traceback, or at the first request)
        ({"upstream": "http://x", "port": 70000}, {}, "port must be at most 65535"),
        ({"upstream": "http://x"}, {"CTXGUARD_SERVE_LOG_LEVEL": "bogus"}, "log_level must"),
        ({"upstream": "http://x", "host": 5}, {}, "host must be an address"),
        ({"upstream": "http://x", "host": ""}, {}, "host must be an address"),
        ({"upstream": "http://x", "counter": 5}, {}, "counter must be a string"),
        ({"upstream": "http://x", "model": ["m"]}, {}, "model must be a string"),
        ({"upstream": "http://x/?key=sk-1"}, {}, "leave out the query string"),
    ],
)
def test_bad_settings_are_config_errors(
    flags: dict[str, object], env: dict[str, str], match: str
) -> None:
    with pytest.raises(ConfigError, match=match):
        load_config(flags, environ=env)


def test_bad_toml_is_a_config_error(tmp_path: Path) -> None:
    file = tmp_path / "bad.toml"
    file.write_text("upstream = ")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config({}, config_file=file, environ={})
    file.write_text('upstream = "http://x"\nlimt = 5\n')
    with pytest.raises(ConfigError, match="unknown setting limt"):
        load_config({}, config_file=file, environ={})
    with pytest.raises(ConfigError, match="cannot read"):
        load_config({}, config_file=tmp_path / "missing.toml", environ={})


def test_secrets_never_show() -> None:
    config = ServeConfig(
        upstream="http://user:up-pw@vllm:8000",
        url="redis://:store-pw@redis:6379/0",
        api_keys={"sk-client": "acme"},
        upstream_api_key="sk-upstream",
        counter="vllm:http://user:counter-pw@vllm:8000",
    )
    for text in (repr(config), json.dumps(config.describe())):
        for secret in ("up-pw", "store-pw", "sk-client", "sk-upstream", "counter-pw"):
            assert secret not in text
    assert ServeConfig.from_json(config.to_json()) == config


def test_cli_reports_a_bad_config_in_one_line() -> None:
    result = CliRunner().invoke(
        cli, ["serve", "--upstream", "ftp://x", "--url", "redis://:pw@h/0"], env={}
    )
    assert result.exit_code != 0
    assert "ConfigError" in result.output and "pw" not in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_cli_help_lists_the_environment() -> None:
    result = CliRunner().invoke(cli, ["serve", "--help"])
    assert result.exit_code == 0
    assert "CTXGUARD_SERVE_" in result.output and "--upstream" in result.output


def test_worker_factory_needs_the_config(monkeypatch: pytest.MonkeyPatch) -> None:
    from ctxguard.serve.app import app_from_env

    monkeypatch.delenv(CONFIG_FILE_ENV, raising=False)
    with pytest.raises(ConfigError, match="ctxguard serve"):
        app_from_env()


def test_importing_the_gateway_package_is_light() -> None:
    probe = "import sys, ctxguard.serve, ctxguard.cli; print('starlette' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize(
    ("name", "cap"), [("workers", MAX_WORKERS), ("idempotency_window", MAX_IDEMPOTENCY_WINDOW)]
)
def test_workers_and_the_idempotency_window_are_capped_at_every_door(
    name: str, cap: int, tmp_path: Path
) -> None:
    """(both had no upper bound: ``--workers 100000`` forked until the host gave out, and
    a window of 10**9 had each keyed request read the whole session)"""
    match = rf"^{name} must be at most {cap}\b.*, got {cap + 1}"
    assert getattr(ServeConfig(upstream="http://x", **{name: cap}), name) == cap
    with pytest.raises(ConfigError, match=match):  # the dataclass (LiteLLM's guardrail too)
        ServeConfig(upstream="http://x", **{name: cap + 1})
    with pytest.raises(ConfigError, match=match):  # the environment
        load_config(
            {},
            environ={
                "CTXGUARD_SERVE_UPSTREAM": "http://x",
                ENV_PREFIX + name.upper(): str(cap + 1),
            },
        )
    file = tmp_path / "gateway.toml"
    file.write_text(f'[serve]\nupstream = "http://x"\n{name} = {cap + 1}\n')
    with pytest.raises(ConfigError, match=match):  # the TOML file
        load_config({}, config_file=file, environ={})
    flag = "--" + name.replace("_", "-")
    result = CliRunner().invoke(
        cli, ["serve", "--upstream", "http://x", flag, str(cap + 1)], env={}
    )
    assert result.exit_code == 2, result.output  # the flag
    assert len(result.output.strip().splitlines()) == 1
    assert f"{name} must be at most {cap}" in result.output
    help_text = CliRunner().invoke(cli, ["serve", "--help"]).output
    assert f"at most {cap})" in " ".join(help_text.split())
