"""Store URLs: which backend, which namespace/tenant, and how to print them safely.

Redaction is structural: a URL is parsed once into its parts (scheme, user,
password, servers, database, options) and every text shown to anyone (errors,
``str``/``repr``, logs, the CLI) is rendered from those parts with the
password replaced by ``***``. A URL that does not parse is never echoed: the
error names the part that is wrong ("the port of node 2 is not a number"),
not its text, because a password holding ``/``, ``?``, ``#`` or ``@`` that was
not percent-encoded can make any part of the text hold a piece of it.

A password holding URL characters should be percent-encoded
(``urllib.parse.quote(password, safe="")``); an unencoded one is still
accepted when the URL reads only one way (``redis://:a/b#c@host:6379/0``).

Kept whole past ~400 lines on purpose: parsing and every rendering share the one parsed
form, and redaction is only structural while they stay together.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from urllib.parse import parse_qsl, quote, quote_plus, unquote

from ctxguard._validate import MAX_INT, MAX_SECONDS, is_seconds, show
from ctxguard.errors import ConfigError
from ctxguard.stores.url_options import check_cluster_options, check_option_values

OWN_PARAMS = ("namespace", "tenant")
SCHEMES = ("memory", "redis", "rediss", "redis+cluster", "rediss+cluster")
DEFAULT_PORT = 6379
DEFAULT_CONNECT_TIMEOUT = 5.0  # seconds to open the TCP connection (and the TLS handshake)
DEFAULT_READ_TIMEOUT = 10.0  # seconds to wait for any reply
CONNECT_TIMEOUT_PARAM = "socket_connect_timeout"
READ_TIMEOUT_PARAM = "socket_timeout"

# The query parameters a store URL may carry (the redis-py connection settings
# that make sense for ctxguard; ``decode_responses``, ``retry_on_*`` and
# ``protocol`` would change what the stores receive, so they are not taken).
# An unknown name is refused without being echoed: a password holding ``&``
# that was not encoded would make a piece of it look like a parameter name.
KNOWN_PARAMS = (
    "db",
    "username",
    "password",
    "client_name",
    CONNECT_TIMEOUT_PARAM,
    READ_TIMEOUT_PARAM,
    "socket_keepalive",
    "health_check_interval",
    "max_connections",
    "ssl_ca_certs",
    "ssl_ca_path",
    "ssl_cert_reqs",
    "ssl_certfile",
    "ssl_keyfile",
    "ssl_password",
    "ssl_check_hostname",
    "ssl_min_version",
    "ssl_ciphers",
)
MAX_DB = 2**31 - 1  # Redis' "databases" setting (how many there are) is a 32-bit int
# the whole-number options, checked when the URL is parsed (redis-py checks them only when
# a connection is made): name -> (lowest, highest, what the number counts)
_WHOLE_PARAMS = {
    "max_connections": (1, MAX_INT, " of connections"),
    "health_check_interval": (0, MAX_SECONDS, " of seconds"),  # (0: no health checks)
}
# the yes/no options, checked when the URL is parsed: redis-py reads 0, f, false, n, no and
# off (any case) as false and any other text as true, so a typo (`socket_keepalive=maybe`,
# `ssl_check_hostname=flase`) turned an option on; only these words are taken
_BOOL_PARAMS = ("socket_keepalive", "ssl_check_hostname")
_BOOL_WORDS = frozenset({"1", "t", "true", "y", "yes", "on", "0", "f", "false", "n", "no", "off"})
_HOST = re.compile(r"[A-Za-z0-9._-]+|\[[0-9A-Fa-f:.]+\]")
_SCHEME = re.compile(r"[a-z][a-z0-9+.-]{0,19}")
_USAGE = "use memory://, redis://host:6379/0, rediss://... or redis+cluster://h1:p1,h2:p2"


def _is_secret(name: str) -> bool:
    return "password" in name


@dataclass(frozen=True, repr=False)
class StoreURL:
    """A parsed store URL. ``password`` and secret options are never printed.

    ``servers`` lists every host and port given (one for ``redis://``);
    ``hosts`` is the same list for a cluster URL and empty otherwise.
    ``options`` are the redis-py query parameters in the order given (no
    credentials, no ctxguard parameters); ``connect_timeout`` and
    ``read_timeout`` are resolved (argument, else URL, else the default).
    """

    scheme: str
    namespace: str
    tenant: str
    name: str = ""
    servers: tuple[tuple[str, int], ...] = ()
    path: str = ""  # "", "/" or "/<db>", as written
    db: int = 0
    username: str | None = None
    password: str | None = field(default=None, compare=False)
    options: tuple[tuple[str, str], ...] = ()
    secret_options: tuple[tuple[str, str], ...] = field(default=(), compare=False)
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT
    read_timeout: float = DEFAULT_READ_TIMEOUT

    @property
    def cluster(self) -> bool:
        return self.scheme.endswith("+cluster")

    @property
    def tls(self) -> bool:
        return self.scheme.startswith("rediss")

    @property
    def hosts(self) -> tuple[tuple[str, int], ...]:
        return self.servers if self.cluster else ()

    @property
    def redacted(self) -> str:
        """The URL with the password (and any secret option) shown as ``***``."""
        return self._render(redact=True)

    @property
    def where(self) -> str:
        """The servers only (``host:port[,host:port]``), for error messages."""
        return ",".join(_hostport(h, p) for h, p in self.servers) or self.name

    @property
    def backend_url(self) -> str:
        """The whole URL for a client library: holds the password, never print it."""
        return self._render(redact=False)

    def redis_url(self) -> str:
        """A ``redis://`` or ``rediss://`` URL of the first server for redis-py to parse.

        It holds neither credentials nor timeouts (those go to redis-py as
        keyword arguments, which its URL parsing would otherwise override), so
        nothing redis-py says about it can show a secret.
        """
        host, port = self.servers[0]
        scheme = "rediss" if self.tls else "redis"
        keep = [
            (k, v) for k, v in self.options if k not in (CONNECT_TIMEOUT_PARAM, READ_TIMEOUT_PARAM)
        ]
        query = "&".join(f"{k}={quote(v, safe='')}" for k, v in keep)
        db = "" if self.cluster else f"/{self.db}"
        return f"{scheme}://{_hostport(host, port)}{db}" + (f"?{query}" if query else "")

    @property
    def secret_values(self) -> tuple[str, ...]:
        """The password and secret options' values, as given and percent-encoded, the
        longest first: what to take out of text another program wrote (a server may
        quote a command's arguments back: ``_secrets.forget``)."""
        values = {
            form
            for value in (self.password, *(v for _, v in self.secret_options))
            if value
            for form in (value, quote(value, safe=""), quote_plus(value, safe=""), *_quoted(value))
        }
        return tuple(sorted(values, key=lambda v: (-len(v), v)))

    def client_kwargs(self) -> dict[str, object]:
        """Credentials, secret options and timeouts as redis-py keyword arguments."""
        kwargs: dict[str, object] = {
            "socket_connect_timeout": self.connect_timeout,
            "socket_timeout": self.read_timeout,
        }
        if self.username is not None:
            kwargs["username"] = self.username
        if self.password is not None:
            kwargs["password"] = self.password
        kwargs.update(self.secret_options)
        return kwargs

    def _render(self, redact: bool) -> str:
        if self.scheme == "memory":
            return f"memory://{self.name}"
        user = quote(self.username, safe="") if self.username is not None else ""
        if self.password is not None:
            user += ":" + ("***" if redact else quote(self.password, safe=""))
        auth = f"{user}@" if user else ""
        servers = ",".join(_hostport(h, p) for h, p in self.servers)
        params = [*self.options, *self.secret_options]
        query = "&".join(
            f"{k}={'***' if redact and _is_secret(k) else quote(v, safe='')}" for k, v in params
        )
        # the database as a path, wherever it was given (a ?db= is not kept among the options)
        path = f"/{self.db}" if not self.cluster and (self.db or self.path.strip("/")) else ""
        return f"{self.scheme}://{auth}{servers}{path}" + (f"?{query}" if query else "")

    def __str__(self) -> str:
        return self.redacted

    def __repr__(self) -> str:
        return f"StoreURL({self.redacted!r}, namespace={self.namespace!r}, tenant={self.tenant!r})"


def _hostport(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


# -- parsing ---------------------------------------------------------------------


class _Bad(Exception):
    """One reading of the URL failed; the message names the part, never its text."""


@dataclass
class _Reading:
    username: str | None
    password: str | None
    servers: tuple[tuple[str, int], ...]
    path: str
    params: list[tuple[str, str]]


def _is_unicode(text: str) -> bool:
    """False for a lone surrogate: what Python makes of argv or environment bytes
    that are not UTF-8 (no URL part may be built or quoted from one)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def parse_store_url(
    url: str,
    namespace: str | None = None,
    tenant: str | None = None,
    *,
    connect_timeout: float | None = None,
    read_timeout: float | None = None,
) -> StoreURL:
    """Parse ``url``; explicit arguments win over the URL's query parameters.

    Every error is a :class:`ConfigError` naming the part of the URL that is
    wrong, never quoting it.
    """
    if not isinstance(url, str) or "://" not in url:
        raise ConfigError(f"the store URL is not a URL (no scheme://); {_USAGE}")
    if not url.isascii() and not _is_unicode(url):
        raise ConfigError(
            "the store URL holds bytes that are not UTF-8 text (undecodable bytes in an "
            "argument or the environment); percent-encode them (%XX)"
        )
    scheme_text, rest = url.split("://", 1)
    scheme = scheme_text.lower()
    if scheme not in SCHEMES:
        shown = f" {scheme!r}" if _SCHEME.fullmatch(scheme) else ""
        raise ConfigError(
            f"unknown store scheme{shown} in the store URL; use one of "
            + ", ".join(f"{s}://" for s in SCHEMES)
        )
    connect = _timeout("connect_timeout", connect_timeout)
    read = _timeout("read_timeout", read_timeout)
    if scheme == "memory":
        name = rest[: _authority_end(rest)]
        if "@" in name:
            raise ConfigError("a memory:// URL takes a name only (memory://name), no credentials")
        try:
            params = _query(rest.partition("?")[2])
        except _Bad as exc:
            raise ConfigError(str(exc)) from None
        return StoreURL(
            scheme=scheme,
            namespace=_first(namespace, _param(params, "namespace"), "ctxg"),
            tenant=_first(tenant, _param(params, "tenant"), "default"),
            name=name,
            connect_timeout=_first_timeout(connect, params, CONNECT_TIMEOUT_PARAM),
            read_timeout=_first_timeout(read, params, READ_TIMEOUT_PARAM),
        )
    reading = _read(rest, cluster=scheme.endswith("+cluster"))
    params = reading.params
    username = reading.username if reading.username is not None else _param(params, "username")
    password = reading.password if reading.password is not None else _param(params, "password")
    db_param = _param(params, "db")
    db = _whole(reading.path.strip("/") or "0", "the database of the store URL", 0, MAX_DB)
    if db_param is not None:
        db = _whole(db_param, "the db parameter of the store URL", 0, MAX_DB)
    for name, (low, high, unit) in _WHOLE_PARAMS.items():
        if (text := _param(params, name)) is not None:
            _whole(text, f"{name} in the store URL", low, high, unit)
    for name, text in params:
        if name in _BOOL_PARAMS and text.lower() not in _BOOL_WORDS:  # (the text is not shown)
            raise ConfigError(
                f"{name} in the store URL must be true or false (also 1/0, yes/no, on/off, "
                "t/f, y/n; any case)"
            )
    if scheme.endswith("+cluster") and db != 0:
        raise ConfigError("a Redis Cluster has database 0 only; drop the database from the URL")
    if not scheme.startswith("rediss") and any(k.startswith("ssl_") for k, _ in params):
        # (redis-py's plain connection takes no ssl_* argument: it failed on every call)
        raise ConfigError(
            "ssl_* options in the store URL need TLS: use rediss:// (or rediss+cluster://)"
        )
    check_option_values(params)
    if scheme.endswith("+cluster"):
        check_cluster_options(params)
    skip = (*OWN_PARAMS, "username", "password", "db")
    return StoreURL(
        scheme=scheme,
        namespace=_first(namespace, _param(params, "namespace"), "ctxg"),
        tenant=_first(tenant, _param(params, "tenant"), "default"),
        servers=reading.servers,
        path=reading.path,
        db=db,
        username=username or None,
        password=password or None,
        options=tuple((k, v) for k, v in params if k not in skip and not _is_secret(k)),
        secret_options=tuple((k, v) for k, v in params if k not in skip and _is_secret(k)),
        connect_timeout=_first_timeout(connect, params, CONNECT_TIMEOUT_PARAM),
        read_timeout=_first_timeout(read, params, READ_TIMEOUT_PARAM),
    )


def _read(rest: str, cluster: bool) -> _Reading:
    """The one reading of ``scheme://<rest>`` that parses.

    First as the standard says (the authority ends at the first ``/``, ``?``
    or ``#``); if that does not parse, at each ``@`` that leaves an unencoded
    ``/``, ``?`` or ``#`` in the credentials before it, in order. A reading whose
    authority parses and names its port (``host:port``, every node of a cluster)
    while its path or query does not ends the search: that path or query is what
    is wrong, and a reading at an ``@`` further on would make a host of text after
    it (a piece of a password written there, say) and show it in every error and
    repr. The first reading's error is the one reported.
    """
    end = _authority_end(rest)
    try:
        return _reading(rest[:end], rest[end:], cluster)
    except _Bad as exc:
        first = exc
    stands = _names_its_port(rest[:end], cluster)  # then the path or the query is wrong
    for at in [] if stands else [i for i, c in enumerate(rest) if c == "@"]:
        creds, remainder = rest[:at], rest[at + 1 :]
        if not any(c in creds for c in "/?#"):
            continue
        end = _authority_end(remainder)
        authority = remainder[:end]
        if "@" in authority:
            continue
        try:
            found = _reading(authority, remainder[end:], cluster)
        except _Bad:
            if _names_its_port(authority, cluster):
                break
            continue
        found.username, found.password = _credentials(creds)
        return found
    hint = "; percent-encode a password that holds / ? # @ or &" if "@" in rest else ""
    raise ConfigError(f"{first}{hint}")


def _names_its_port(authority: str, cluster: bool) -> bool:
    """The authority parses as ``[creds@]host:port`` (a cluster's: its nodes, each
    with its port)."""
    try:
        _authority(authority, cluster)
    except _Bad:
        return False
    return cluster or _PORT_AT_END.search(authority.rpartition("@")[2]) is not None


_PORT_AT_END = re.compile(r":[0-9]+$")


def _authority_end(text: str) -> int:
    return min((i for i in (text.find(c) for c in "/?#") if i >= 0), default=len(text))


def _reading(authority: str, tail: str, cluster: bool) -> _Reading:
    path, _, query = tail.partition("?")
    if path not in ("", "/") and not (path[1:].isdigit() and path[1:].isascii()):
        raise _Bad("the path of the store URL is not a database number (write /0)")
    params = _query(query)
    username, password, servers = _authority(authority, cluster)
    return _Reading(username, password, servers, path, params)


def _authority(
    authority: str, cluster: bool
) -> tuple[str | None, str | None, tuple[tuple[str, int], ...]]:
    if cluster:
        return _cluster_authority(authority)
    creds, at, hostpart = authority.rpartition("@")
    username, password = _credentials(creds) if at else (None, None)
    return username, password, (_server(hostpart, None, needs_port=False),)


def _cluster_authority(
    authority: str,
) -> tuple[str | None, str | None, tuple[tuple[str, int], ...]]:
    """``[cred@]h1:p1,h2:p2`` or per node ``cred@h1:p1,cred@h2:p2`` (one set of credentials)."""
    try:  # credentials on each node (all the same: redis-py uses one set)
        found = set()
        servers = []
        for n, item in enumerate(authority.split(","), 1):
            creds, at, hostpart = item.rpartition("@")
            if at:
                found.add(_credentials(creds))
            servers.append(_server(hostpart, n, needs_port=True))
        if len(found) > 1:
            raise ConfigError(
                "the nodes of the cluster URL carry different credentials; give one user "
                "name and password for every node (redis-py uses one set)"
            )
        username, password = found.pop() if found else (None, None)
        return username, password, tuple(servers)
    except _Bad:
        pass
    creds, at, hostpart = authority.rpartition("@")  # one set before the node list
    username, password = _credentials(creds) if at else (None, None)
    nodes = tuple(_server(h, n, needs_port=True) for n, h in enumerate(hostpart.split(","), 1))
    return username, password, nodes


def _credentials(creds: str) -> tuple[str | None, str | None]:
    user, colon, password = creds.partition(":")
    return (unquote(user) or None, unquote(password) if colon else None)


def _server(text: str, node: int | None, needs_port: bool) -> tuple[str, int]:
    which = f"node {node} of the cluster URL" if node else "the store URL"
    if text.startswith("["):
        host, close, after = text.partition("]")
        host += close
        port_text = after[1:] if after.startswith(":") else None
        if after and port_text is None:
            raise _Bad(f"the host of {which} is not a host name or address")
    else:
        host, colon, port_text_raw = text.partition(":")
        port_text = port_text_raw if colon else None
    if not host:
        raise _Bad(f"{which} has no host")
    if not _HOST.fullmatch(host):
        raise _Bad(f"the host of {which} is not a host name or address")
    if port_text is None:
        if needs_port:
            raise _Bad(f"{which} has no port; write host:port, as in redis+cluster://h1:7000")
        return host.strip("[]"), DEFAULT_PORT
    if not port_text.isdigit() or not port_text.isascii():
        raise _Bad(f"the port of {which} is not a number")
    port = int(port_text)
    if not 1 <= port <= 65535:
        raise _Bad(f"the port of {which} is out of range (1-65535)")
    return host.strip("[]"), port


def _query(query: str) -> list[tuple[str, str]]:
    params = parse_qsl(query, keep_blank_values=True) if query else []
    for n, (name, _) in enumerate(params, 1):
        if name not in KNOWN_PARAMS and name not in OWN_PARAMS:
            raise _Bad(
                f"query parameter {n} of the store URL is not one ctxguard knows (known: "
                + ", ".join((*OWN_PARAMS, *KNOWN_PARAMS))
                + ")"
            )
    seen: set[str] = set()
    for name, _ in params:  # (a known name: safe to show; the values never are)
        if name in seen:  # which one wins is a guess (redis-py took one, ctxguard another)
            raise _Bad(
                f"{name} is given more than once in the query of the store URL; give it once"
            )
        seen.add(name)
    return params


def _param(params: list[tuple[str, str]], name: str) -> str | None:
    return next((v for k, v in params if k == name), None)


def _timeout(name: str, value: object) -> float | None:
    if value is None:
        return None
    if not is_seconds(value):
        raise ConfigError(
            f"{name} must be a positive number of seconds, at most {MAX_SECONDS:,}, "
            f"got {show(value)}"
        )
    return float(value)


def _first_timeout(given: float | None, params: list[tuple[str, str]], name: str) -> float:
    if given is not None:
        return given
    text = _param(params, name)
    if text is None:
        return DEFAULT_CONNECT_TIMEOUT if name == CONNECT_TIMEOUT_PARAM else DEFAULT_READ_TIMEOUT
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not is_seconds(value):
        raise ConfigError(
            f"{name} in the store URL must be a positive number of seconds, at most {MAX_SECONDS:,}"
        )
    return value


def _whole(text: str, what: str, low: int, high: int, unit: str = "") -> int:
    """``text`` as a whole number from ``low`` to ``high``, else a ConfigError that names
    ``what`` and the range, never the text (it may hold a piece of an unencoded password)."""
    number = (text.lstrip("0") or "0") if text.isascii() and text.isdigit() else ""
    if not number or len(number) > 19 or not low <= int(number) <= high:  # (19: past any bound)
        raise ConfigError(f"{what} must be a whole number{unit} from {low} to {high:,}")
    return int(number)


def _first(*values: str | None) -> str:
    """The first value given at all: an explicit empty name is kept (and then refused)."""
    return next(v for v in values if v is not None)


# -- redacting any URL -------------------------------------------------------------

_SECRET_PARAM = re.compile(r"(?i)(pass|secret|token|key|auth|sig)")


def _quoted(value: str) -> list[str]:
    """What Redis's "unknown command" error quotes of an argument: CR and LF as spaces,
    and only the first 128 bytes of all the arguments (fewer of the password after a
    user name): each start of it down to 16 characters (shorter ones could match words
    of the error; a start shorter still only follows a user name of over 100)."""
    echoed = value.replace("\r", " ").replace("\n", " ")
    return [echoed, *(echoed[:size] for size in range(16, min(len(echoed), 128)))]


def redact_url(url: str) -> str:
    """The URL with any password replaced by ``***`` (safe for logs and errors).

    A store URL is parsed and rendered from its parts. Any other URL (an HTTP
    server's, say) keeps what follows its last ``@``; everything before it
    becomes ``***``, and so do query values whose name suggests a secret.
    Text that does not parse as a URL at all is not shown.
    """
    if not isinstance(url, str) or "://" not in url:
        return "<not a URL>"
    try:
        return parse_store_url(url).redacted
    except ConfigError:
        pass
    scheme, rest = url.split("://", 1)
    if not _SCHEME.fullmatch(scheme.lower()):
        return "<not a URL>"
    creds = "***@" if "@" in rest else ""
    rest = rest.rpartition("@")[2]
    head, q, query = rest.partition("?")
    if q:
        items: list[str] = []
        for item in query.split("&"):
            if not item:  # nothing to hide ("?" at the end of a sentence, "&&")
                items.append(item)
                continue
            name, eq, _ = item.partition("=")
            plain = re.fullmatch(r"[A-Za-z0-9._~-]+", name) is not None
            if plain and not _SECRET_PARAM.search(name):
                items.append(item)
            else:
                items.append(f"{name if plain else '***'}=***" if eq else "***")
        query = "&".join(items)
    return f"{scheme}://{creds}{head}{q}{query}"
