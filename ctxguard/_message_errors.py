"""A message's validation error as one line in the data's terms: where (a path such as
``tool_calls[0].function.arguments``), then what. Pydantic's dump, its union branches
and the part models' class names are not for users, who sent dicts (or JSON)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import pydantic

from ctxguard._validate import one_line, show

ROLES: tuple[str, ...] = ("system", "developer", "user", "assistant", "tool")


def first_error(exc: pydantic.ValidationError) -> str:
    """The first problem, on one line: where (a data path, ``tool_calls[0].function``),
    then what (pydantic's dump and its model names are not for users)."""
    errors = exc.errors(include_url=False, include_context=False, include_input=False)
    # content given as parts: the str branch of the union failing says nothing useful
    useful = [e for e in errors if tuple(e["loc"][:2]) != ("content", "str")] or errors
    err = useful[0]
    where = _path(err["loc"])
    msg = err["msg"].removeprefix("Value error, ")
    while (nested := _NESTED.match(msg)) is not None:  # a part's own error, inside ours
        msg = msg[nested.end() :]
        inner = _INNER_PATH.match(msg)
        if inner is not None:
            where = f"{where}.{inner.group(1)}" if where else inner.group(1)
            msg = msg[inner.end() :]
    where = where.replace(".[", "[")
    if where and msg.startswith(where):  # our own checks name the place already
        where = ""
    more = len(useful) - 1
    tail = f" (and {more} more problem{'s' if more > 1 else ''})" if more else ""
    return one_line(f"{where}: {msg}{tail}" if where else f"{msg}{tail}")


_NESTED = re.compile(r"invalid [A-Z][A-Za-z]*: ")
_INNER_PATH = re.compile(r"([A-Za-z_][\w.\[\]]*): ")


def _path(loc: tuple[int | str, ...]) -> str:
    """``("tool_calls", 0, "function")`` as ``tool_calls[0].function``; a union's schema
    names (``tuple[...]``) and a tagged union's tag are left out."""
    out = ""
    tagged = False  # the next name after an index is the union's tag
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
            continue
        if "[" in part:  # a schema name, e.g. tuple[tagged-union[TextPart,ImagePart], ...]
            tagged = "tagged-union" in part
            continue
        if tagged and out.endswith("]"):
            tagged = False
            continue
        out = f"{out}.{part}" if out else part
    return out


def describe(exc: pydantic.ValidationError, data: Mapping[str, Any]) -> str:
    role = data.get("role")
    valid = ", ".join(ROLES)
    for err in exc.errors(include_url=False):
        if err["loc"] == ("role",):
            if role is None:
                return f"a message needs a role, one of {valid}"
            return f"role {show(role, 30)} is not a chat role; role must be one of {valid}"
    return one_line(f"invalid {show(role, 30)} message: {first_error(exc)}")
