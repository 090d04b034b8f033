"""Session stores, chosen by URL.

=====================================  =========================================
URL                                    store
=====================================  =========================================
``memory://`` or ``memory://name``     in-process (the zero-setup default)
``redis://[user:pass@]host:port/db``   Redis (``rediss://`` for TLS)
``redis+cluster://h1:p1,h2:p2``        Redis Cluster (``rediss+cluster://``)
=====================================  =========================================

``?namespace=app&tenant=acme`` (or the keyword arguments) isolate apps and
tenants sharing one server. The same URL opens the sync and the async store.

Every Redis connection has a connect timeout (5 s) and a read timeout (10 s):
``?socket_connect_timeout=2&socket_timeout=30`` in the URL, or the
``connect_timeout`` / ``read_timeout`` keyword arguments (which win), change them.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from ctxguard._validate import one_line, show
from ctxguard.errors import ConfigError
from ctxguard.ids import validate_name
from ctxguard.stores.base import (
    AppendResult,
    AsyncSessionStore,
    NewMessage,
    SessionInfo,
    SessionStore,
    StoredMessage,
    Summary,
    WindowFetch,
    WindowHit,
    WriteOptions,
)
from ctxguard.stores.memory import AsyncMemoryStore, MemoryStore
from ctxguard.stores.urls import StoreURL, parse_store_url, redact_url

_memory: dict[tuple[str, str, str], MemoryStore] = {}
REDIS_OPTIONS = ("client", "retry")  # what RedisStore and AsyncRedisStore take besides the URL
_memory_lock = threading.Lock()


def _memory_store(name: str, namespace: str, tenant: str) -> MemoryStore:
    """``memory://`` stores with the same name, namespace and tenant share state in-process."""
    with _memory_lock:
        key = (name, namespace, tenant)
        if key not in _memory:
            _memory[key] = MemoryStore(namespace, tenant)
        return _memory[key]


def _parsed(
    opener: str,
    url: str,
    namespace: str | None,
    tenant: str | None,
    connect_timeout: float | None,
    read_timeout: float | None,
    options: Mapping[str, Any],
) -> StoreURL:
    """The URL parsed, its namespace and tenant checked (they become key prefixes), and
    the other keyword arguments checked against what this scheme's store takes."""
    parsed = parse_store_url(
        url, namespace, tenant, connect_timeout=connect_timeout, read_timeout=read_timeout
    )
    validate_name(parsed.namespace, "namespace")
    validate_name(parsed.tenant, "tenant")
    accepted = () if parsed.scheme == "memory" else REDIS_OPTIONS
    unknown = next((name for name in options if name not in accepted), None)
    if unknown is not None:
        takes = ", ".join((*accepted, "namespace", "tenant", "connect_timeout", "read_timeout"))
        raise ConfigError(
            one_line(
                f"{opener}() got an unexpected keyword argument {show(unknown, 40)}; "
                f"a {parsed.scheme}:// store takes {takes}"
            )
        )
    return parsed


def open_store(
    url: str = "memory://",
    *,
    namespace: str | None = None,
    tenant: str | None = None,
    connect_timeout: float | None = None,
    read_timeout: float | None = None,
    **kw: Any,
) -> SessionStore:
    """Open a synchronous store for ``url`` (see the module docstring for the table)."""
    parsed = _parsed("open_store", url, namespace, tenant, connect_timeout, read_timeout, kw)
    if parsed.scheme == "memory":
        return _memory_store(parsed.name, parsed.namespace, parsed.tenant)
    from ctxguard.stores.redis import RedisStore

    return RedisStore(parsed, **kw)


def open_async_store(
    url: str = "memory://",
    *,
    namespace: str | None = None,
    tenant: str | None = None,
    connect_timeout: float | None = None,
    read_timeout: float | None = None,
    **kw: Any,
) -> AsyncSessionStore:
    """Open an asynchronous store for ``url``; same table as :func:`open_store`."""
    parsed = _parsed("open_async_store", url, namespace, tenant, connect_timeout, read_timeout, kw)
    if parsed.scheme == "memory":
        return AsyncMemoryStore(sync=_memory_store(parsed.name, parsed.namespace, parsed.tenant))
    from ctxguard.stores.redis import AsyncRedisStore

    return AsyncRedisStore(parsed, **kw)


__all__ = [
    "AppendResult",
    "AsyncMemoryStore",
    "AsyncSessionStore",
    "MemoryStore",
    "NewMessage",
    "SessionInfo",
    "SessionStore",
    "StoredMessage",
    "Summary",
    "WindowFetch",
    "WindowHit",
    "WriteOptions",
    "open_async_store",
    "open_store",
    "redact_url",
]
