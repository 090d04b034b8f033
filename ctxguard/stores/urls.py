"""Store URLs: which backend, which namespace/tenant, and how to print them safely."""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from ctxguard.errors import ConfigError

OWN_PARAMS = ("namespace", "tenant")
SCHEMES = ("memory", "redis", "rediss", "redis+cluster", "rediss+cluster")


@dataclass(frozen=True)
class StoreURL:
    """A parsed store URL; ``backend_url`` has ctxguard's own query parameters removed."""

    scheme: str
    backend_url: str = field(repr=False)  # may hold a password: never printed
    namespace: str
    tenant: str
    name: str = ""
    hosts: tuple[tuple[str, int], ...] = field(default=())

    @property
    def redacted(self) -> str:
        return redact_url(self.backend_url)

    def __str__(self) -> str:
        return self.redacted


def redact_url(url: str) -> str:
    """The URL with any password replaced by ``***`` (safe for logs and errors).

    Works on the raw text rather than a parsed URL, so a password holding an
    unencoded ``#``, ``/`` or ``?`` (which confuses URL parsing) is still hidden
    whole: everything between the user name's ``:`` and the last ``@`` goes.
    """
    scheme, sep, rest = url.partition("://")
    at = rest.rfind("@")
    if not sep or at < 0:
        return url
    credentials, host = rest[:at], rest[at + 1 :]
    user, colon, _ = credentials.partition(":")
    return f"{scheme}://{user}:***@{host}" if colon else url


def parse_store_url(url: str, namespace: str | None = None, tenant: str | None = None) -> StoreURL:
    """Split ``url`` into backend and ctxguard options; explicit arguments win."""
    if not isinstance(url, str) or "://" not in url:
        raise ConfigError(
            f"store URL {redact_url(str(url))!r} is not a URL; use memory://, "
            "redis://host:6379/0, rediss://... or redis+cluster://h1:p1,h2:p2"
        )
    scheme = url.split("://", 1)[0].lower()
    if scheme not in SCHEMES:
        raise ConfigError(
            f"unknown store scheme {scheme!r} in {redact_url(url)!r}; use one of "
            + ", ".join(f"{s}://" for s in SCHEMES)
        )
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    own = {k: v for k, v in query if k in OWN_PARAMS}
    rest = [(k, v) for k, v in query if k not in OWN_PARAMS]
    backend = urlunsplit(parts._replace(query=urlencode(rest)))
    return StoreURL(
        scheme=scheme,
        backend_url=backend,
        namespace=_first(namespace, own.get("namespace"), "ctxg"),
        tenant=_first(tenant, own.get("tenant"), "default"),
        name=parts.netloc if scheme == "memory" else "",
        hosts=_cluster_hosts(parts.netloc) if scheme.endswith("+cluster") else (),
    )


def _cluster_hosts(netloc: str) -> tuple[tuple[str, int], ...]:
    hostpart = netloc.rsplit("@", 1)[-1]
    hosts: list[tuple[str, int]] = []
    for item in hostpart.split(","):
        host, _, port = item.rpartition(":")
        if not host or not port.isdigit():
            raise ConfigError(
                f"cluster node {item!r} must be host:port, as in redis+cluster://h1:7000,h2:7001"
            )
        hosts.append((host.strip("[]"), int(port)))
    return tuple(hosts)


def _first(*values: str | None) -> str:
    """The first value given at all: an explicit empty name is kept (and then refused)."""
    return next(v for v in values if v is not None)
