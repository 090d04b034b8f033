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
    "redis://localhost:6379/0?namespace=a&namespace=b",
    "redis://localhost:6379/0?tenant=a&tenant=a",  # the same value twice too
    f"redis://localhost:6379/0?password={SECRET}&password=other",
    f"redis://:{SECRET}@localhost:6379/0?db=1&socket_timeout=2&db=2",
    f"rediss://:{SECRET}@localhost:6380/0?ssl_cert_reqs=none&ssl_cert_reqs=required",
    f"redis+cluster://:{SECRET}@h1:7000,h2:7001?client_name=a&client_name=b",
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
    parsed = parse_store_url("redis://localhost:6379/0?namespace=a&tenant=a&db=2")
    assert (parsed.namespace, parsed.tenant, parsed.db) == ("a", "a", 2)
    url = private_memory_url()
    store = open_store(f"{url}?namespace=solo")
    store.close()


def test_the_refusal_is_a_ctxguard_error() -> None:
    with pytest.raises(CtxGuardError):
        parse_store_url("memory://dup-never-parsed?tenant=a&tenant=b")
