"""``ctxguard serve``: run the OpenAI-compatible gateway (needs ``ctxguard[serve]``)."""

from __future__ import annotations

import socket
from typing import Any

import click

from ctxguard.cli.common import EXIT_BAD_INPUT, fail, handles_errors

_EPILOG = """\b
Examples:
  ctxguard serve --upstream http://vllm:8000 --url redis://localhost:6379/0
  ctxguard serve --upstream http://vllm:8000 --limit 32768 --counter hf:/models/qwen --workers 4
  CTXGUARD_SERVE_UPSTREAM=http://vllm:8000 ctxguard serve --config gateway.toml

\b
Every option is also an environment variable CTXGUARD_SERVE_<NAME> (CTXGUARD_URL for
--url; CTXGUARD_SERVE_API_KEYS as key=tenant,key2=tenant2) and a key of the TOML file
(top level or a [serve] table). Flags win over variables, variables over the file.

\b
Exit codes: 0 stopped; 2 a bad option, variable or config file, or an address it
cannot listen on; 6 ctxguard[serve] not installed.
"""


@click.command("serve", epilog=_EPILOG)
@click.option("--upstream", help="The model server's base URL, e.g. http://vllm:8000.")
@click.option("--url", help="Session store URL (redis://, rediss://, redis+cluster://).")
@click.option("--counter", help="Token counter spec; default vllm:<upstream> (its /tokenize).")
@click.option("--limit", type=int, help="Context limit in tokens; default the upstream's.")
@click.option("--model", help="Model name for /tokenize and the limit (default: the first).")
@click.option("--host", help="Address to listen on (default 127.0.0.1).")
@click.option("--port", type=int, help="Port to listen on (default 8000).")
@click.option("--workers", type=int, help="Worker processes (default 1, at most 64).")
@click.option("--namespace", help="Key namespace in the store.")
@click.option("--tenant", help="Tenant for requests without X-Tenant or an API key map.")
@click.option("--max-tokens", type=int, help="Output reserve when a request gives none.")
@click.option("--max-body-bytes", type=int, help="Largest request body accepted.")
@click.option(
    "--upstream-timeout",
    type=float,
    help="Seconds to wait on the model server (and for a request body to arrive).",
)
@click.option(
    "--idempotency-lease",
    type=float,
    help="Seconds an Idempotency-Key in flight stays claimed unless renewed (default 10).",
)
@click.option(
    "--idempotency-window",
    type=int,
    help="Newest messages searched for an Idempotency-Key's reply (default 64, at most 4096).",
)
@click.option(
    "--commit",
    help=(
        "When a turn is stored: prepare (its messages before the model is called; default) "
        "or with_reply (with the reply, in one step: a request with no reply stores nothing)."
    ),
)
@click.option(
    "--metrics/--no-metrics",
    default=None,
    help="Serve GET /metrics (needs ctxguard[metrics]; default on).",
)
@click.option("--config", "config_file", type=click.Path(dir_okay=False), help="TOML file.")
@handles_errors
def serve_command(config_file: str | None, **flags: Any) -> None:
    """Run an OpenAI-compatible gateway that owns sessions and fits every request."""
    from ctxguard.serve import run
    from ctxguard.serve.config import load_config
    from ctxguard.serve.handoff import forget_settings

    config = load_config(flags, config_file=config_file)
    check_listen(config.host, config.port)
    forget_settings()  # read: no worker inherits them (the upstream key, the store URL)
    run(config)


def check_listen(host: str, port: int) -> None:
    """Exit 2 in one line when the gateway could not listen on ``host:port`` (uvicorn
    logged its own ``ERROR: [Errno 98] ...`` lines and exited 3, this CLI's "store
    failed"). Bound the way uvicorn binds (SO_REUSEADDR), then let go for it."""
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(address)
    except (OSError, UnicodeError) as exc:
        reason = getattr(exc, "strerror", None) or type(exc).__name__
        fail(
            f"cannot listen on {where} ({reason}); pass --host with an address of this "
            "machine and a --port nothing else listens on",
            EXIT_BAD_INPUT,
        )
