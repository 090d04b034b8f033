"""``ctxguard serve``: an OpenAI-compatible gateway in front of vLLM/SGLang (extra ``serve``).

Every request goes through the library's :class:`~ctxguard.Guard`: the gateway owns the
sessions (Redis), fits each request exactly and forwards it to the upstream server.
Importing this package is light; Starlette, uvicorn and httpx load in
:mod:`ctxguard.serve.app` (``create_app``) and :func:`run`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ctxguard.errors import MissingDependencyError

if TYPE_CHECKING:
    from starlette.applications import Starlette

    from ctxguard.serve.config import ServeConfig


def create_app(config: ServeConfig) -> Starlette:
    """The ASGI app for ``config`` (needs ``ctxguard[serve]``)."""
    _require()
    from ctxguard.serve.app import create_app as make

    return make(config)


def run(config: ServeConfig, **uvicorn_options: Any) -> None:
    """Serve ``config`` with uvicorn (``config.workers`` processes) until interrupted."""
    _require()
    import os

    import uvicorn

    from ctxguard.serve.config import CONFIG_ENV
    from ctxguard.serve.metrics import multiprocess_dir

    os.environ[CONFIG_ENV] = config.to_json()
    # several workers write their metrics to one directory that /metrics adds up
    with multiprocess_dir(config.workers, config.metrics):
        uvicorn.run(
            "ctxguard.serve.app:app_from_env",
            factory=True,
            host=config.host,
            port=config.port,
            workers=config.workers,
            log_level=config.log_level,
            **uvicorn_options,
        )


def _require() -> None:
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        raise MissingDependencyError("ctxguard serve", "serve") from None
