"""A store URL option given twice is refused at every door that parses a store URL.

(``?namespace=a&namespace=b`` took the first: a process written for ``b`` read and
wrote the sessions of ``a``; ``password`` twice used one of two passwords.)
"""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from ctxguard import Guard
from ctxguard.cli import cli
from ctxguard.errors import ConfigError, CtxGuardError
from ctxguard.serve.config import ServeConfig
from ctxguard.stores import open_store
from ctxguard.stores.urls import parse_store_url
from tests.conftest import private_memory_url

SECRET = "hunter2-s3cret"
DUPLICATED = [
    "redis://127.0.0.1:1/0?namespace=a&namespace=b",
    "redis://127.0.0.1:1/0?tenant=a&tenant=a",  # the same value twice too
    f"redis://127.0.0.1:1/0?password={SECRET}&password=other",
    f"redis://:{SECRET}@127.0.0.1:1/0?db=1&socket_timeout=2&db=2",
    f"rediss://:{SECRET}@127.0.0.1:2/0?ssl_cert_reqs=none&ssl_cert_reqs=required",
    f"redis+cluster://:{SECRET}@127.0.0.1:1,127.0.0.1:2?client_name=a&client_name=b",
    "memory://dup-never-opened?namespace=a&namespace=b",
]


def _name(url: str) -> str:
    query = url.partition("?")[2]
    names = [item.partition("=")[0] for item in query.split("&")]
    return next(n for n in names if names.count(n) > 1)


def _check(message: str, url: str) -> None:
    assert "\n" not in message.strip()
    assert _name(url) in message and "more than once" in message
    assert SECRET not in message and "other" not in message


@pytest.mark.parametrize("url", DUPLICATED)
def test_the_parser_refuses_a_duplicated_option(url: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_store_url(url)
    _check(str(caught.value), url)


@pytest.mark.parametrize("url", DUPLICATED)
def test_guard_and_open_store_refuse_a_duplicated_option(url: str) -> None:
    for door in (lambda u: Guard(u, limit=4096), open_store):
        with pytest.raises(ConfigError) as caught:
            door(url)
        _check(str(caught.value), url)
        assert SECRET not in repr(caught.value)


@pytest.mark.parametrize("url", DUPLICATED)
def test_serve_config_refuses_a_duplicated_option(url: str) -> None:
    with pytest.raises(ConfigError) as caught:
        ServeConfig(upstream="http://vllm:8000", url=url)
    _check(str(caught.value), url)


@pytest.mark.parametrize("url", DUPLICATED)
def test_the_cli_refuses_a_duplicated_option_in_one_line(url: str) -> None:
    for how in (["sessions", "--url", url], ["sessions"]):
        env = {"CTXGUARD_URL": url} if how == ["sessions"] else {}
        result = CliRunner().invoke(cli, how, env=env, catch_exceptions=False)
        assert result.exit_code == 2, result.output
        assert result.stderr.count("\n") == 1, result.stderr
        _check(result.stderr, url)
        assert SECRET not in result.stdout


def test_distinct_options_and_a_lone_option_still_parse() -> None:
    parsed = parse_store_url("redis://127.0.0.1:1/0?namespace=a&tenant=a&db=2")
    assert (parsed.namespace, parsed.tenant, parsed.db) == ("a", "a", 2)
    url = private_memory_url()
    store = open_store(f"{url}?namespace=solo")
    store.close()


def test_the_refusal_is_a_ctxguard_error() -> None:
    with pytest.raises(CtxGuardError):
        parse_store_url("memory://dup-never-parsed?tenant=a&tenant=b")


def _never_started(*args: object) -> None:
    raise AssertionError("the gateway was about to listen with a duplicated URL option")


@pytest.mark.parametrize("url", DUPLICATED[:3])
def test_ctxguard_serve_refuses_a_duplicated_option_before_starting(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import ctxguard.cli.serve
    import ctxguard.serve

    monkeypatch.setattr(ctxguard.serve, "run", _never_started)  # (a regression: no server)
    monkeypatch.setattr(ctxguard.cli.serve, "check_listen", _never_started)
    for args, env in (
        (["serve", "--upstream", "http://127.0.0.1:1", "--url", url], {}),
        (["serve", "--upstream", "http://127.0.0.1:1"], {"CTXGUARD_URL": url}),
    ):
        result = CliRunner().invoke(cli, args, env=env, catch_exceptions=False)
        assert result.exit_code == 2, result.output
        assert result.stderr.count("\n") == 1, result.stderr
        _check(result.stderr, url)
