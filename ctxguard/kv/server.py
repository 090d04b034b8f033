"""Read the limits a running vLLM (or OpenAI-compatible / SGLang) server reports.

``/v1/models`` gives ``max_model_len``, the per-request hard limit; ``/metrics`` gives
the gauge ``vllm:cache_config_info`` whose labels carry ``num_gpu_blocks``,
``block_size`` and, in newer versions, ``kv_cache_size_tokens``; SGLang's
``/get_server_info`` gives ``max_total_num_tokens``. The probe below is sans-I/O (a
generator that asks for paths and parses what comes back, like httpx's auth flows),
so the sync and async readers share every line of logic and only do the GETs.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from ctxguard import _http
from ctxguard._http import known_secrets
from ctxguard._secrets import forget, redact_text
from ctxguard._validate import check_http_options
from ctxguard.errors import ConfigError, ServerAuthError
from ctxguard.stores.urls import redact_url

Response = tuple[int, str]
Probe = Generator[str, Response, "ServerInfo"]

CACHE_METRIC = "vllm:cache_config_info"
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True)
class ServerInfo:
    """What one server said about one model; URL shown without credentials."""

    base_url: str
    model: str
    max_model_len: int | None
    num_gpu_blocks: int | None = None
    block_size: int | None = None
    kv_cache_size_tokens: int | None = None
    kv_cache_max_concurrency: float | None = None
    max_total_num_tokens: int | None = None
    cache_dtype: str | None = None
    gpu_memory_utilization: float | None = None

    @property
    def capacity_tokens(self) -> int | None:
        """Prefer the engine's own token figure; else blocks x block size; else SGLang's."""
        if self.kv_cache_size_tokens is not None:
            return self.kv_cache_size_tokens
        if self.num_gpu_blocks is not None and self.block_size is not None:
            return self.num_gpu_blocks * self.block_size
        return self.max_total_num_tokens

    def fair_share(self, concurrency: int) -> int | None:
        """Tokens per request when `concurrency` requests share the cache evenly."""
        if concurrency < 1:
            raise ConfigError(f"concurrency must be at least 1, got {concurrency}")
        capacity = self.capacity_tokens
        if capacity is None:
            return None
        share = capacity // concurrency
        return share - share % self.block_size if self.block_size else share


def redact(url: str) -> str:
    """Drop user:password and the query string, which may hold keys, before showing a URL."""
    scheme, sep, rest = redact_url(url).partition("?")[0].partition("://")
    return f"{scheme}{sep}{rest.rpartition('@')[2]}".rstrip("/")


def _said(text: object, secrets: Sequence[str]) -> str:
    """Text the server wrote (a model id), shown on one line: less our secrets (it may
    echo a header) and any credential by form, cut to 100 characters."""
    return redact_text(" ".join(forget(str(text), secrets).split()), 100)


def probe(base_url: str, model: str | None = None, secrets: Sequence[str] = ()) -> Probe:
    """Ask for /v1/models, /metrics and, when needed, SGLang's /get_server_info.
    ``secrets`` (:func:`known_secrets`) are taken out of what the server says. A 401/403
    on /v1/models is :class:`ServerAuthError`; on /metrics or /get_server_info (which a
    proxy may guard apart) it is, as any other status there, a figure not reported."""
    shown = redact(base_url)
    status, body = yield "/v1/models"
    if status in (401, 403):
        raise ServerAuthError(
            f"{shown}/v1/models answered HTTP {status}: the server refused the credentials; "
            "check the API key (headers=) or the user and password in the URL",
            status,
            "/v1/models",
        )
    if status != 200:
        raise ConfigError(
            f"{shown}/v1/models answered HTTP {status}; check that this is an "
            "OpenAI-compatible server and that the API key (if any) is right"
        )
    payload = _json(body, shown, "/v1/models")
    model_id, max_len = _pick_model(payload, model, shown, secrets)
    status, text = yield "/metrics"
    cache = _cache_config(text) if status == 200 else {}
    extra: Mapping[str, Any] = {}
    if not cache or max_len is None:
        status, body = yield "/get_server_info"
        extra = _sglang(body) if status == 200 else {}
    return _info(shown, model_id, max_len, cache, extra)


def _json(body: str, shown: str, path: str) -> Any:
    try:
        return json.loads(body)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{shown}{path} did not return JSON ({exc})") from exc
    except RecursionError:  # "[[[[...": valid JSON too deep to decode
        raise ConfigError(f"{shown}{path} returned JSON nested too deeply to read") from None


def _pick_model(
    payload: Any, model: str | None, shown: str, secrets: Sequence[str]
) -> tuple[str, int | None]:
    cards = payload.get("data") if isinstance(payload, Mapping) else None
    if not isinstance(cards, list) or not cards:
        raise ConfigError(f"{shown}/v1/models lists no models; is the server still loading?")
    if not all(isinstance(card, Mapping) for card in cards):
        raise ConfigError(
            f"{shown}/v1/models lists models that are not JSON objects; "
            "is this an OpenAI-compatible server?"
        )
    ids = _listed([card.get("id") for card in cards], secrets)
    if model is not None:
        matches = [c for c in cards if model in (c.get("id"), c.get("root"))]
        if not matches:
            raise ConfigError(f"{shown} does not serve {model!r}; it serves {ids}")
        cards = matches
    lengths = {_length(card) for card in cards}
    if len(lengths) > 1:
        ids = _listed([card.get("id") for card in cards], secrets)
        raise ConfigError(
            f"{shown} serves models with different limits ({ids}); pass model= to choose one"
        )
    return _said(cards[0].get("id"), secrets), lengths.pop()


def _listed(ids: list[Any], secrets: Sequence[str], most: int = 10) -> str:
    shown = ", ".join(_said(i, secrets) for i in ids[:most])
    return shown + (f" and {len(ids) - most} more" if len(ids) > most else "")


def _length(card: Mapping[str, Any]) -> int | None:
    """A card's max_model_len when it is a positive JSON integer (not a bool, list...)."""
    length = card.get("max_model_len")
    return length if type(length) is int and length > 0 else None


def parse_prometheus_labels(text: str, metric: str) -> list[dict[str, str]]:
    """Label sets of every sample of `metric` in Prometheus text format."""
    found = []
    for line in text.splitlines():
        if line.startswith(metric + "{"):
            labels = line[len(metric) + 1 : line.rfind("}")]
            found.append({k: v.replace('\\"', '"') for k, v in _LABEL.findall(labels)})
    return found


def _cache_config(text: str) -> Mapping[str, str]:
    """With several engines (data parallel) the smallest cache is the one that binds."""
    samples = parse_prometheus_labels(text, CACHE_METRIC)
    usable = [s for s in samples if _int(s.get("num_gpu_blocks")) is not None] or samples
    return min(usable, key=lambda s: _int(s.get("num_gpu_blocks")) or 0, default={})


def _sglang(body: str) -> Mapping[str, Any]:
    try:
        payload = json.loads(body)
    except (json.JSONDecodeError, RecursionError):
        return {}
    if not isinstance(payload, Mapping):
        return {}
    states = payload.get("internal_states")
    if "max_total_num_tokens" not in payload and isinstance(states, list) and states:
        return states[0] if isinstance(states[0], Mapping) else {}
    return payload


_WHOLE = re.compile(r"[0-9]+", re.ASCII)


def _int(value: Any) -> int | None:
    """A count the server reported (a label's text or a JSON number) when it is a
    positive whole number; else None, as if not reported. A count that cannot be right
    (negative: -100 blocks of -16 tokens made 1,600 tokens; a bool; a fraction cut to
    an int; JSON's Infinity, an OverflowError) is no figure to size a limit by."""
    if isinstance(value, str):
        text = value.strip()
        number = int(text) if _WHOLE.fullmatch(text) else None
    elif type(value) is int:
        number = value
    elif type(value) is float and math.isfinite(value) and value.is_integer():
        number = int(value)
    else:
        number = None
    return number if number is not None and number > 0 else None


def _float(value: Any) -> float | None:
    """A finite, non-negative number the server reported; else None."""
    if isinstance(value, bool):
        return None
    try:
        number = float(value) if value not in (None, "", "None") else None
    except (TypeError, ValueError):
        return None
    return number if number is not None and math.isfinite(number) and number >= 0 else None


def _info(
    shown: str,
    model: str,
    max_len: int | None,
    cache: Mapping[str, str],
    extra: Mapping[str, Any],
) -> ServerInfo:
    return ServerInfo(
        base_url=shown,
        model=model,
        max_model_len=max_len or _int(extra.get("context_length")),
        num_gpu_blocks=_int(cache.get("num_gpu_blocks")),
        block_size=_int(cache.get("block_size")),
        kv_cache_size_tokens=_int(cache.get("kv_cache_size_tokens")),
        kv_cache_max_concurrency=_float(cache.get("kv_cache_max_concurrency")),
        max_total_num_tokens=_int(extra.get("max_total_num_tokens")),
        cache_dtype=cache.get("cache_dtype"),
        gpu_memory_utilization=_float(cache.get("gpu_memory_utilization")),
    )


def _unreachable(shown: str, exc: httpx.HTTPError) -> ConfigError:
    return ConfigError(
        f"could not read the model server at {shown} ({type(exc).__name__}); check the URL, "
        "that the server is running and reachable from here, and the timeout"
    )


def _drive(flow: Probe, send: Callable[[str], Response]) -> ServerInfo:
    path = next(flow)
    while True:
        try:
            path = flow.send(send(path))
        except StopIteration as done:
            info: ServerInfo = done.value
            return info


def fetch_server_info(
    base_url: str,
    *,
    model: str | None = None,
    timeout: float = 5.0,
    headers: Mapping[str, str] | None = None,
) -> ServerInfo:
    """GET the server's limits (blocking); each of the (up to three) GETs is over
    within ``timeout`` seconds in total, connect, headers and body, or ConfigError."""
    check_http_options("fetch_server_info", timeout, headers)
    shown = redact(base_url)
    try:
        with _http.client(base_url=base_url, timeout=timeout, headers=headers) as client:

            def send(path: str) -> Response:
                reply = _http.request(
                    client, "GET", path, seconds=timeout, shown=shown + path, error=ConfigError
                )
                return reply.status_code, reply.text

            return _drive(probe(base_url, model, known_secrets(base_url, headers)), send)
    except httpx.HTTPError as exc:
        raise _unreachable(shown, exc) from exc


async def afetch_server_info(
    base_url: str,
    *,
    model: str | None = None,
    timeout: float = 5.0,
    headers: Mapping[str, str] | None = None,
) -> ServerInfo:
    """GET the server's limits (asyncio); same probe and deadlines as :func:`fetch_server_info`."""
    check_http_options("afetch_server_info", timeout, headers)
    shown = redact(base_url)
    flow = probe(base_url, model, known_secrets(base_url, headers))
    try:
        async with httpx.AsyncClient(base_url=base_url, timeout=timeout, headers=headers) as client:
            path = next(flow)
            while True:
                reply = await _http.arequest(
                    client, "GET", path, seconds=timeout, shown=shown + path, error=ConfigError
                )
                try:
                    path = flow.send((reply.status_code, reply.text))
                except StopIteration as done:
                    info: ServerInfo = done.value
                    return info
    except httpx.HTTPError as exc:
        raise _unreachable(shown, exc) from exc
