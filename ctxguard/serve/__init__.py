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
    """Serve ``config`` with uvicorn (``config.workers`` processes) until interrupted.

    One worker serves the app made here; worker processes read the config from a
    private file (:mod:`ctxguard.serve.handoff`), never from the environment."""
    _require()
    import contextlib

    import uvicorn

    from ctxguard.serve.handoff import handed_over
    from ctxguard.serve.metrics import multiprocess_dir

    options: dict[str, Any] = {
        "host": config.host,
        "port": config.port,
        "workers": config.workers,
        "log_level": config.log_level,
        **uvicorn_options,
    }
    in_process = config.workers == 1 and not options.get("reload")
    # several workers write their metrics to one directory that /metrics adds up
    with multiprocess_dir(config.workers, config.metrics), contextlib.ExitStack() as stack:
        if in_process:
            uvicorn.run(create_app(config), **options)
        else:
            stack.enter_context(handed_over(config))
            uvicorn.run("ctxguard.serve.app:app_from_env", factory=True, **options)


def _require() -> None:
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        raise MissingDependencyError("ctxguard serve", "serve") from None
