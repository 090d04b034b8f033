"""The ``ctxguard`` command: one click group, one module per command family."""

from __future__ import annotations

import click


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="ctxguard")
def cli() -> None:
    """ctxguard: keep LLM chat requests inside the memory the model server really has."""


def main() -> None:
    """Console-script entry point."""
    cli()
