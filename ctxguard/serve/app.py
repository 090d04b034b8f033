"""The ASGI application: routes, error answers, lifespan.

``create_app(config)`` for code and tests; ``app_from_env()`` is the factory uvicorn
calls in each worker process (the CLI puts the config in ``CTXGUARD_SERVE_CONFIG_JSON``).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import AsyncIterator
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ctxguard.errors import ConfigError, CtxGuardError
from ctxguard.serve.chat import chat_completions
from ctxguard.serve.config import CONFIG_ENV, ServeConfig
from ctxguard.serve.gateway import Gateway, upstream_failure
from ctxguard.serve.inbound import read_json
from ctxguard.serve.openai_errors import ApiError, from_ctxguard
from ctxguard.serve.responses import create_response, get_response

log = logging.getLogger("ctxguard.serve")


async def models(request: Request) -> Response:
    """The upstream's model list, with ``max_model_len`` set to the limit the gateway enforces."""
    gw: Gateway = request.app.state.gateway
    upstream = await _call(gw, "GET", "/v1/models")
    data = upstream.json()
    limit = await gw.limit_tokens()
    for model in data.get("data") or ():
        if isinstance(model, dict):
            model["max_model_len"] = limit
    return JSONResponse(data)


async def tokenize(request: Request) -> Response:
    gw: Gateway = request.app.state.gateway
    body = await read_json(request, gw.config.max_body_bytes)
    upstream = await _call(gw, "POST", "/tokenize", body)
    return Response(upstream.content, upstream.status_code, media_type="application/json")


async def health(request: Request) -> Response:
    gw: Gateway = request.app.state.gateway
    status = await gw.check_ready()
    return JSONResponse(status, 200 if status["status"] == "ok" else 503)


async def metrics(request: Request) -> Response:
    """Prometheus' text exposition (every worker's values added up under ``--workers N``)."""
    gw: Gateway = request.app.state.gateway
    if gw.metrics is None:
        why = (
            "metrics are off in this gateway's config (metrics = false)"
            if not gw.config.metrics
            else "metrics need prometheus_client: install ctxguard[metrics]"
        )
        raise ApiError(404, why, code="not_found")
    body, content_type = await gw.run(gw.metrics.render)
    return Response(body, 200, headers={"Content-Type": content_type})


async def _call(gw: Gateway, method: str, path: str, body: Any = None) -> httpx.Response:
    try:
        response = await gw.client.request(method, gw.upstream + path, json=body)
    except httpx.HTTPError as exc:
        status, message, code = upstream_failure(exc, gw.shown_upstream)
        raise ApiError(status, message, type="upstream_error", code=code) from None
    if response.status_code >= 500:
        raise ApiError(
            502,
            f"the model server answered HTTP {response.status_code}",
            type="upstream_error",
            code="upstream_error",
        )
    return response


async def _api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return JSONResponse(exc.body(), exc.status)


async def _ctxguard_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, CtxGuardError)
    error = from_ctxguard(exc)
    return JSONResponse(error.body(), error.status)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    error = ApiError(exc.status_code, str(exc.detail), code="not_found")
    if exc.status_code == 405:
        error = ApiError(405, f"{request.method} is not allowed here", code="method_not_allowed")
    return JSONResponse(error.body(), exc.status_code)


async def _unexpected(request: Request, exc: Exception) -> Response:
    # the type only: a message could quote a secret-bearing URL or header
    log.error("unexpected %s on %s %s", type(exc).__name__, request.method, request.url.path)
    error = ApiError(500, f"internal error ({type(exc).__name__})", type="server_error")
    return JSONResponse(error.body(), 500)


def create_app(config: ServeConfig) -> Starlette:
    """The gateway for ``config`` (one per worker process)."""

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        gateway = Gateway(config)
        app.state.gateway = gateway
        log.info("ctxguard serve: %s", config.describe())
        try:
            yield
        finally:
            await gateway.aclose()

    return Starlette(
        routes=[
            Route("/v1/chat/completions", chat_completions, methods=["POST"]),
            Route("/v1/responses", create_response, methods=["POST"]),
            Route("/v1/responses/{response_id}", get_response, methods=["GET"]),
            Route("/v1/models", models, methods=["GET"]),
            Route("/tokenize", tokenize, methods=["POST"]),
            Route("/health", health, methods=["GET"]),
            Route("/metrics", metrics, methods=["GET"]),
        ],
        exception_handlers={
            ApiError: _api_error,
            HTTPException: _http_error,
            CtxGuardError: _ctxguard_error,
            Exception: _unexpected,
        },
        lifespan=lifespan,
    )


def app_from_env() -> Starlette:
    """uvicorn's factory in each worker: the config the CLI serialised."""
    raw = os.environ.get(CONFIG_ENV)
    if not raw:
        raise ConfigError(f"{CONFIG_ENV} is not set; start the gateway with `ctxguard serve`")
    return create_app(ServeConfig.from_json(raw))
