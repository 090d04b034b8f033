"""The upstream call: a chat completions body out, the reply (or an OpenAI-shaped error) in."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx

from ctxguard.serve.gateway import Gateway, upstream_failure
from ctxguard.serve.openai_errors import ApiError

JSON_HEADERS = {"Content-Type": "application/json"}


def encode_json(body: dict[str, Any]) -> bytes:
    """The body as httpx's ``json=`` would send it (done in the worker thread)."""
    return json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()


async def send_upstream(
    gw: Gateway, url: str, body: dict[str, Any] | bytes, *, stream: bool
) -> httpx.Response:
    """POST upstream (a dict, or JSON already encoded); failures become OpenAI-shaped
    502/504 (and upstream 4xx pass through). Each call's time to the response headers
    is reported by outcome (``Gateway.observe_upstream``, the ``/metrics`` histogram)."""
    started = time.perf_counter()
    try:
        if isinstance(body, bytes):
            request = gw.client.build_request("POST", url, content=body, headers=JSON_HEADERS)
        else:
            request = gw.client.build_request("POST", url, json=body)
        response = await gw.client.send(request, stream=stream)
    except httpx.HTTPError as exc:
        status, message, code = upstream_failure(exc, gw.shown_upstream)
        gw.observe_upstream("timeout" if status == 504 else "unavailable", started)
        raise ApiError(status, message, type="upstream_error", code=code) from None
    if response.status_code == 200:
        gw.observe_upstream("ok", started)
        return response
    rejected = 400 <= response.status_code < 500 and response.status_code != 408
    gw.observe_upstream("rejected" if rejected else "error", started)
    try:
        await response.aread()
    except httpx.HTTPError:
        pass
    finally:
        await response.aclose()
    detail = _upstream_message(response)
    if rejected:
        raise ApiError(response.status_code, detail, code="upstream_rejected")
    raise ApiError(
        502,
        f"the model server answered HTTP {response.status_code}: {detail}",
        type="upstream_error",
        code="upstream_error",
    )


def _upstream_message(response: httpx.Response) -> str:
    try:
        data = response.json()
    except ValueError:
        return response.text[:300]
    error = data.get("error", data) if isinstance(data, dict) else data
    if isinstance(error, dict):
        return str(error.get("message", error))[:300]
    return str(error)[:300]
