"""The ASGI application: routes, error answers, lifespan.

``create_app(config)`` for code and tests; ``app_from_env()`` is the factory uvicorn
calls in each worker process (the config read from the file :mod:`ctxguard.serve.handoff`
wrote, whose path is in ``CTXGUARD_SERVE_CONFIG_FILE``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ctxguard.errors import CtxGuardError, StoreConnectionError
from ctxguard.serve import handoff, identity
from ctxguard.serve.chat import chat_completions
from ctxguard.serve.config import ServeConfig
from ctxguard.serve.forward import bad_reply, decode_reply, read_capped, timed_out, upstream_error
from ctxguard.serve.gateway import Gateway
from ctxguard.serve.inbound import read_json
from ctxguard.serve.openai_errors import ApiError
from ctxguard.serve.responses import create_response, get_response

log = logging.getLogger("ctxguard.serve")


async def models(request: Request) -> Response:
    """The upstream's model list, with ``max_model_len`` set to the limit the gateway enforces."""
    gw: Gateway = request.app.state.gateway
    identity.tenant_of(request.headers, gw.config.api_keys, gw.config.tenant)  # a key, if asked
    data = decode_reply(gw, await _call(gw, "GET", "/v1/models"))
    models = data.get("data") if isinstance(data, dict) else None
    if not isinstance(models, list):
        raise bad_reply(gw)
    limit = await gw.limit_tokens()
    for model in models:
        if isinstance(model, dict):
            model["max_model_len"] = limit
    return JSONResponse(data)


async def tokenize(request: Request) -> Response:
    gw: Gateway = request.app.state.gateway
    identity.tenant_of(request.headers, gw.config.api_keys, gw.config.tenant)
    body = await read_json(request, gw.config.max_body_bytes, gw.config.upstream_timeout)
    return Response(await _call(gw, "POST", "/tokenize", body), 200, media_type="application/json")


HEALTH_SECONDS = 5.0  # each of /health's checks answers within this (a probe waits ~1-10 s)


async def health(request: Request) -> Response:
    """200 while the store answers, else 503 (the gateway's own dependency). The model
    server's tokenizer is reported (``counter``), not required: a liveness probe must not
    restart every gateway while vLLM restarts. Each check has :data:`HEALTH_SECONDS`: a
    store that accepts and never answers took its read timeout times its retries (~40 s
    by default), past any probe's wait (the check's thread ends at its own timeout)."""
    gw: Gateway = request.app.state.gateway
    status: dict[str, Any] = {"status": "ok"}
    try:
        async with asyncio.timeout(HEALTH_SECONDS):
            store = await gw.run(gw.health_store)
            await gw.run(store.info, "ctxguard-health-probe")
        status["store"] = "ok"
    except TimeoutError:
        log.warning("health: the session store did not answer within %gs", HEALTH_SECONDS)
        status.update(status="unavailable", store="not answering")
    except CtxGuardError as exc:  # (the class to the log; the probe reads words)
        log.warning("health: the session store failed: %s", type(exc).__name__)
        unreachable = isinstance(exc, StoreConnectionError)
        status.update(status="unavailable", store="unreachable" if unreachable else "failing")
    try:
        async with asyncio.timeout(HEALTH_SECONDS):
            await gw.run(gw.counter)
        status["counter"] = "ok"
    except TimeoutError:
        log.warning("health: the model server's tokenizer did not load within %gs", HEALTH_SECONDS)
        status["counter"] = "not answering"
    except CtxGuardError as exc:
        log.warning("health: the model server's tokenizer failed: %s", type(exc).__name__)
        status["counter"] = "unavailable"
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


async def _call(gw: Gateway, method: str, path: str, body: Any = None) -> bytes:
    """The body of a 200 answer, read within ``--upstream-timeout`` and the size cap;
    else the OpenAI-shaped error (an upstream 4xx passes through, scrubbed)."""
    try:
        async with asyncio.timeout(gw.config.upstream_timeout):
            request = gw.client.build_request(method, gw.upstream + path, json=body)
            response = await gw.client.send(request, stream=True)
            if response.status_code != 200:
                raise await upstream_error(gw, response, path)
            return await read_capped(gw, response)
    except TimeoutError:
        raise timed_out(gw) from None
    except httpx.HTTPError as exc:
        raise gw.failed(exc) from None


async def _api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return JSONResponse(exc.body(), exc.status, headers=exc.headers)


async def _ctxguard_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, CtxGuardError)
    gw: Gateway = request.app.state.gateway
    error = gw.answer(exc)
    return JSONResponse(error.body(), error.status)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    error = ApiError(exc.status_code, str(exc.detail), code="not_found")
    if exc.status_code == 405:
        error = ApiError(405, f"{request.method} is not allowed here", code="method_not_allowed")
    return JSONResponse(error.body(), exc.status_code)


class _Contain:
    """Unexpected errors answered here: a 500 that names nothing of them (their type is
    logged, without a traceback: the message, or a frame's values, may quote a
    secret-bearing URL or header). Past this, Starlette's ServerErrorMiddleware would
    answer and then re-raise to uvicorn, which logs both."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracked(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except Exception as exc:
            log.error("unexpected %s on %s %s", type(exc).__name__, scope["method"], scope["path"])
            if started:
                return  # the answer is under way: the server ends the connection
            error = ApiError(
                500,
                "internal error in the gateway (its log names it); nothing more is known here",
                type="server_error",
                code="internal_error",
            )
            await JSONResponse(error.body(), 500)(scope, receive, send)


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
        },
        middleware=[Middleware(_Contain)],
        lifespan=lifespan,
    )


def app_from_env() -> Starlette:
    """uvicorn's factory in each worker: the config ``ctxguard serve`` handed over."""
    return create_app(handoff.taken_over())
