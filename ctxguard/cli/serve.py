"""``ctxguard serve``: run the OpenAI-compatible gateway (needs ``ctxguard[serve]``)."""

from __future__ import annotations

from typing import Any

import click

from ctxguard.cli.common import handles_errors

_EPILOG = """\b
Examples:
  ctxguard serve --upstream http://vllm:8000 --url redis://localhost:6379/0
  ctxguard serve --upstream http://vllm:8000 --limit 32768 --counter hf:/models/qwen --workers 4
  CTXGUARD_SERVE_UPSTREAM=http://vllm:8000 ctxguard serve --config gateway.toml

\b
Every option is also an environment variable CTXGUARD_SERVE_<NAME> (CTXGUARD_URL for
--url; CTXGUARD_SERVE_API_KEYS as key=tenant,key2=tenant2) and a key of the TOML file
(top level or a [serve] table). Flags win over variables, variables over the file.
"""


@click.command("serve", epilog=_EPILOG)
@click.option("--upstream", help="The model server's base URL, e.g. http://vllm:8000.")
@click.option("--url", help="Session store URL (redis://, rediss://, redis+cluster://).")
@click.option("--counter", help="Token counter spec; default vllm:<upstream> (its /tokenize).")
@click.option("--limit", type=int, help="Context limit in tokens; default the upstream's.")
@click.option("--model", help="Model name for /tokenize and the limit (default: the first).")
@click.option("--host", help="Address to listen on (default 127.0.0.1).")
@click.option("--port", type=int, help="Port to listen on (default 8000).")
@click.option("--workers", type=int, help="Worker processes (default 1).")
@click.option("--namespace", help="Key namespace in the store.")
@click.option("--tenant", help="Tenant for requests without X-Tenant or an API key map.")
@click.option("--max-tokens", type=int, help="Output reserve when a request gives none.")
@click.option("--max-body-bytes", type=int, help="Largest request body accepted.")
@click.option("--upstream-timeout", type=float, help="Seconds to wait on the model server.")
@click.option(
    "--idempotency-lease",
    type=float,
    help="Seconds an Idempotency-Key in flight stays claimed unless renewed (default 10).",
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

    config = load_config(flags, config_file=config_file)
    run(config)
