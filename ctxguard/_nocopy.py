"""Objects that hold connections, locks or per-process state refuse to be copied or
pickled with :class:`~ctxguard.errors.NotCopyableError` (one line: what to do), not
Python's bare ``TypeError: cannot pickle '_thread.lock' object`` from deep inside, nor a
shallow copy that shares the original's connections and caches but not its ``close()``."""

from __future__ import annotations

from typing import Any, ClassVar, NoReturn

from ctxguard.errors import NotCopyableError


class NotPicklable:
    """Mixin: ``copy.deepcopy`` and pickle raise ``NotCopyableError``; ``copy.copy`` is
    the plain shallow copy (sharing what it holds, as frameworks that copy their
    components expect). A class sets ``_holds`` (what it holds, after "a <ClassName>
    holds") and ``_advice`` (what to do instead)."""

    __slots__ = ()
    _holds: ClassVar[str] = "a guard's connections"
    _advice: ClassVar[str] = "make one per process from the same settings"
    _how: ClassVar[str] = "deep-copied"

    def _refuse_copy(self) -> NoReturn:
        raise NotCopyableError(type(self).__name__, self._holds, self._advice, how=self._how)

    def __copy__(self) -> Any:
        cls = type(self)
        new = cls.__new__(cls)
        state = self.__getstate__()
        attrs, slots = state if isinstance(state, tuple) else (state, None)
        for name, value in {**(attrs or {}), **(slots or {})}.items():
            object.__setattr__(new, name, value)
        return new

    def __deepcopy__(self, memo: dict[int, Any]) -> NoReturn:
        self._refuse_copy()

    def __reduce_ex__(self, protocol: Any) -> NoReturn:
        self._refuse_copy()


class NotCopyable(NotPicklable):
    """Mixin: ``copy.copy`` too raises ``NotCopyableError`` (a shallow copy would share
    the connections and caches, and not know when the original is closed)."""

    __slots__ = ()
    _how: ClassVar[str] = "copied"

    def __copy__(self) -> NoReturn:
        self._refuse_copy()
