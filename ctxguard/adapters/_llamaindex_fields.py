"""What lets a LlamaIndex object of ctxguard survive its own serialisation.

The memory (:mod:`~ctxguard.adapters._llamaindex_memory`) and the chat store
(:mod:`~ctxguard.adapters.llamaindex`) are pydantic components that LlamaIndex saves
with ``to_dict`` (a workflow ``Context`` with ``JsonSerializer``) or pickles, and
rebuilds with ``from_dict`` / ``cls(**fields)``. Their fields name the store (URL with
the password as ``***``), namespace, tenant, limit, counter spec and the guard's
settings, never a secret (a URL's password in the store or the counter spec is ``***``)
or a callable. Rebuilt in the same process, an object finds
the live guard it was made with (its ``handle``), summarizer and all; rebuilt
elsewhere, it opens the store again from those fields, taking the URL with its
password from ``CTXGUARD_URL`` when its redacted form matches.
"""

from __future__ import annotations

import os
import uuid
import weakref
from typing import Any

from ctxguard._secrets import redact_urls
from ctxguard._validate import one_line, show
from ctxguard.adapters._shared import GuardRef
from ctxguard.errors import ConfigError, InvalidInputError, MissingDependencyError
from ctxguard.guard.aio import AsyncGuard
from ctxguard.guard.config import GuardConfig
from ctxguard.guard.sync import Guard
from ctxguard.kv.limit import ContextLimit, StaticLimit
from ctxguard.stores.urls import redact_url

try:
    from llama_index.core.bridge.pydantic import BaseModel, Field, PrivateAttr, ValidationError
except ImportError as exc:  # pragma: no cover - exercised in a subprocess test
    raise MissingDependencyError("ctxguard.adapters.llamaindex", "llamaindex") from exc

URL_ENV = "CTXGUARD_URL"


class StoreFields(BaseModel):
    """The fields that name the store, shared by the memory and the chat store."""

    store: str | None = Field(
        default="memory://",
        description="the store URL, password as ***; None: a Guard object of this process",
    )
    namespace: str | None = Field(default=None, description="the store's namespace")
    tenant: str | None = Field(default=None, description="the store's tenant")
    limit: int | None = Field(default=None, description="the context limit in tokens")
    counter: str | None = Field(default="approx", description="the token counter spec")
    settings: dict[str, Any] = Field(
        default_factory=dict, description="GuardConfig fields (no summarizer)"
    )
    handle: str = Field(
        default_factory=lambda: uuid.uuid4().hex,
        description="finds the live guard again when rebuilt in the same process",
    )
    _ref: GuardRef | None = PrivateAttr(default=None)

    def __deepcopy__(self, memo: dict[int, Any] | None = None) -> Any:
        """A deep copy is the object rebuilt from its fields, as a pickle rebuilds it:
        the same store (the live guard found again by its ``handle``), its own locks.
        (pydantic's own deep copy reached the guard's lock: a bare ``TypeError``.)"""
        return type(self).model_validate(self.model_dump())


_LIVE: weakref.WeakValueDictionary[str, GuardRef] = weakref.WeakValueDictionary()


def remember(handle: str, ref: GuardRef) -> None:
    """``ref`` is the live guard of the object whose ``handle`` this is."""
    _LIVE[handle] = ref


def find_or_reopen(handle: str, fields: dict[str, Any], build: str) -> GuardRef:
    """The live guard of ``handle`` in this process, else one opened from ``fields``
    (``build`` names what builds the object anew, for the errors)."""
    ref = _LIVE.get(handle) or reopen(fields, build)
    _LIVE[handle] = ref
    return ref


class NothingOpen:
    """What closing an object that never opened a guard closes."""

    def close(self) -> None:
        return None

    async def aclose(self) -> None:
        return None


def to_close(ref: GuardRef | None, handle: str) -> GuardRef | NothingOpen:
    """What closing an object closes: the guard it opened or found, else the live guard
    of its ``handle`` in this process, else nothing (closing opens nothing: it needs no
    password, and a ``with`` block's exit never hides the block's own error)."""
    found = ref or _LIVE.get(handle)
    return NothingOpen() if found is None else found


def reopen(fields: dict[str, Any], build: str) -> GuardRef:
    """A guard opened from an object's serialised fields."""
    url = fields.get("store")
    if url is None:
        raise ConfigError(
            "this object was built on a Guard object of another process; rebuild it "
            f"with {build}(guard, ...)"
        )
    if fields.get("counter") is None:
        raise ConfigError(
            "this object's counter was an object, not a spec; rebuild it with "
            f"{build}(..., counter=...)"
        )
    if "***" in fields["counter"]:
        raise ConfigError(
            "the counter spec's password is never serialised: rebuild this object with "
            f"{build}(..., counter=...) and the full spec"
        )
    if "***" in url:
        full = os.environ.get(URL_ENV)
        if full is None or redact_url(full) != url:
            raise ConfigError(
                f"the store URL's password is never serialised: set {URL_ENV} to the "
                f"full URL of {url} or rebuild it with {build}(url, ...)"
            )
        url = full
    settings = fields.get("settings") or {}
    try:
        config = GuardConfig(**{k: v for k, v in settings.items() if k != "summarizer"})
    except TypeError as exc:
        raise ConfigError(f"settings must be GuardConfig fields: {exc}") from None
    return GuardRef(
        url,
        limit=fields.get("limit"),
        counter=fields["counter"],
        namespace=fields.get("namespace"),
        tenant=fields.get("tenant"),
        config=config,
    )


def hide_credentials(obj: StoreFields, build: str) -> None:
    """An object built from fields holding a password (a store URL or a counter spec
    written out in full): its guard is made from them now (it connects on first use) and
    the fields keep the password as ``***``, so its repr, ``to_dict`` and ``model_dump``
    show none."""
    store, counter = obj.store, obj.counter
    shown_store = None if store is None else redact_url(store)
    shown_counter = None if counter is None else redact_urls(counter)
    if not any(
        shown is not None and "***" in shown and "***" not in given
        for given, shown in ((store or "", shown_store), (counter or "", shown_counter))
    ):
        return
    ref = reopen(obj.model_dump(), build)
    obj.store, obj.counter = shown_store, shown_counter
    obj._ref = ref
    remember(obj.handle, ref)


def refusal(exc: ValidationError, kind: str, how: str) -> InvalidInputError:
    """The error a refused set of fields answers: the ctxguard error a check raised (pydantic
    wraps it, with the input, in a ValidationError of many lines), else pydantic's first
    complaint on one line."""
    errors = exc.errors()
    for error in errors:
        found = (error.get("ctx") or {}).get("error")
        if isinstance(found, InvalidInputError):
            return found
    first = errors[0] if errors else {"loc": (), "msg": str(exc)}
    where = ".".join(str(part) for part in first["loc"]) or "fields"
    return InvalidInputError(
        one_line(
            f"{kind} {where}: {first['msg']} (got {show(first.get('input'))}); "
            f"pass the fields {kind} documents, or build it with {how}"
        )
    )


def describe(guard_or_url: Guard | AsyncGuard | str, options: dict[str, Any]) -> dict[str, Any]:
    """The serialisable fields for a guard given as a URL or a Guard."""
    if isinstance(guard_or_url, str):
        limit = options.get("limit")
        counter = options.get("counter", "approx")
        config = options.get("config")
        return {
            "store": redact_url(guard_or_url),
            "namespace": options.get("namespace"),
            "tenant": options.get("tenant"),
            "limit": _tokens(limit),
            "counter": redact_urls(counter) if isinstance(counter, str) else None,
            "settings": _settings(config),
        }
    store = guard_or_url.store
    where = getattr(store, "where", None)
    return {
        "store": where if isinstance(where, str) else None,
        "namespace": getattr(store, "namespace", None),
        "tenant": getattr(store, "tenant", None),
        "limit": _tokens(guard_or_url.limit_source),
        "counter": guard_or_url.counter_spec,
        "settings": _settings(guard_or_url.config),
    }


def _tokens(limit: object) -> int | None:
    if isinstance(limit, bool):
        return None
    if isinstance(limit, int):
        return limit
    if isinstance(limit, ContextLimit):
        return limit.tokens
    if isinstance(limit, StaticLimit):
        return limit.resolve().tokens
    return None


def _settings(config: object) -> dict[str, Any]:
    if not isinstance(config, GuardConfig):
        return {}
    data = config.describe()
    data.pop("summarizer", None)
    return data
