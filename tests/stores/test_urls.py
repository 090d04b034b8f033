"""Store URLs: the scheme table, bad URLs, and passwords that never leak."""

from __future__ import annotations

import traceback
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ctxguard import Guard
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


# -- issue 12: passwords with URL characters, ?password=, positional parse errors ------


@pytest.mark.parametrize(
    ("url", "secret"),
    [
        ("redis://127.0.0.1:6379/0?password=MyS3cretPass", "MyS3cretPass"),
        ("redis://127.0.0.1:6379/0?username=u&password=MyS3cretPass", "MyS3cretPass"),
        ("redis://:Ab:MyS3cret/x@127.0.0.1:6379/0", "MyS3cret"),
        ("redis://:LongSecretPart#x@127.0.0.1:6379/0", "LongSecretPart"),
        ("redis://admin:LongSecretPart?x@127.0.0.1:6379/0", "LongSecretPart"),
        ("redis+cluster://:QxJ7w@Kv3Y:pNa8/9zRt@127.0.0.1:7000", "Kv3Y"),
        ("redis+cluster://:QxJ7w@Kv3Y:pNa8/9zRt@127.0.0.1:7000", "pNa8"),
        ("redis+cluster://:Sec9Pw@127.0.0.1:7000,:Sec9Pw@127.0.0.1:7001", "Sec9Pw"),
        ("rediss://:p%40ss%2FSecWord@127.0.0.1:1/0", "SecWord"),
        ("rediss://127.0.0.1:1/0?ssl_password=CertSecret", "CertSecret"),
    ],
)
def test_the_reported_urls_parse_and_print_redacted(url: str, secret: str) -> None:
    parsed = parse_store_url(url)
    for text in (str(parsed), repr(parsed), parsed.redacted, redact_url(url)):
        assert secret not in text and "***" in text
    assert parsed.password is not None or parsed.secret_options
    assert secret in parsed.backend_url  # the client still gets it


def test_raw_passwords_with_url_characters_reach_the_client_whole() -> None:
    assert parse_store_url("redis://:Ab:MyS3cret/x@h:6379/0").password == "Ab:MyS3cret/x"
    cluster = parse_store_url("redis+cluster://:QxJ7w@Kv3Y:pNa8/9zRt@host:7000")
    assert (cluster.password, cluster.hosts) == ("QxJ7w@Kv3Y:pNa8/9zRt", (("host", 7000),))
    query = parse_store_url("redis://h:1/0?username=u&password=a%26b%3Dc")
    assert (query.username, query.password) == ("u", "a&b=c")
    per_node = parse_store_url("redis+cluster://u:pw@a:1,u:pw@b:2")
    assert (per_node.username, per_node.password, per_node.hosts) == (
        "u",
        "pw",
        (("a", 1), ("b", 2)),
    )


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("redis://:Ab:MyS3cret@127.0.0.1:notaport/0", "the port of the store URL is not a number"),
        ("redis://h:0/0", "out of range"),
        ("redis://h:65536/0", "out of range"),
        ("redis://:MyS3cret@/0", "has no host"),
        ("redis://h:1/MyS3cret", "not a database number"),
        ("redis+cluster://:MyS3cret@h1:1,MyS3cret", "node 2 of the cluster URL has no port"),
        ("redis+cluster://h1:1,h2:MyS3cret", "the port of node 2 of the cluster URL"),
        ("redis+cluster://u:MyS3cret@h1:1,u:Other@h2:2", "different credentials"),
        ("redis://h:1/0?MyS3cret=1", "query parameter 1 of the store URL"),
        ("redis://h:1/0?password=x&MyS3cret", "query parameter 2 of the store URL"),
        ("MyS3cret:x@h://1", "unknown store scheme in the store URL"),
        ("redis+cluster://h:1/2", "database 0 only"),
    ],
)
def test_parse_errors_name_the_part_never_the_text(url: str, says: str) -> None:
    for opener in (open_store, open_async_store, parse_store_url):
        with pytest.raises(ConfigError) as caught:
            opener(url)
        assert says in str(caught.value)
        assert "MyS3cret" not in _everything_printed(caught.value)


@pytest.mark.parametrize(
    "url",
    [
        # a raw password with @, then the same text in a bad path: the path is the error
        "redis://:My@S3cret@127.0.0.1:1/xMy@S3cret",
        "redis://:My@S3cret@127.0.0.1:1/0?socket_timeout=xMy@S3cret",
        "redis+cluster://:My@S3cret@127.0.0.1:1,127.0.0.1:2/xMy@S3cret",
        # a / before the @ (the standard authority fails): the reading at the second @
        # parses as host:port with a bad path, and ends the search there
        "redis://:My/x@S3cret@127.0.0.1:1/xMy/x@S3cret",
        "redis://:My?x@S3cret@127.0.0.1:1/0?socket_timeout=My?x@S3cret",
    ],
)
def test_an_at_sign_past_a_valid_authority_never_makes_a_host(url: str) -> None:
    """The standard reading's authority parses as host:port and its path or query does
    not: an ``@`` further on is not taken as the end of a password (a host made of the
    text after it would be shown in every error and repr: here a piece of the password).
    A raw password with @ and / before a host without a port still reads
    (``tests/security/test_secret_property.py``)."""
    for opener in (open_store, open_async_store, parse_store_url):
        with pytest.raises(ConfigError) as caught:
            opener(url)
        assert "S3cret" not in _everything_printed(caught.value)


_MARKERS = "QJZXW"
_raw_passwords = st.builds(
    lambda a, b: f"QJ{a}ZX{b}W",
    st.text(alphabet=":/?#@[]%+&,= " + _MARKERS, max_size=8),
    st.text(alphabet=":/?#@[]%+&,= " + _MARKERS, min_size=1, max_size=8),
)


@settings(max_examples=1500, deadline=None)
@given(password=_raw_passwords)
def test_no_reading_of_a_bad_url_shows_a_piece_of_its_raw_password(password: str) -> None:
    """Parse only (no connection: thousands of examples in seconds): a URL with a raw
    password and a bad part, the password written again in that part, is refused, or
    read with no piece of the password (4 characters with 2 of its letters) in what it
    shows. tests/security/test_secret_property.py drives the same URLs through every
    entry point, with fewer examples."""
    pieces = {password[i : i + 4] for i in range(len(password) - 3)}
    pieces = {p for p in pieces if sum(c in _MARKERS for c in p) >= 2}
    for url in (
        f"redis://:{password}@127.0.0.1:1/x{password}",
        f"redis://:{password}@127.0.0.1:1/0?socket_timeout={password}",
        f"redis://:{password}@127.0.0.1:notaport/0",
        f"redis+cluster://:{password}@127.0.0.1:1,{password}",
        f"redis+cluster://:{password}@127.0.0.1:1,127.0.0.1:2/x{password}",
    ):
        try:
            parsed = parse_store_url(url)
        except ConfigError as exc:
            shown = str(exc)
        else:
            shown = f"{parsed} {parsed!r} {parsed.redacted} {parsed.servers} {parsed.redis_url()}"
        assert password not in shown
        assert not [p for p in pieces if p in shown], (url, shown)


def test_redis_py_never_sees_the_credentials_in_a_url() -> None:
    """What redis-py parses holds no secret, so none of its messages can show one."""
    parsed = parse_store_url("redis://admin:Pw@h:1/3?password=Q&socket_timeout=2&client_name=c")
    assert parsed.redis_url() == "redis://h:1/3?client_name=c"
    assert parsed.client_kwargs() == {
        "socket_connect_timeout": 5.0,
        "socket_timeout": 2.0,
        "username": "admin",
        "password": "Pw",
    }


def test_store_and_url_reprs_are_redacted() -> None:
    store = RedisStore(parse_store_url(CLOSED), retry=FAST)
    assert repr(store) == (
        "RedisStore('redis://user:***@127.0.0.1:1/0', namespace='ctxg', tenant='default')"
    )
    assert repr(store.url) == (
        "StoreURL('redis://user:***@127.0.0.1:1/0', namespace='ctxg', tenant='default')"
    )
    store.close()


@pytest.mark.parametrize("option", ["ssl_ca_path=/", "ssl_password=Pw9"])
def test_cluster_urls_refuse_options_the_cluster_client_lacks_when_parsed(option: str) -> None:
    """(they were refused only when the store was opened: `ctxguard serve`'s config, a
    URL checked up front, and redact_url took them)"""
    url = f"rediss+cluster://:s3cretPW@127.0.0.1:1,127.0.0.1:2?{option}"
    name = option.partition("=")[0]
    for door in (lambda: parse_store_url(url), lambda: open_async_store(url)):
        with pytest.raises(ConfigError, match=f"{name} cannot be set on a cluster URL") as caught:
            door()
        assert "s3cretPW" not in str(caught.value) and "Pw9" not in str(caught.value)
        assert "\n" not in str(caught.value)
    assert parse_store_url(url.replace("+cluster", "").replace(",127.0.0.1:2", "")).tls


def test_redact_url_of_other_urls() -> None:
    assert redact_url("http://u:p@w@host:8000/v1?api_key=K&x=1") == (
        "http://***@host:8000/v1?api_key=***&x=1"
    )
    assert redact_url("not a url") == "<not a URL>"


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://h:7411?db=3", "redis://h:7411/3"),
        ("redis://:pw@h:7411/0?db=5", "redis://:***@h:7411/5"),
        ("redis://h:7411/2", "redis://h:7411/2"),
        ("redis://h:7411", "redis://h:7411"),
    ],
)
def test_the_shown_url_names_the_database_it_uses(url: str, shown: str) -> None:
    """(a ?db= was left out of what errors and the CLI show: the wrong database, 0)"""
    parsed = parse_store_url(url)
    assert parsed.redacted == shown
    assert parse_store_url(parsed.backend_url).db == parsed.db


@pytest.mark.parametrize(
    ("option", "says"),
    [
        ("max_connections=abc", "max_connections in the store URL"),
        ("max_connections=0", "max_connections in the store URL"),
        ("health_check_interval=abc", "health_check_interval in the store URL"),
        ("health_check_interval=-5", "health_check_interval in the store URL"),
        ("health_check_interval=2.5", "health_check_interval in the store URL"),
        ("db=99999999999999999999", "db parameter"),
        ("db=-1", "db parameter"),
        ("db=" + "0" * 5000 + "1" * 20, "db parameter"),
    ],
)
@pytest.mark.parametrize("base", ["redis://:s3cretPW@127.0.0.1:1/0", "rediss://:s3cretPW@h:1"])
def test_bad_numeric_url_options_are_config_errors_when_the_url_is_parsed(
    base: str, option: str, says: str
) -> None:
    """(max_connections=abc and health_check_interval=abc failed only at the first Redis
    call, health_check_interval=-5 as a StoreConnectionError; a 20-digit db was sent)"""
    url = f"{base}?{option}"
    for check in (
        lambda: parse_store_url(url),
        lambda: open_store(url),
        lambda: open_async_store(url),
        lambda: Guard(url, counter="approx", limit=4096),
    ):
        with pytest.raises(ConfigError, match=says) as info:
            check()
        assert "s3cretPW" not in str(info.value) and "\n" not in str(info.value)


def test_a_20_digit_database_path_is_refused_but_db_16_is_kept() -> None:
    """Redis' database count is a server setting: 16 may exist; past 2**31-1 cannot."""
    with pytest.raises(ConfigError, match="database of the store URL"):
        parse_store_url("redis://h:1/99999999999999999999")
    assert parse_store_url("redis://h:1/16").db == 16
    assert parse_store_url("redis://h:1/0?db=16&max_connections=8&health_check_interval=0").db == 16


@pytest.mark.parametrize("url", ["memory://kw", "redis://127.0.0.1:1/0", "redis+cluster://h:1"])
@pytest.mark.parametrize("opener", [open_store, open_async_store])
def test_an_unknown_keyword_is_a_config_error_naming_what_the_store_takes(
    url: str, opener: Any
) -> None:
    """(redis URLs: a bare TypeError from RedisStore; memory://: silently ignored)"""
    with pytest.raises(ConfigError, match=r"unexpected keyword argument 'bogus'.*takes"):
        opener(url, bogus=1)
    if url.startswith("memory"):  # a memory store has no client and nothing to retry
        with pytest.raises(ConfigError, match="'retry'"):
            opener(url, retry=RetryPolicy())
    else:
        with pytest.raises(ConfigError, match="retry must be a RetryPolicy"):
            opener(url, retry=3)


_BOOL_BASES = [
    "redis://:s3cretPW@127.0.0.1:1/0",
    "rediss://:s3cretPW@h:1",
    "redis+cluster://:s3cretPW@127.0.0.1:1,127.0.0.1:2",
    "rediss+cluster://:s3cretPW@127.0.0.1:1,127.0.0.1:2",
]


@pytest.mark.parametrize("value", ["maybe", "", "2", "truee", "flase", "nein", "yes%20please"])
@pytest.mark.parametrize(
    ("base", "option"),
    [(base, "socket_keepalive") for base in _BOOL_BASES]
    + [(base, "ssl_check_hostname") for base in _BOOL_BASES if base.startswith("rediss")],
)
def test_a_yes_no_url_option_takes_only_yes_or_no_words(base: str, option: str, value: str) -> None:
    """redis-py reads any text but 0/f/false/n/no/off as true: socket_keepalive=maybe turned
    keepalive on, ssl_check_hostname=flase turned the check on. Refused when the URL is
    parsed, naming the option and the words it takes, never the URL's password."""
    url = f"{base}?{option}={value}"
    for check in (
        lambda: parse_store_url(url),
        lambda: open_store(url),
        lambda: open_async_store(url),
        lambda: Guard(url, counter="approx", limit=4096),
    ):
        with pytest.raises(ConfigError) as info:
            check()
        text = str(info.value)
        assert f"{option} in the store URL must be true or false" in text
        assert "yes/no" in text and "1/0" in text
        assert "s3cretPW" not in _everything_printed(info.value) and "\n" not in text


@pytest.mark.parametrize(
    ("value", "meant"),
    [(w, True) for w in ("true", "TRUE", "1", "yes", "Yes", "on", "t", "y")]
    + [(w, False) for w in ("false", "False", "0", "no", "NO", "off", "f", "n")],
)
def test_yes_no_url_options_reach_redis_py_as_meant(value: str, meant: bool) -> None:
    """Every word taken means to redis-py (its ``to_bool``) what it says, on a server
    and on a cluster URL."""
    import redis

    from ctxguard.stores.redis_clients import _cluster_kwargs

    url = parse_store_url(f"rediss://:pw@h:1?socket_keepalive={value}&ssl_check_hostname={value}")
    kwargs = redis.Redis.from_url(url.redis_url()).connection_pool.connection_kwargs
    assert (kwargs["socket_keepalive"], kwargs["ssl_check_hostname"]) == (meant, meant)
    cluster = parse_store_url(f"redis+cluster://127.0.0.1:1,127.0.0.1:2?socket_keepalive={value}")
    assert _cluster_kwargs(cluster, asynchronous=False)["socket_keepalive"] is meant
