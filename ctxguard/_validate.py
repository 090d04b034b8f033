"""Argument checks at the public door: one place, cheap, one-line typed errors.

Every public entry point (``Guard``/``AsyncGuard`` methods, the stores' methods,
``Message``) checks its arguments here before anything is counted or stored, so
a bad value is an :class:`~ctxguard.errors.InvalidInputError` saying what was
wrong and what to do, never a ``TypeError`` from deep inside. Checks are type
tests first; JSON values (tools, usage, message metadata) are walked once,
iteratively (no ``RecursionError``), to a depth of :data:`MAX_JSON_DEPTH`.

Kept whole past ~400 lines on purpose: it is the one place every door's checks live, so
a rule is written once.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, TypeGuard

from ctxguard.errors import ConfigError, InvalidInputError, InvalidMessageError

if TYPE_CHECKING:
    from ctxguard.guard.prepared import PreparedRequest
    from ctxguard.messages import Message
    from ctxguard.stores.base import NewMessage, RecordWrite, Summary, WriteOptions

_BOUND = False  # the model types above, bound at runtime by _bind_types


def _bind_types() -> None:
    """Bind the model types the per-call checks name. Their modules import this one, so
    they cannot be imported with it; a ``from`` import in the check itself costs ~1 us a
    call (the import system's lookups, and an AttributeError made and dropped for a
    module's missing ``__path__``), several calls a turn."""
    global _BOUND
    from ctxguard.guard.prepared import PreparedRequest
    from ctxguard.messages import Message
    from ctxguard.stores.base import NewMessage, RecordWrite, Summary, WriteOptions

    globals().update(
        PreparedRequest=PreparedRequest,
        Message=Message,
        NewMessage=NewMessage,
        RecordWrite=RecordWrite,
        Summary=Summary,
        WriteOptions=WriteOptions,
    )
    _BOUND = True


MAX_JSON_DEPTH = 64
# the largest JSON integer stored: its decimal text must stay under Python's default
# int/str conversion limit (4300 digits), or no reader could decode the record again
MAX_JSON_INT_DIGITS = 4000
_JSON_INT_BOUND = 10**MAX_JSON_INT_DIGITS
_UNSET: Any = object()  # "not passed" for check_store_args (None may be a bad value)
MAX_SECONDS = 1_000_000  # a wait past this (~11.6 days) overflows time arithmetic (time_t)
MAX_INT = 2**63 - 1  # Redis integers are signed 64-bit; seconds past this overflow time math
_JSON_TYPES = "str, int, float, bool, None, list or dict with str keys"


def is_seconds(value: object) -> TypeGuard[float]:
    """A positive, finite number of seconds a wait can take: at most MAX_SECONDS."""
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and 0 < value <= MAX_SECONDS
    )


def one_line(text: str, limit: int = 300) -> str:
    """Error text on one line, cut to ``limit`` characters."""
    flat = " ".join(text.split()) if ("\n" in text or "\r" in text) else text
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def show(value: object, limit: int = 60) -> str:
    """A short, safe rendering of a caller's value for an error message (no deep repr);
    a credential in text (a URL's password, a bearer token: a store URL given where a
    number goes) as ``***``, hidden before the cut (a cut URL hides nothing)."""
    kind = type(value)
    if value is None or kind is bool or kind is float:
        return repr(value)
    if kind is int:
        bits = value.bit_length()  # type: ignore[attr-defined]
        return repr(value) if bits < 128 else f"an int of {bits} bits"
    if kind is str:
        from ctxguard._secrets import redact_text  # (it imports the store URLs, which use this)

        text = redact_text(value, max(limit, 4096))  # type: ignore[arg-type]
        return repr(text[:limit]) + ("..." if len(text) > limit else "")
    return f"a {kind.__name__}"


def type_name(value: object) -> str:
    return "None" if value is None else type(value).__name__


def _where(what: str, path: tuple[Any, ...]) -> str:
    return what + "".join(f"[{show(p, 20)}]" for p in path)


def _bad_text(text: str) -> bool:
    """True for text that cannot be encoded as UTF-8 (lone surrogates)."""
    if text.isascii():
        return False
    try:
        text.encode()
    except UnicodeEncodeError:
        return True
    return False


def json_problem(value: object, what: str, *, loose: bool = False) -> str | None:
    """None if ``value`` is JSON data, else one line naming the first bad place.

    JSON data here: dict with str keys, list, str, int, finite float, bool, None,
    nested at most :data:`MAX_JSON_DEPTH` deep. ``loose`` also accepts any Mapping
    and tuples (values that are sent, not stored and read back).
    """
    stack: list[tuple[object, int, tuple[Any, ...]]] = [(value, 0, ())]
    pop, push = stack.pop, stack.append
    while stack:
        item, depth, path = pop()
        kind = type(item)
        if kind is str:
            if _bad_text(item):  # type: ignore[arg-type]
                return f"{_where(what, path)} is not valid Unicode text (lone surrogate)"
            continue
        if item is None or kind is bool:
            continue
        if kind is int:
            if -_JSON_INT_BOUND < item < _JSON_INT_BOUND:
                continue
            return (
                f"{_where(what, path)} is an int of more than {MAX_JSON_INT_DIGITS} digits, "
                "too long to store as JSON text that can be read back; send it as a string"
            )
        if kind is float:
            if not math.isfinite(item):  # type: ignore[arg-type]
                return f"{_where(what, path)} is {item!r}, not a JSON number; use a finite number"
            continue
        if kind is dict or (loose and isinstance(item, Mapping)):
            if depth >= MAX_JSON_DEPTH:
                return f"{what} is nested more than {MAX_JSON_DEPTH} levels deep; flatten it"
            for key, sub in item.items():  # type: ignore[attr-defined]
                if type(key) is not str or _bad_text(key):
                    return (
                        f"{_where(what, path)} has key {show(key, 20)} ({type_name(key)}); "
                        "JSON object keys must be text"
                    )
                push((sub, depth + 1, (*path, key)))
            continue
        if kind is list or (loose and kind is tuple):
            if depth >= MAX_JSON_DEPTH:
                return f"{what} is nested more than {MAX_JSON_DEPTH} levels deep; flatten it"
            for index, sub in enumerate(item):  # type: ignore[arg-type]
                push((sub, depth + 1, (*path, index)))
            continue
        if isinstance(item, str | int | float) and not isinstance(item, bool):
            # subclasses (str/int enums) are stored as their plain value
            base: object = (
                str.__str__(item)
                if isinstance(item, str)
                else int(item)
                if isinstance(item, int)
                else float(item)
            )
            push((base, depth, path))
            continue
        return f"{_where(what, path)} is a {type_name(item)}, not JSON ({_JSON_TYPES})"
    return None


def check_json(value: object, what: str, *, loose: bool = False) -> None:
    try:
        problem = json_problem(value, what, loose=loose)
    except Exception as exc:  # a mapping of the caller's whose reading raises
        from ctxguard._secrets import describe

        raise InvalidInputError(
            one_line(f"{what}: reading it raised {describe(exc, 200)}; nothing was stored")
        ) from exc
    if problem is not None:
        raise InvalidInputError(one_line(problem))


# -- guard arguments ---------------------------------------------------------


def check_session_id(value: object) -> str:
    """The cheap test first (most ids are short printable ASCII), then the full rules."""
    if type(value) is str and value.isascii() and value.isprintable() and 0 < len(value) <= 256:
        return value
    from ctxguard.ids import validate_id

    return validate_id(value, "session id")


def check_message_batch(values: object, what: str = "new_messages") -> Iterable[Any]:
    """A batch of messages: any iterable of messages, but not one message or a string."""
    if type(values) is list or type(values) is tuple:
        return values
    if not _BOUND:
        _bind_types()
    if isinstance(values, Mapping):
        raise InvalidMessageError(
            f"{what}: expected a list of messages, got a dict (wrap a single message in a list)"
        )
    if isinstance(values, Message):
        raise InvalidMessageError(
            f"{what}: expected a list of messages, got a Message (wrap it in a list)"
        )
    if values is None:
        raise InvalidMessageError(
            f"{what}: expected a list of messages, got None (pass [] for no new messages)"
        )
    if isinstance(values, str | bytes | bytearray) or not hasattr(values, "__iter__"):
        raise InvalidMessageError(
            f"{what}: expected a list of messages like [{{'role': 'user', 'content': 'hi'}}], "
            f"got {type_name(values)}"
        )
    return values


def check_reply(value: object) -> None:
    if isinstance(value, list | tuple):
        raise InvalidMessageError(
            f"reply: complete() takes one message, got a {type_name(value)}; "
            "store several with append()"
        )


def check_max_tokens(value: object) -> None:
    if value is None or (type(value) is int and value >= 0):
        return
    raise InvalidInputError(
        f"max_tokens must be a non-negative int or None (the guard's default), got {show(value)}"
    )


def check_tools(tools: object) -> None:
    """OpenAI tool definitions: a list of dicts, each JSON (walked once per prepare)."""
    if tools is None:
        return
    if not isinstance(tools, list | tuple):
        raise InvalidInputError(
            f"tools must be a list of tool definitions (dicts) or None, got {type_name(tools)}"
        )
    for index, tool in enumerate(tools):
        if not isinstance(tool, Mapping):
            raise InvalidInputError(
                f"tools[{index}] must be a dict (an OpenAI tool definition), got {type_name(tool)}"
            )
    check_json(tools, "tools", loose=True)


def check_usage(usage: object) -> None:
    """The server's ``usage`` as a dict (``response.usage.model_dump()``)."""
    if usage is None:
        return
    if not isinstance(usage, Mapping):
        raise InvalidInputError(
            f"usage must be a dict like response.usage.model_dump() or None, got {type_name(usage)}"
        )
    check_json(usage, "usage", loose=True)
    for key in ("prompt_tokens", "completion_tokens"):  # (total_tokens: observe charges
        # the larger of it and their sum, so a wrong total alone is not refused)
        count = usage.get(key)
        if count is not None and (type(count) is not int or not 0 <= count <= _MAX_USAGE):
            raise InvalidInputError(
                one_line(
                    f"usage[{key!r}] must be an int from 0 to 2**63-1 or None, got {show(count)}"
                )
            )


_MAX_USAGE = 2**63 - 1  # no server counts past it (10**400 overflowed every observer)


def check_prepared(prepared: object, session_id: str) -> None:
    if prepared is None:
        return
    if not _BOUND:
        _bind_types()
    if not isinstance(prepared, PreparedRequest):
        raise InvalidInputError(
            "prepared must be the PreparedRequest that prepare() returned, "
            f"got {type_name(prepared)}"
        )
    if prepared.session_id != session_id:
        raise InvalidInputError(
            one_line(
                f"prepared is the request of session {prepared.session_id!r}, not "
                f"{session_id!r}; pass the one prepare() returned for this session"
            )
        )


def check_summary_request(request: object) -> None:
    from ctxguard.guard.plan import SummaryRequest

    if not isinstance(request, SummaryRequest):
        raise InvalidInputError(
            "request must be the SummaryRequest a PreparedRequest's plan asked for, "
            f"got {type_name(request)}"
        )
    check_arg_types(
        "SummaryRequest",
        previous_text=(request.previous_text, "str?"),
        previous_version=(request.previous_version, "int"),
        covers_from=(request.covers_from, "int"),
        covers_to=(request.covers_to, "int"),
    )


def check_timeout(timeout: object) -> None:
    """A wait's timeout: None, or 0 to MAX_SECONDS (past it the wait overflows time_t)."""
    if timeout is None or (
        isinstance(timeout, int | float)
        and not isinstance(timeout, bool)
        and 0 <= timeout <= MAX_SECONDS
    ):
        return
    raise InvalidInputError(
        f"timeout must be None or a number of seconds from 0 to {MAX_SECONDS:,}, "
        f"got {show(timeout)}"
    )


# -- store arguments ---------------------------------------------------------


def check_count(value: object, what: str) -> None:
    if type(value) is not int or value < 0:
        raise InvalidInputError(one_line(f"{what} must be a non-negative int, got {show(value)}"))


def check_tail_args(start: object, expected_count: object) -> None:
    """``replace_tail``'s position and expected count (the store's and the guard's door)."""
    check_count(start, "start")
    if expected_count is not None:
        check_count(expected_count, "expected_count")
    if start > MAX_INT or (expected_count is not None and expected_count > MAX_INT):  # type: ignore[operator]
        raise InvalidInputError(f"start and expected_count must be at most {MAX_INT}")


def check_state_arg(expected_state: object) -> None:
    """A rewrite's ``expected_state``: None, or the state token a read returned."""
    if expected_state is not None and type(expected_state) is not str:
        raise InvalidInputError(
            one_line(
                "expected_state must be the state token a read returned (str) or None, "
                f"got {show(expected_state)}"
            )
        )


def check_optional_int(value: object, what: str) -> None:
    if value is not None and type(value) is not int:
        raise InvalidInputError(one_line(f"{what} must be an int or None, got {show(value)}"))


def check_range(start: object, stop: object) -> None:
    if type(start) is not int or (stop is not None and type(stop) is not int):
        raise InvalidInputError(
            f"start and stop must be ints (stop may be None), got {show(start)}, {show(stop)}"
        )


def check_prefix(prefix: object) -> None:
    """A session id prefix: "" (every session) or text a stored id could start with (the
    older rule: a listing finds what an older version stored too)."""
    if type(prefix) is not str:
        raise InvalidInputError(f"prefix must be a string, got {type_name(prefix)}")
    if prefix:
        from ctxguard.ids import validate_id  # (ids imports this module)

        validate_id(prefix, "prefix", stored=True)


def check_new_messages(messages: object) -> None:
    """What a store's append takes: NewMessage objects (the guard makes them)."""
    if not _BOUND:
        _bind_types()
    if not isinstance(messages, list | tuple):
        raise InvalidInputError(
            f"messages must be a list of NewMessage, got {type_name(messages)}; "
            "to store chat dicts use Guard.append()"
        )
    for item in messages:
        if type(item) is not NewMessage:
            raise InvalidInputError(
                f"messages must hold NewMessage(Message(...), tokens), got {type_name(item)}; "
                "to store chat dicts use Guard.append()"
            )
        tokens = item.tokens
        if not isinstance(item.message, Message) or (
            tokens is not None and type(tokens) is not int
        ):
            raise InvalidInputError("a NewMessage needs a Message and an int (or None) token count")


def check_options(options: object) -> None:
    if not _BOUND:
        _bind_types()
    if type(options) is not WriteOptions:
        raise InvalidInputError(f"options must be a WriteOptions, got {type_name(options)}")
    if options.counter is not None and type(options.counter) is not str:
        raise InvalidInputError("WriteOptions.counter must be a string or None")
    for name in ("ttl_seconds", "max_messages"):
        value = getattr(options, name)
        if value is not None and (type(value) is not int or not 0 <= value <= MAX_INT):
            raise InvalidInputError(f"WriteOptions.{name} must be a non-negative int or None")


# -- constructors of limits --------------------------------------------------


def check_arg_types(owner: str, **values: tuple[object, str]) -> None:
    """``name=(value, kind)`` with kind "int", "number", "str" or "mapping"; a trailing
    "?" allows None. Ranges are the constructor's own business; this makes them comparable."""
    for name, (value, kind) in values.items():
        optional = kind.endswith("?")
        if optional and value is None:
            continue
        base = kind.rstrip("?")
        if base == "int":
            ok = type(value) is int
        elif base == "number":
            ok = type(value) in (int, float) and math.isfinite(value)  # type: ignore[arg-type]
        elif base == "str":
            ok = type(value) is str
        else:
            ok = isinstance(value, Mapping)
        if not ok:
            expected = {"int": "an int", "number": "a number", "str": "a string"}.get(
                base, "a dict"
            )
            none = " or None" if optional else ""
            raise ConfigError(
                one_line(f"{owner}: {name} must be {expected}{none}, got {show(value)}")
            )


def check_store_args(
    *,
    new: object = _UNSET,
    options: object = _UNSET,
    write: object = None,
    summary: object = None,
    ints: Mapping[str, object] | None = None,
    counts: object = _UNSET,
    text: Mapping[str, object] | None = None,
    record: object = _UNSET,
) -> None:
    """The store methods' own arguments (the session id is checked by the store)."""
    if not _BOUND:
        _bind_types()
    if new is not _UNSET:
        check_new_messages(new)
    if options is not _UNSET:
        check_options(options)
    if write is not None and type(write) is not RecordWrite:
        raise InvalidInputError(f"write must be a RecordWrite or None, got {type_name(write)}")
    if write is not None:
        check_arg_types(
            "RecordWrite",
            counter=(write.counter, "str?"),
            retention=(write.retention, "int"),
            ttl=(write.ttl, "int"),
        )
        if not 0 <= write.retention <= MAX_INT or not 0 <= write.ttl <= MAX_INT:
            raise InvalidInputError(f"RecordWrite retention and ttl must be 0 to {MAX_INT}")
        if write.counts:
            check_counts(write.counts)
        if write.audit is not None:
            check_record(write.audit)
    if summary is not None and not isinstance(summary, Summary):
        raise InvalidInputError(f"summary must be a Summary, got {type_name(summary)}")
    for name, value in (ints or {}).items():
        if value is None and name == "expected_count":
            continue
        low = 0 if name in ("ttl", "retention", "turns") else -MAX_INT
        if type(value) is not int or not low <= value <= MAX_INT:
            raise InvalidInputError(
                one_line(f"{name} must be an int from {low} to {MAX_INT}, got {show(value)}")
            )
    for name, value in (text or {}).items():
        if type(value) is not str:
            raise InvalidInputError(f"{name} must be a string, got {type_name(value)}")
    if counts is not _UNSET:
        check_counts(counts)
    if record is not _UNSET:
        check_record(record)


def check_counts(counts: object) -> None:
    if not isinstance(counts, Mapping) or not all(
        type(k) is int and type(n) is int and abs(k) <= MAX_INT and abs(n) <= MAX_INT
        for k, n in counts.items()
    ):
        raise InvalidInputError("counts must map message positions (int) to token counts (int)")


def check_record(record: object) -> None:
    """Only the shape: records are encoded with a ``str`` fallback, and the guard's own
    records (one per turn) are not walked again."""
    if not isinstance(record, Mapping) or not all(type(k) is str for k in record):
        raise InvalidInputError(
            f"an audit record must be a dict with string keys, got {type_name(record)}"
        )


def check_http_options(owner: str, timeout: object, headers: object) -> None:
    """An HTTP caller's ``timeout`` (seconds, at most MAX_SECONDS: past it the deadline
    overflows time arithmetic) and ``headers`` (a dict of ASCII text, what httpx can send;
    a value is never shown: it is often an API key)."""
    if not is_seconds(timeout):
        raise ConfigError(
            f"{owner}: timeout must be a positive number of seconds, at most {MAX_SECONDS:,}, "
            f"got {show(timeout)}"
        )
    if headers is None:
        return
    if not isinstance(headers, Mapping):
        raise ConfigError(
            f"{owner}: headers must be a dict of str to str, got {type_name(headers)}"
        )
    for name, value in headers.items():
        if type(name) is not str or not _HEADER_NAME.fullmatch(name):
            raise ConfigError(
                one_line(f"{owner}: header name {show(name, 40)} is not an HTTP header name")
            )
        if type(value) is not str:
            raise ConfigError(
                f"{owner}: the value of header {name!r} must be a str, got {type_name(value)}"
            )
        if not _header_text(value.replace("\t", " ")):  # (not shown: often an API key)
            raise ConfigError(
                f"{owner}: the value of header {name!r} must be printable ASCII text "
                "(no line breaks, no accented letters)"
            )


_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # RFC 9110's token


def _header_text(text: str) -> bool:
    return text.isascii() and text.isprintable()


def check_http_url(url: object, what: str, base: bool = True) -> str:
    """``url`` if it is an ``http(s)://host[:port][/path]`` URL, else ConfigError; a
    ``base`` URL (paths are added to it) takes no query string or fragment, and no URL
    takes a secret in its query string (httpx logs every request's URL).

    Checked when an object that will call the URL is made, so a typo (``ftp://``,
    ``localhost:8000`` without a scheme, a bad port) fails at once and not at the first
    request. The error shows the URL without credentials or query string."""
    from urllib.parse import urlsplit

    if not isinstance(url, str):
        raise ConfigError(f"{what} must be a URL such as http://host:8000, got {type_name(url)}")
    problem = None
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError:
        problem = "it does not parse (check the port)"
    else:
        if parts.scheme.lower() not in ("http", "https"):
            problem = "only http:// and https:// are supported"
        elif not parts.hostname:
            problem = "it names no host"
        elif base and (parts.query or parts.fragment):
            # paths are added after it, and a key in a query would be logged with every call
            problem = "leave out the query string (?...) and fragment; send a key as a header"
        elif parts.query and _secret_in_query(parts.query):
            # httpx logs each request's URL at INFO: a key there would be in every log line
            problem = (
                "a secret in its query string would be logged with every call; leave it"
                " out (credentials go in the URL's user:password part, sent as Basic auth)"
            )
    if problem is not None:
        from ctxguard.kv.server import redact

        shown = redact(url)
        raise ConfigError(f"{what} must be an http(s) URL, got {shown!r}: {problem}")
    return url


def _secret_in_query(query: str) -> bool:
    """Whether a query string holds a value named like a secret (``?api_key=``,
    ``&token=``, ``?key=``, ``&sig=``): what :func:`redact_text` would hide."""
    from ctxguard._secrets import redact_text

    text = "?" + query
    return redact_text(text) != text
