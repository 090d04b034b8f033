"""ctxguard._frozen.fast_init: the hot frozen dataclasses built without a wrapper call per
field, each instance the one the dataclass ``__init__`` makes (issue 16, client CPU)."""

from __future__ import annotations

import copy
import dataclasses
import pickle
from collections.abc import Mapping
from typing import Any

import pytest

from ctxguard._frozen import fast_init
from ctxguard.guard.core import Speculation
from ctxguard.guard.flows import StoreCall
from ctxguard.guard.plan import Budget, Item
from ctxguard.guard.prepared import PreparedRequest
from ctxguard.stores.contract import (
    AppendResult,
    NewMessage,
    RecordWrite,
    SessionInfo,
    StoredMessage,
    WindowFetch,
    WindowHit,
)
from ctxguard.stores.redis_protocol import Call

HOT = [
    StoredMessage,
    AppendResult,
    SessionInfo,
    WindowFetch,
    WindowHit,
    NewMessage,
    RecordWrite,
    Item,
    Budget,
    PreparedRequest,
    Speculation,
    Call,
    StoreCall,
]


@pytest.mark.parametrize("cls", HOT, ids=lambda c: c.__name__)
def test_hot_classes_take_the_fast_init(cls: type) -> None:
    assert getattr(cls.__init__, "fast_init", False)


def _pair(slots: bool) -> tuple[type, type]:
    """The same frozen dataclass twice: as generated, and with fast_init."""

    def make() -> type:
        @dataclasses.dataclass(frozen=True, slots=slots)
        class Value:
            a: int
            b: Any
            c: str = "c"
            d: Mapping[int, int] = dataclasses.field(default_factory=dict)

        return Value

    return make(), fast_init(make())


@pytest.mark.parametrize("slots", [True, False])
def test_instances_are_the_generated_ones(slots: bool) -> None:
    plain, fast = _pair(slots)
    for args, kwargs in [
        ((1, [2]), {}),
        ((1, None, "x"), {}),
        ((1, 2, "x", {3: 4}), {}),
        ((), {"b": 2, "a": 1, "d": {5: 6}}),
    ]:
        want, got = plain(*args, **kwargs), fast(*args, **kwargs)
        assert type(got) is fast
        assert repr(got) == repr(want).replace(plain.__qualname__, fast.__qualname__)
        assert dataclasses.astuple(got) == dataclasses.astuple(want)
        assert got == fast(*args, **kwargs) and got != want
        assert copy.copy(got) == got
        assert dataclasses.replace(got, a=9).a == 9
        if not slots:
            assert list(vars(got)) == list(vars(want))
    assert fast(1, 2).d is not fast(1, 2).d  # a fresh default each time, as generated
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast(1, 2).a = 3  # type: ignore[misc]
    with pytest.raises(TypeError):
        fast(1)  # a missing argument, as generated
    with pytest.raises(TypeError):
        fast(1, 2, e=3)


def test_a_subclass_takes_the_generated_init() -> None:
    _, fast = _pair(True)

    class Sub(fast):  # type: ignore[valid-type, misc]
        __slots__ = ("extra",)

    value = Sub(1, 2)
    assert type(value) is Sub and value.a == 1 and value.d == {}
    assert Sub(1, 2, "x", {1: 2}).d == {1: 2}


def test_other_classes_are_refused() -> None:
    @dataclasses.dataclass(slots=True)
    class Mutable:
        a: int

    @dataclasses.dataclass(frozen=True)
    class Post:
        a: int

        def __post_init__(self) -> None:
            pass

    @dataclasses.dataclass(frozen=True)
    class KwOnly:
        a: int = dataclasses.field(kw_only=True)

    for cls in (Mutable, Post, KwOnly):
        with pytest.raises(TypeError):
            fast_init(cls)


def test_a_hot_value_hashes_pickles_and_stays_frozen() -> None:
    info = SessionInfo("s", 3, 40, "c", 1.0, 2.0, None, 0, 1)
    same = SessionInfo("s", 3, 40, "c", 1.0, 2.0, None, 0, 1)
    assert info == same and hash(info) == hash(same)
    assert info != dataclasses.replace(info, message_count=4)
    assert pickle.loads(pickle.dumps(info)) == info
    with pytest.raises(dataclasses.FrozenInstanceError):
        info.message_count = 4  # type: ignore[misc]
