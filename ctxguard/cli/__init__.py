"""The ``ctxguard`` command: one click group, one module per command family."""

from __future__ import annotations

import click

from ctxguard.cli.common import Commands


@click.group(cls=Commands, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="ctxguard")
def cli() -> None:
    """ctxguard: keep LLM chat requests inside the memory the model server really has."""


def main() -> None:
    """Console-script entry point."""
    cli()


from ctxguard.cli.kv import kv_command  # noqa: E402

cli.add_command(kv_command)

from ctxguard.cli.audit import audit_command  # noqa: E402
from ctxguard.cli.delete import delete_command  # noqa: E402
from ctxguard.cli.repair import repair_command  # noqa: E402
from ctxguard.cli.replay import replay_command  # noqa: E402
from ctxguard.cli.report import report_command  # noqa: E402
from ctxguard.cli.sessions import sessions_command  # noqa: E402
from ctxguard.cli.show import show_command  # noqa: E402
from ctxguard.cli.transfer import export_command, import_command  # noqa: E402

cli.add_command(sessions_command)
cli.add_command(show_command)
cli.add_command(replay_command)
cli.add_command(audit_command)
cli.add_command(export_command)
cli.add_command(import_command)
cli.add_command(delete_command)
cli.add_command(repair_command)
cli.add_command(report_command)

from ctxguard.cli.serve import serve_command  # noqa: E402

cli.add_command(serve_command)
