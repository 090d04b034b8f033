"""The gateway's settings: flags over environment variables over a TOML file over defaults.

Pure data and parsing (no I/O but reading the TOML file); secrets (the upstream API key,
the client API keys, a store password) never appear in ``repr`` or :meth:`describe`.
"""

from __future__ import annotations

import json
import os
import tomllib
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from ctxguard._validate import MAX_SECONDS, check_http_url, is_seconds, show
from ctxguard.errors import ConfigError, InvalidIdError
from ctxguard.ids import validate_name
from ctxguard.stores.urls import parse_store_url, redact_url

ENV_PREFIX = "CTXGUARD_SERVE_"
# Worker processes: each holds its own guards, counter, store pool and an upstream pool of
# up to 1024 connections, so past a few dozen they only add memory and connections (64
# of them could open 65,536 to one model server). A fixed cap, not one relative to this
# host's CPUs: the same settings file must mean the same on every host it is used on.
MAX_WORKERS = 64
# Messages read back, per keyed request, to find a recorded reply (and the Responses
# API's previous_response_id): a keyed request reads this many messages from the store.
MAX_IDEMPOTENCY_WINDOW = 4096
LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")  # uvicorn's
COMMITS = ("prepare", "with_reply")  # GuardConfig.commit


@dataclass(frozen=True, repr=False)
class ServeConfig:
    """Everything ``ctxguard serve`` needs; every field but ``upstream`` has a default.

    ``counter=None`` counts through the upstream's ``/tokenize`` (``vllm:<upstream>``);
    ``limit=None`` reads the upstream's ``/v1/models`` ``max_model_len``.
    ``api_keys`` maps a client's bearer key to its tenant; when set, every request
    needs a known key. ``max_tokens`` is the output reserve (and the ``max_tokens``
    forwarded) when a request gives none. ``idempotency_lease`` is how long (seconds)
    an ``Idempotency-Key`` in flight stays claimed in the store without being renewed
    (it is renewed while its request runs): how long a retry waits for a holder that died.
    ``metrics`` serves ``GET /metrics`` when ``ctxguard[metrics]`` is installed.
    ``workers`` is at most :data:`MAX_WORKERS`; ``idempotency_window`` (how many of the
    session's newest messages are searched for a key's recorded reply) at most
    :data:`MAX_IDEMPOTENCY_WINDOW`. ``commit`` is the guards' ``GuardConfig.commit``:
    ``"prepare"`` stores a turn's new messages before the request goes upstream (a request
    the upstream refuses is taken back); ``"with_reply"`` stores them with the reply, in one
    atomic step, so a request that gets no reply (refused, failed, timed out, the client
    gone) leaves nothing stored.
    """

    upstream: str
    url: str = field(default="redis://localhost:6379/0", repr=False)
    counter: str | None = None
    limit: int | None = None
    model: str | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    workers: int = 1
    namespace: str | None = None
    tenant: str | None = None
    api_keys: Mapping[str, str] = field(default_factory=dict, repr=False)
    upstream_api_key: str | None = field(default=None, repr=False)
    max_tokens: int = 1024
    safety_margin: int = 0
    ttl_seconds: int | None = None
    max_body_bytes: int = 8 << 20
    connect_timeout: float = 5.0
    upstream_timeout: float = 600.0
    idempotency_window: int = 64
    idempotency_lease: float = 10.0
    metrics: bool = True
    log_level: str = "info"
    commit: str = "prepare"

    def __post_init__(self) -> None:
        check_http_url(self.upstream, "upstream")
        if not isinstance(self.url, str):
            raise ConfigError(f"url must be a store URL string, got {type(self.url).__name__}")
        parse_store_url(self.url)  # a bad store URL stops the start, not every request
        for name in ("port", "workers", "max_tokens", "max_body_bytes", "idempotency_window"):
            value = getattr(self, name)
            if type(value) is not int or value < (0 if name == "port" else 1):
                raise ConfigError(f"{name} must be a positive int, got {value!r}")
        if self.port > 65535:
            raise ConfigError(f"port must be at most 65535, got {self.port}")
        if self.workers > MAX_WORKERS:
            raise ConfigError(
                f"workers must be at most {MAX_WORKERS} (each is a process with its own pools), "
                f"got {self.workers}; run more gateways on the same store instead"
            )
        if self.idempotency_window > MAX_IDEMPOTENCY_WINDOW:
            raise ConfigError(
                f"idempotency_window must be at most {MAX_IDEMPOTENCY_WINDOW} messages (a keyed "
                f"request reads that many), got {self.idempotency_window}"
            )
        if not isinstance(self.host, str) or not self.host:
            raise ConfigError(f"host must be an address such as 127.0.0.1, got {self.host!r}")
        for name in ("counter", "model", "upstream_api_key"):
            if not isinstance(getattr(self, name), str | None):
                kind = type(getattr(self, name)).__name__
                raise ConfigError(f"{name} must be a string, got a {kind}")
        if self.log_level not in LOG_LEVELS:
            raise ConfigError(
                f"log_level must be one of {', '.join(LOG_LEVELS)}, got {show(self.log_level)}"
            )
        if self.commit not in COMMITS:
            raise ConfigError(
                f"commit must be one of {', '.join(COMMITS)} (when a turn's messages are "
                f"stored), got {show(self.commit)}"
            )
        if type(self.safety_margin) is not int or self.safety_margin < 0:
            raise ConfigError(f"safety_margin must be a non-negative int, got {self.safety_margin}")
        for name in ("limit", "ttl_seconds"):
            value = getattr(self, name)
            if value is not None and (type(value) is not int or value < 1):
                raise ConfigError(f"{name} must be a positive int, got {value!r}")
        for name in ("connect_timeout", "upstream_timeout", "idempotency_lease"):
            value = getattr(self, name)
            if not is_seconds(value):
                raise ConfigError(
                    f"{name} must be a positive number of seconds, at most {MAX_SECONDS:,}, "
                    f"got {value!r}"
                )
        if not isinstance(self.metrics, bool):
            raise ConfigError(f"metrics must be true or false, got {self.metrics!r}")
        if not isinstance(self.api_keys, Mapping):
            raise ConfigError("api_keys must be a table of key = tenant")
        names = [(self.namespace, "namespace"), (self.tenant, "tenant")]
        names += [(t, "tenant of an API key") for t in self.api_keys.values()]
        for value, what in names:
            if value is not None:
                try:
                    validate_name(value, what)
                except InvalidIdError as exc:
                    raise ConfigError(str(exc)) from None

    def __repr__(self) -> str:
        shown = ", ".join(f"{k}={v!r}" for k, v in self.describe().items())
        return f"ServeConfig({shown})"

    @property
    def counter_spec(self) -> str:
        return self.counter or f"vllm:{self.upstream}"

    def describe(self) -> dict[str, Any]:
        """The settings without secrets (for the startup log line and /health)."""
        data = asdict(self)
        data["url"] = redact_url(self.url)
        data["upstream"] = redact_url(self.upstream)
        if self.counter is not None:
            data["counter"] = redact_url(self.counter)
        data["api_keys"] = f"{len(self.api_keys)} keys"
        data["upstream_api_key"] = "***" if self.upstream_api_key else None
        return data

    def to_json(self) -> str:
        return json.dumps({**asdict(self), "api_keys": dict(self.api_keys)})

    @classmethod
    def from_json(cls, text: str) -> ServeConfig:
        return cls(**json.loads(text))


_TYPES: dict[str, type] = {
    "limit": int,
    "port": int,
    "workers": int,
    "max_tokens": int,
    "safety_margin": int,
    "ttl_seconds": int,
    "max_body_bytes": int,
    "idempotency_window": int,
    "connect_timeout": float,
    "upstream_timeout": float,
    "idempotency_lease": float,
}
_BOOLS = {"1": True, "true": True, "yes": True, "on": True}
_BOOLS |= {"0": False, "false": False, "no": False, "off": False}
NAMES = tuple(f.name for f in fields(ServeConfig))


def load_config(
    flags: Mapping[str, Any],
    *,
    config_file: str | Path | None = None,
    environ: Mapping[str, str] | None = None,
) -> ServeConfig:
    """Merge (highest first) ``flags`` (None = not given), ``CTXGUARD_SERVE_*`` variables
    (``CTXGUARD_SERVE_API_KEYS`` as ``key=tenant,key2=tenant2``), and the TOML file."""
    env = os.environ if environ is None else environ
    merged: dict[str, Any] = {}
    if config_file is not None:
        merged.update(_from_toml(Path(config_file)))
    for name in NAMES:
        raw = env.get(ENV_PREFIX + name.upper())
        if raw is not None and raw != "":
            merged[name] = _from_text(name, raw)
    if "url" not in merged and env.get("CTXGUARD_URL"):
        merged["url"] = env["CTXGUARD_URL"]
    merged.update({k: v for k, v in flags.items() if v is not None})
    if "upstream" not in merged:
        raise ConfigError(
            "no upstream: pass --upstream http://vllm:8000 (or CTXGUARD_SERVE_UPSTREAM)"
        )
    return ServeConfig(**merged)


def _from_text(name: str, raw: str) -> Any:
    if name == "api_keys":
        pairs = [p for p in raw.split(",") if p.strip()]
        keys: dict[str, str] = {}
        for pair in pairs:
            key, sep, tenant = pair.partition("=")
            if not sep or not key.strip():
                raise ConfigError(
                    f"{ENV_PREFIX}API_KEYS takes key=tenant pairs separated by commas "
                    f"(entry {len(keys) + 1} has no '=')"
                )
            keys[key.strip()] = tenant.strip()
        return keys
    if name == "metrics":
        flag = raw.strip().lower()
        if flag not in _BOOLS:
            raise ConfigError(f"{ENV_PREFIX}METRICS must be 1/0, true/false, yes/no or on/off")
        return _BOOLS[flag]
    kind = _TYPES.get(name)
    if kind is None:
        return raw
    try:
        return kind(raw)
    except ValueError:
        raise ConfigError(
            f"{ENV_PREFIX}{name.upper()} must be a number, got {show(raw, 40)}"
        ) from None


MAX_CONFIG_BYTES = 1 << 20  # a settings file; /dev/zero was read until memory ran out


def _from_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as handle:
            raw = handle.read(MAX_CONFIG_BYTES + 1)
        if len(raw) > MAX_CONFIG_BYTES:
            raise ConfigError(
                f"config file {path} is over {MAX_CONFIG_BYTES >> 20} MiB: "
                "pass the gateway's settings file"
            )
        data = tomllib.loads(raw.decode("utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
    except RecursionError:
        raise ConfigError(f"config file {path} is nested too deeply to read") from None
    section = data.get("serve", data)
    if not isinstance(section, dict):
        raise ConfigError(f"config file {path}: [serve] must be a table")
    unknown = sorted(set(section) - set(NAMES))
    if unknown:
        raise ConfigError(
            f"config file {path}: unknown setting {', '.join(unknown)}; known: {', '.join(NAMES)}"
        )
    return dict(section)
