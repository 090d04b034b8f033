"""What every session command shares: store options, output, and errors as exit codes.

Operators script these commands (CI, cron, monitoring), so each error family
gets its own exit code and a single line on stderr; a password in the store
URL never reaches the terminal.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import os
import stat
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import IO, Any, NoReturn, ParamSpec, TypeVar

import click
from click.core import ParameterSource
from rich.console import Console
from rich.table import Table
from rich.text import Text

from ctxguard._secrets import forget, redact_urls
from ctxguard._validate import MAX_INT
from ctxguard.errors import (
    BudgetError,
    ConfigError,
    CorruptRecordError,
    CtxGuardError,
    InvalidInputError,
    MissingDependencyError,
    StoreError,
    TokenizerError,
)
from ctxguard.stores import open_store
from ctxguard.stores.base import SessionStore
from ctxguard.stores.urls import parse_store_url, redact_url

URL_ENV = "CTXGUARD_URL"
NAMESPACE_ENV = "CTXGUARD_NAMESPACE"
TENANT_ENV = "CTXGUARD_TENANT"

# Token counts and caps: bounded like every count the library takes (signed 64-bit).
POSITIVE_INT = click.IntRange(min=1, max=MAX_INT)
NON_NEGATIVE_INT = click.IntRange(min=0, max=MAX_INT)

EXIT_OK = 0
EXIT_VIOLATION = 1
EXIT_BAD_INPUT = 2
EXIT_STORE = 3
EXIT_CORRUPT = 4
EXIT_BUDGET = 5
EXIT_TOKENIZER = 6
EXIT_NOT_FOUND = 7
EXIT_ABORTED = 8
EXIT_INTERNAL = 70
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a command Ctrl-C stopped
EXIT_PIPE_CLOSED = 141  # 128 + SIGPIPE: the reader of stdout went away (``| head``)

EXIT_CODES_HELP = """\b
Exit codes: 0 ok; 1 audit violation found; 2 bad input or options; 3 store
unreachable or failed; 4 undecodable record; 5 budget error; 6 tokenizer or
optional dependency missing; 7 session not found; 8 aborted at a prompt;
130 interrupted (Ctrl-C); 141 stdout closed by its reader (| head)."""

P = ParamSpec("P")
R = TypeVar("R")


class CliFailure(click.ClickException):
    """An error already phrased for the operator; subclasses carry the exit code."""

    def show(self, file: Any = None) -> None:
        click.echo(f"error: {self.format_message()}", err=True)


def failure(message: str, exit_code: int) -> CliFailure:
    """A CliFailure whose class carries ``exit_code`` (click reads it from the class); any
    URL's user and password in ``message`` hidden (a counter spec names a server too)."""
    kind: type[CliFailure] = type(f"CliFailure{exit_code}", (CliFailure,), {"exit_code": exit_code})
    return kind(redact_urls(message))


def exit_code_for(exc: CtxGuardError) -> int:
    """The exit code of an error family (most specific family first)."""
    table: tuple[tuple[type[CtxGuardError], int], ...] = (
        (CorruptRecordError, EXIT_CORRUPT),
        (StoreError, EXIT_STORE),
        (InvalidInputError, EXIT_BAD_INPUT),
        (BudgetError, EXIT_BUDGET),
        (TokenizerError, EXIT_TOKENIZER),
        (MissingDependencyError, EXIT_TOKENIZER),
    )
    for family, code in table:
        if isinstance(exc, family):
            return code
    return EXIT_INTERNAL


def scrub(text: str, url: str | None) -> str:
    """``text`` with the store URL and its password hidden, whatever printed it.

    The library's messages are already built from the redacted URL; this is
    the second lock. The password is taken from the parsed URL (as given and
    percent-encoded), and when the URL does not parse, the text between
    ``://`` and its last ``@`` (where a password would be) is hidden.
    """
    if not url:
        return text
    try:
        secrets = parse_store_url(url).secret_values
    except ConfigError:
        head = url.partition("://")[2].rpartition("@")[0]
        secrets = tuple(sorted(filter(None, [head, head.partition(":")[2]]), key=len))[::-1]
    return forget(text, secrets).replace(url, redact_url(url))


# what writing stdout fails with when its file cannot take more (a full disk, a size
# limit, a device error); a closed pipe (EPIPE) is not an error to report
_OUTPUT_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO})


class Commands(click.Group):
    """The ``ctxguard`` group: Ctrl-C, a closed pipe and a stdout that cannot be written
    end a command with their own exit code and at most one line, never a traceback
    (click said ``Aborted!`` and exited 1, which here means an audit violation)."""

    def main(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().main(*args, **kwargs)
        except OSError as exc:  # e.g. the group's own --help into a full disk
            if not _output_failed(exc):
                raise
            _quiet_stdout()
            click.echo(f"error: {_output_failure(exc)}", err=True)
            sys.exit(EXIT_BAD_INPUT)

    def make_context(self, *args: Any, **kwargs: Any) -> click.Context:
        try:
            return super().make_context(*args, **kwargs)
        except click.UsageError as exc:  # the group's own options (`ctxguard --bogus`)
            raise _one_line(exc) from None

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.UsageError as exc:  # a command's options or arguments, no such command
            raise _one_line(exc) from None
        except KeyboardInterrupt:
            raise failure(
                "interrupted (Ctrl-C) before the command finished; what it wrote so far "
                "stays: run it again (export, import, repair and delete are safe to repeat)",
                EXIT_INTERRUPTED,
            ) from None
        except OSError as exc:
            if exc.errno == errno.EPIPE:
                _quiet_stdout()
                sys.exit(EXIT_PIPE_CLOSED)
            if _output_failed(exc):
                _quiet_stdout()
                raise failure(_output_failure(exc), EXIT_BAD_INPUT) from None
            raise


def _one_line(exc: click.UsageError) -> click.ClickException:
    """click's usage error (usage, hint, blank line, error: four lines) as one line that
    names what was wrong and the --help to read; no arguments at all still shows the help."""
    if isinstance(exc, click.exceptions.NoArgsIsHelpError):
        return exc
    where = f"`{exc.ctx.command_path} --help`" if exc.ctx is not None else "--help"
    return failure(f"{exc.format_message().rstrip('.')} (see {where})", EXIT_BAD_INPUT)


def _output_failed(exc: OSError) -> bool:
    return exc.filename is None and exc.errno in _OUTPUT_ERRNOS


def _output_failure(exc: OSError) -> str:
    return (
        f"cannot write to stdout ({exc.strerror}); the output is cut short: "
        "free space there or redirect stdout to another file"
    )


class _Unflushed:
    """A stream whose flush failures are ignored: what stdout still buffers after it
    failed would otherwise be reported again when the interpreter exits."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def flush(self) -> None:
        with contextlib.suppress(OSError):
            self._stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _quiet_stdout() -> None:
    """Whatever stdout still buffers goes nowhere: into /dev/null when it is a file
    descriptor (as rich does on a closed pipe), and its flush failures are ignored."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, sys.stdout.fileno())
        finally:
            os.close(devnull)
    if not isinstance(sys.stdout, _Unflushed):
        sys.stdout = _Unflushed(sys.stdout)


class OutConsole(Console):
    """A rich console whose closed pipe is an ``EPIPE`` for :class:`Commands` to end
    quietly with its exit code (rich exits 1 itself: here an audit violation)."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        raise BrokenPipeError(errno.EPIPE, os.strerror(errno.EPIPE))


def fail(message: str, exit_code: int) -> NoReturn:
    raise failure(message, exit_code)


def handles_errors(fn: Callable[P, R]) -> Callable[P, R]:
    """Turn library errors into one clean stderr line and the family's exit code."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        url = _current_url()
        try:
            return fn(*args, **kwargs)
        except CtxGuardError as exc:
            text = scrub(f"{type(exc).__name__}: {exc}", url)
            raise failure(text, exit_code_for(exc)) from None

    return wrapper


def _current_url() -> str | None:
    ctx = click.get_current_context(silent=True)
    if ctx is None:
        return os.environ.get(URL_ENV)
    value = ctx.params.get("url")
    return str(value) if value else os.environ.get(URL_ENV)


def store_options(fn: Callable[P, R]) -> Callable[P, R]:
    """--url / --namespace / --tenant, each with an environment variable."""
    options = (
        click.option(
            "--url",
            envvar=URL_ENV,
            default="memory://",
            show_default=True,
            help=f"Store URL (memory://, redis://, rediss://, redis+cluster://); env {URL_ENV}.",
        ),
        click.option(
            "--namespace", envvar=NAMESPACE_ENV, help=f"Key namespace; env {NAMESPACE_ENV}."
        ),
        click.option("--tenant", envvar=TENANT_ENV, help=f"Tenant; env {TENANT_ENV}."),
    )
    for option in reversed(options):
        fn = option(fn)
    return fn


def json_option(fn: Callable[P, R]) -> Callable[P, R]:
    return click.option("--json", "as_json", is_flag=True, help="Machine-readable JSON on stdout.")(
        fn
    )


# The default stays memory:// (the library's zero-setup store: the same URL names
# the same store everywhere, and no command reads or writes a server nobody named),
# but a CLI process can only ever see an empty one, so it says so.
NO_URL_NOTE = (
    f"note: no --url or {URL_ENV}: looking at an empty in-process memory:// store; "
    "pass --url redis://localhost:6379/0"
)


@contextmanager
def opened_store(url: str, namespace: str | None, tenant: str | None) -> Iterator[SessionStore]:
    """The store for the options, closed afterwards."""
    ctx = click.get_current_context(silent=True)
    if ctx is not None and ctx.get_parameter_source("url") == ParameterSource.DEFAULT:
        note(NO_URL_NOTE)
    store = open_store(url, namespace=namespace, tenant=tenant)
    try:
        yield store
    finally:
        store.close()


@contextmanager
def writable_output(path: str) -> Iterator[IO[str]]:
    """``path`` opened for text output (``-`` is stdout); an OS error exits 2 in one line.

    A file is written whole or not at all: into a temporary file beside it, moved over
    ``path`` once everything is written and synced (a full disk, a size limit or a failure
    half-way left a cut file in place of the old one). A device or a pipe is written to as
    the output comes."""
    if path == "-":
        with click.open_file("-", "w", encoding="utf-8") as out:
            yield out
        return
    try:
        target = os.path.realpath(path) if os.path.basename(path) else ""
        if not target or (os.path.exists(target) and not os.path.isfile(target)):
            with open(path, "w", encoding="utf-8") as handle:
                yield handle
            return
        with _replacing(target) as handle:
            yield handle
    except OSError as exc:
        fail(f"cannot write {path}: {exc.strerror or exc}", EXIT_BAD_INPUT)


@contextmanager
def _replacing(target: str) -> Iterator[IO[str]]:
    if os.path.exists(target):
        mode = stat.S_IMODE(os.stat(target).st_mode)
    else:
        umask = os.umask(0o022)  # read it (os has no other way), then put it back
        os.umask(umask)
        mode = 0o666 & ~umask
    name = os.path.basename(target)
    fd, temp = tempfile.mkstemp(dir=os.path.dirname(target), prefix=f".{name}.", suffix=".part")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temp, mode)
        os.replace(temp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise


def stdout() -> Console:
    """Rich console for results; wide so tables do not wrap in pipes and tests."""
    return OutConsole(width=None if sys.stdout.isatty() else 160, soft_wrap=False)


def stderr() -> Console:
    return OutConsole(stderr=True)


def add_row(table: Table, *cells: str | Text) -> None:
    """Add a row whose strings are data, not markup: ids like ``chat[1]`` print as they are."""
    table.add_row(*(c if isinstance(c, Text) else Text(c) for c in cells))


def note(message: str) -> None:
    """A progress or warning line on stderr, printed verbatim but for any URL's password."""
    click.echo(redact_urls(message), err=True)


def emit_json(data: Any) -> None:
    click.echo(json_text(data, indent=2))


def json_text(data: Any, **options: Any) -> str:
    """``data`` as strict JSON; a NaN or infinite number (JSON has none: ``json.dumps``
    would write ``Infinity``, which no JSON reader takes) exits 4 in one line."""
    try:
        return json.dumps(data, ensure_ascii=False, default=str, allow_nan=False, **options)
    except ValueError as exc:
        fail(
            f"a stored record holds a number JSON cannot carry ({_first(exc)}); "
            "nothing was written",
            EXIT_CORRUPT,
        )


def _first(exc: Exception) -> str:
    return (str(exc).splitlines() or [type(exc).__name__])[0][:120]


def short(text: str, width: int = 60) -> str:
    """One-line preview of message text for tables."""
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"
