"""The config handed to uvicorn's worker processes, outside the environment.

``--workers N`` makes uvicorn start each worker (and restart one that died) from an
import string, so the workers need the config from somewhere: it was the JSON in an
environment variable, secrets included, readable in ``/proc/<pid>/environ`` of every
worker and inherited by any process a worker starts. Now it is a file created 0600 in a
directory of its own made 0700, which the variable names (a path, no secret); each worker
reads it and drops the variable, and the directory is removed when the server stops, or,
when it is killed (SIGKILL included), by a watcher process (:mod:`ctxguard.serve.dirwatch`).
The settings' own variables (``CTXGUARD_SERVE_UPSTREAM_API_KEY``, ``CTXGUARD_URL``, ...)
are dropped too once read (:func:`forget_settings`), so no worker inherits them.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator, MutableMapping

from ctxguard.errors import ConfigError
from ctxguard.serve.config import ENV_PREFIX, NAMES, ServeConfig
from ctxguard.serve.dirwatch import removed_at_exit

CONFIG_FILE_ENV = "CTXGUARD_SERVE_CONFIG_FILE"


@contextlib.contextmanager
def handed_over(config: ServeConfig) -> Iterator[str]:
    """The file of ``config`` for the workers started inside the block (its path in
    :data:`CONFIG_FILE_ENV`), removed with its directory at the end."""
    try:
        folder = tempfile.mkdtemp(prefix="ctxguard-serve-")  # 0700
    except OSError as exc:
        raise _unwritable(exc) from None
    path = os.path.join(folder, "config.json")
    try:
        # the watcher first: a gateway killed by SIGKILL leaves no file of secrets behind
        with removed_at_exit(folder):
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with os.fdopen(fd, "w", encoding="utf-8") as handle:
                    handle.write(config.to_json())
            except OSError as exc:
                raise _unwritable(exc) from None
            os.environ[CONFIG_FILE_ENV] = path
            yield path
    finally:
        os.environ.pop(CONFIG_FILE_ENV, None)
        shutil.rmtree(folder, ignore_errors=True)


def _unwritable(exc: OSError) -> ConfigError:
    return ConfigError(
        f"cannot write the workers' settings to a private temporary directory "
        f"({exc.strerror or type(exc).__name__}); set TMPDIR to a writable directory, "
        "or run one worker"
    )


def taken_over() -> ServeConfig:
    """In a worker: the config :func:`handed_over` wrote (the variable dropped, so no
    process this worker starts inherits the path)."""
    path = os.environ.pop(CONFIG_FILE_ENV, None)
    if not path:
        raise ConfigError(f"{CONFIG_FILE_ENV} is not set; start the gateway with `ctxguard serve`")
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except OSError as exc:
        raise ConfigError(
            f"cannot read the gateway's config at {CONFIG_FILE_ENV} ({exc.strerror}); "
            "start the gateway with `ctxguard serve`"
        ) from None
    return ServeConfig.from_json(text)


def forget_settings(environ: MutableMapping[str, str] | None = None) -> None:
    """Drop the variables a config was read from (``CTXGUARD_SERVE_<NAME>``,
    ``CTXGUARD_URL``) from this process's environment: the config holds them now, and the
    workers (and whatever they start) inherit the environment, secrets and all."""
    env = os.environ if environ is None else environ
    for name in (*(ENV_PREFIX + n.upper() for n in NAMES), "CTXGUARD_URL"):
        env.pop(name, None)
