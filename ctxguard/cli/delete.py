"""``ctxguard delete``: remove a session and everything stored with it."""

from __future__ import annotations

import click

from ctxguard.cli.common import (
    EXIT_ABORTED,
    EXIT_CODES_HELP,
    EXIT_NOT_FOUND,
    fail,
    handles_errors,
    note,
    opened_store,
    store_options,
)

_EPILOG = f"""\b
Examples:
  ctxguard delete chat-123                  # asks first
  ctxguard delete chat-123 --yes --url redis://localhost:6379/0
  ctxguard export chat-123 --out keep.jsonl && ctxguard delete chat-123 --yes

{EXIT_CODES_HELP}
"""


@click.command("delete", epilog=_EPILOG)
@click.argument("session")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@store_options
@handles_errors
def delete_command(
    session: str, yes: bool, url: str, namespace: str | None, tenant: str | None
) -> None:
    """Delete a session: messages, token counts, summary and audit trail. Not undoable."""
    with opened_store(url, namespace, tenant) as store:
        info = store.info(session)
        if info is None:
            fail(f"session {session!r} not found in this namespace/tenant", EXIT_NOT_FOUND)
        question = (
            f"Delete session {session!r} ({info.message_count} messages, "
            f"{info.audit_count} audit records)?"
        )
        if not yes and not _confirmed(question):
            fail("not deleted", EXIT_ABORTED)
        store.delete(session)
    note(f"deleted session {session!r}")


def _confirmed(question: str) -> bool:
    """Ask on stderr; no answer (closed stdin, Ctrl-C) means no."""
    try:
        return click.confirm(question, default=False, err=True)
    except click.Abort:
        return False
