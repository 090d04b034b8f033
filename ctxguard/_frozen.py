"""Frozen slots dataclasses made without a wrapper call per field (issue 16, client CPU).

``@dataclass(frozen=True, slots=True)`` writes each field in ``__init__`` with
``object.__setattr__(self, name, value)``: a slot wrapper called with an argument
tuple, about 6x a plain slot store (a 9-field ``SessionInfo`` 1.35 us against 0.23 us
unfrozen, here). A warm turn builds about 25 such values (``StoredMessage``,
``SessionInfo``, ``WindowFetch``, ``Item``, ``PreparedRequest`` ...), ~140 fields.

:func:`fast_init` gives such a class an ``__init__`` with the same signature that,
for an instance of exactly that class, moves it for the field stores to a twin class
of the same slots (plain ``STORE_ATTR``, no ``__setattr__`` of its own) and back:
``object.__setattr__(self, "__class__", ...)`` twice whatever the field count. The
instance is the one the dataclass ``__init__`` makes, field for field; the class is
untouched otherwise (still frozen: its ``__setattr__`` raises for everyone else;
``__eq__``, ``__hash__``, ``__repr__``, pickling, ``dataclasses.replace`` as generated).
A subclass's instance takes the dataclass ``__init__``. Only classes whose every field
is a plain positional ``init`` field, with no ``__post_init__`` and no base, qualify:
anything else is refused at import (TypeError), so a change to a class cannot slip by.
A frozen dataclass without slots gets its instance dict in one store, in field order,
as generated; a default factory is called when its field is not given, as generated.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

T = TypeVar("T")


class _Factory:
    """A field with a default factory, not given (shown as the dataclass shows it)."""

    def __repr__(self) -> str:
        return "<factory>"


_FACTORY = _Factory()


def fast_init(cls: type[T]) -> type[T]:
    """``cls`` (a frozen dataclass) with the fast ``__init__`` (see the module)."""
    params = getattr(cls, "__dataclass_params__", None)
    slots = cls.__dict__.get("__slots__")
    fields = dataclasses.fields(cls)  # type: ignore[arg-type]
    names = tuple(f.name for f in fields)
    if (
        params is None
        or not params.frozen
        or not params.init
        or (slots is not None and tuple(slots) != names)
        or hasattr(cls, "__post_init__")
        or cls.__bases__ != (object,)
        or any(not f.init or f.kw_only for f in fields)
    ):
        raise TypeError(f"fast_init: {cls.__name__} is not a plain frozen dataclass")
    scope: dict[str, Any] = {"_cls": cls, "_init": cls.__init__, "_set": object.__setattr__}
    scope["_factory"] = _FACTORY
    signature, made = [], []
    for f in fields:
        if f.default_factory is not dataclasses.MISSING:
            scope[f"_f_{f.name}"] = f.default_factory
            signature.append(f"{f.name}=_factory")
            made.append(f"    if {f.name} is _factory: {f.name} = _f_{f.name}()")
        elif f.default is not dataclasses.MISSING:
            scope[f"_d_{f.name}"] = f.default
            signature.append(f"{f.name}=_d_{f.name}")
        else:
            signature.append(f.name)
    given = ", ".join(f"{n!r}: {n}" for n in names)
    lines = [
        f"def __init__(self, {', '.join(signature)}):",
        "    if type(self) is not _cls:  # a subclass: the generated __init__, as given",
        f"        kwargs = {{{given}}}",
        "        return _init(self, **{k: v for k, v in kwargs.items() if v is not _factory})",
        *made,
    ]
    if slots is None:  # fields in the instance's dict, in field order, as generated
        entries = ", ".join(f"{n!r}: {n}" for n in names)
        lines.append(f"    _set(self, '__dict__', {{{entries}}})")
    else:
        scope["_twin"] = type(f"_{cls.__name__}Fields", (), {"__slots__": names})
        lines += [
            "    _set(self, '__class__', _twin)",
            *(f"    self.{name} = {name}" for name in names),
            "    _set(self, '__class__', _cls)",
        ]
    exec("\n".join(lines), scope)
    init = scope["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__doc__ = cls.__init__.__doc__
    init.fast_init = True  # (what tests/test_frozen.py looks for)
    cls.__init__ = init  # type: ignore[method-assign]
    return cls
