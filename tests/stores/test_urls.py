"""Store URLs: the scheme table, bad URLs, and passwords that never leak."""

from __future__ import annotations

import traceback

import pytest

from ctxguard.errors import ConfigError, InvalidIdError, StoreConnectionError
from ctxguard.stores import (
    AsyncMemoryStore,
    MemoryStore,
    open_async_store,
    open_store,
    redact_url,
)
from ctxguard.stores.redis import AsyncRedisStore, RedisStore, RetryPolicy
from ctxguard.stores.urls import parse_store_url

SECRET = "s3cret"
CLOSED = f"redis://user:{SECRET}@127.0.0.1:1/0"
CLOSED_CLUSTER = f"redis+cluster://user:{SECRET}@127.0.0.1:1,127.0.0.1:2"
FAST = RetryPolicy(attempts=2, first_delay=0.01)


def _everything_printed(exc: BaseException) -> str:
    return "".join(traceback.format_exception(exc)) + repr(exc) + str(exc)


@pytest.mark.parametrize("url", ["mongodb://db:27017", "http://x", "memcached://h:1"])
def test_unknown_scheme_is_a_config_error(url: str) -> None:
    with pytest.raises(ConfigError, match="unknown store scheme"):
        open_store(url)
    with pytest.raises(ConfigError, match="unknown store scheme"):
        open_async_store(url)


@pytest.mark.parametrize("url", ["", "localhost:6379", "redis:/x", 42])
def test_not_a_url_is_a_config_error(url: object) -> None:
    with pytest.raises(ConfigError, match="not a URL"):
        open_store(url)  # type: ignore[arg-type]


def test_bad_cluster_node_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="host:port"):
        open_store("redis+cluster://h1:7000,h2")


@pytest.mark.parametrize("name", ["", "a:b", "a*", "x" * 65, "{t}", "a b"])
def test_bad_namespace_or_tenant_is_refused(name: str) -> None:
    with pytest.raises(InvalidIdError):
        open_store("memory://", namespace=name)
    with pytest.raises(InvalidIdError):
        open_store("memory://", tenant=name)


def test_scheme_table_and_query_options() -> None:
    assert isinstance(open_store("memory://"), MemoryStore)
    assert isinstance(open_async_store("memory://"), AsyncMemoryStore)
    parsed = parse_store_url("redis://h:1/2?namespace=app&tenant=acme&socket_timeout=3")
    assert (parsed.namespace, parsed.tenant) == ("app", "acme")
    assert parsed.backend_url == "redis://h:1/2?socket_timeout=3"
    assert parse_store_url("redis://h:1/0?namespace=app", namespace="mine").namespace == "mine"
    cluster = parse_store_url("redis+cluster://a:7000,b:7001")
    assert cluster.hosts == (("a", 7000), ("b", 7001))


def test_memory_urls_with_one_name_share_state() -> None:
    a = open_store("memory://shared-test", namespace="tu1")
    b = open_async_store("memory://shared-test", namespace="tu1")
    other = open_store("memory://other-test", namespace="tu1")
    assert isinstance(b, AsyncMemoryStore)
    assert b.sync is a
    assert other is not a


def test_redact_url() -> None:
    assert redact_url(CLOSED) == "redis://user:***@127.0.0.1:1/0"
    assert redact_url("redis://:pw@h:1") == "redis://:***@h:1"
    assert redact_url("redis://h:1/0") == "redis://h:1/0"
    assert SECRET not in redact_url(CLOSED_CLUSTER)


@pytest.mark.parametrize("password", ["p#ss", "a/b", "q?x", "x@y", "%41"])
def test_redact_url_hides_passwords_with_url_characters(password: str) -> None:
    assert redact_url(f"redis://user:{password}@h:1/0") == "redis://user:***@h:1/0"


@pytest.mark.parametrize("url", [CLOSED, CLOSED_CLUSTER, f"rediss://:{SECRET}@127.0.0.1:1"])
def test_parsed_url_never_prints_the_password(url: str) -> None:
    parsed = parse_store_url(url)
    assert SECRET not in repr(parsed)
    assert SECRET not in str(parsed)
    assert SECRET not in parsed.redacted
    with pytest.raises(ConfigError) as caught:
        open_store(url.replace("redis", "mongodb", 1))
    assert SECRET not in _everything_printed(caught.value)


def test_connection_error_hides_the_password() -> None:
    store = RedisStore(parse_store_url(CLOSED), retry=FAST)
    assert SECRET not in repr(store) and SECRET not in repr(store.url)
    with pytest.raises(StoreConnectionError) as caught:
        store.info("s")
    assert "user:***@127.0.0.1:1" in str(caught.value)
    assert SECRET not in _everything_printed(caught.value)
    store.close()


async def test_async_connection_error_hides_the_password() -> None:
    store = AsyncRedisStore(parse_store_url(CLOSED), retry=FAST)
    with pytest.raises(StoreConnectionError) as caught:
        await store.append("s", [])
    assert SECRET not in _everything_printed(caught.value)
    await store.close()


def test_cluster_connection_error_is_typed_and_hides_the_password() -> None:
    with pytest.raises(StoreConnectionError) as caught:
        store = open_store(CLOSED_CLUSTER)
        store.info("s")
    assert SECRET not in _everything_printed(caught.value)


async def test_async_cluster_connection_error_is_typed_and_hides_the_password() -> None:
    store = open_async_store(CLOSED_CLUSTER)
    with pytest.raises(StoreConnectionError) as caught:
        await store.info("s")
    assert SECRET not in _everything_printed(caught.value)
    await store.close()
