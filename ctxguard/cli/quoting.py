"""How the CLI prints and quotes a session id.

An older version stored sessions under ids the id rule now refuses (a format character,
U+2028/U+2029); they are still listed, shown, exported and deleted, and printed raw
such an id would break the one-line and table output, so it is shown escaped.
"""

from __future__ import annotations

import shlex


def shown_id(session_id: str) -> str:
    """A session id for a table cell or a line: as it is when printable, else its
    ``repr`` (``'chat\\u200b1'``). An older version stored sessions under ids with a
    format character or U+2028/U+2029 (still listed, shown and deleted): printed raw,
    a bidi override turns the rest of the line around, U+2028 ends it in many readers
    and a zero-width space makes the id look like another."""
    return session_id if session_id.isprintable() else repr(session_id)


def suggest(command: str, session_id: str) -> str:
    """``ctxguard <command> <session>`` as a shell line to copy: the session id quoted
    (it is any text a client chose: spaces, ``;``, ``$(...)``), after ``--`` when it
    begins with ``-`` (else it reads as an option); an id that is not printable (see
    :func:`shown_id`) in bash's ``$'...'`` quoting, its characters as ``\\uXXXX``."""
    words = command.split(" ", 1)
    options = f" {words[1]}" if len(words) > 1 else ""
    end = " --" if session_id.startswith("-") else ""
    quoted = shlex.quote(session_id) if session_id.isprintable() else _ansi_c(session_id)
    return f"ctxguard {words[0]}{options}{end} {quoted}"


def _ansi_c(text: str) -> str:
    """``text`` in bash's ``$'...'`` quoting: printable ASCII as it is (``\\`` and ``'``
    escaped), everything else as ``\\uXXXX`` / ``\\UXXXXXXXX``."""

    def one(char: str) -> str:
        if char in "\\'":
            return "\\" + char
        if " " <= char <= "~":
            return char
        code = ord(char)
        return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"

    return "$'" + "".join(one(c) for c in text) + "'"
