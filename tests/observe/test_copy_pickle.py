"""ctxguard.observe's objects copy and pickle, or refuse with ``NotCopyableError``.

Table-driven over the public classes of ``ctxguard.observe`` and its modules (a class
added without a row fails ``test_every_observe_class_has_a_row``). What holds a thread,
a connection or locks (a background deliverer, a pressure reader, a tenant budget)
refuses ``copy.copy``, ``copy.deepcopy`` and pickle; an observer holding a registry or a
tracer refuses the deep copy and pickle (a shallow copy shares them); the events are
values. They raised Python's bare ``TypeError: cannot pickle '_thread.lock' object``
(or ``'module' object``).
"""

from __future__ import annotations

import copy
import inspect
import logging
import pickle
from collections.abc import Callable
from types import ModuleType
from typing import Any

import pytest

import ctxguard.observe
from ctxguard import CtxGuardError, NotCopyableError
from ctxguard.observe import (
    OperationEvent,
    StoreCallEvent,
    SummaryEvent,
    background,
    fan_out,
    metrics,
    pressure,
    tenant_budget,
    tracing,
)

pytest.importorskip("prometheus_client")
pytest.importorskip("opentelemetry.sdk")

SECRET = "hunter2-secret"
COPIES: dict[str, Callable[[Any], Any]] = {
    "copy": copy.copy,
    "deepcopy": copy.deepcopy,
    "pickle": lambda o: pickle.loads(pickle.dumps(o)),
}
METRICS_URL = f"http://user:{SECRET}@127.0.0.1:9/metrics"


def _budget() -> Any:
    return tenant_budget.TenantBudget(
        f"redis://:{SECRET}@127.0.0.1:9/0", tokens=1000, window_seconds=60
    )


# "module.Class" -> (an instance, refuses the shallow copy too)
REFUSES: dict[str, tuple[Callable[[], Any], bool]] = {
    "observe.BackgroundObserver": (lambda: background(print), True),
    "pressure.PressureLimit": (lambda: pressure.PressureLimit(4000, METRICS_URL), True),
    "pressure.PressureMonitor": (lambda: pressure.monitor_for(METRICS_URL, 1.0, 1.0), True),
    "tenant_budget.TenantBudget": (_budget, True),
    "tenant_budget.TenantLimit": (  # (a limit source over its budget)
        lambda: tenant_budget.TenantLimit(pressure.PressureLimit(4000, METRICS_URL), _budget()),
        False,
    ),
    "metrics.PrometheusObserver": (
        lambda: metrics.PrometheusObserver(metrics.CollectorRegistry()),
        False,
    ),
    "tracing.TracingObserver": (lambda: tracing.TracingObserver(), False),
}
VALUES: dict[str, Callable[[], Any]] = {
    "observe.OperationEvent": lambda: OperationEvent("prepare", "s", 1, 2, 3),
    "observe.StoreCallEvent": lambda: StoreCallEvent("append", 1, 2),
    "observe.SummaryEvent": lambda: SummaryEvent("s", "ok", 1, 2, 3, 7),
    "pressure.Pressure": lambda: pressure.Pressure(0.5, 2.0, 1.0),
    "pressure.Page": lambda: pressure.Page(0.5, 2.0, None, ("a", "b")),
    # observers that are values (pickled by name); fan_out of ones that refuse: see
    # tests/test_copy_pickle.py (it refuses as they do, naming the observer)
    "observe.FanOut": lambda: fan_out(print, logging.getLogger("ctxguard.test").info),
}
MODULES: dict[str, ModuleType] = {
    "observe": ctxguard.observe,
    "pressure": pressure,
    "tenant_budget": tenant_budget,
    "metrics": metrics,
    "tracing": tracing,
}


def _public_classes() -> set[str]:
    found = set()
    for name, module in MODULES.items():
        names = getattr(module, "__all__", None)
        for attr in names or [n for n in vars(module) if n[:1] != "_"]:
            value = getattr(module, attr)
            if not inspect.isclass(value) or not value.__module__.startswith("ctxguard."):
                continue
            if issubclass(value, BaseException):  # (errors: tests/test_copy_pickle.py)
                continue
            if names is not None or value.__module__ == module.__name__:
                found.add(f"{name}.{attr}")
    return found


def test_every_observe_class_has_a_row() -> None:
    assert _public_classes() == REFUSES.keys() | VALUES.keys()


@pytest.mark.parametrize("how", COPIES)
@pytest.mark.parametrize("name", REFUSES)
def test_what_holds_a_thread_or_connection_refuses_in_one_typed_line(name: str, how: str) -> None:
    make, shallow_too = REFUSES[name]
    held = make()
    if how == "copy" and not shallow_too:
        copied = copy.copy(held)
        assert type(copied) is type(held) and vars(copied) == vars(held)
        return
    with pytest.raises(NotCopyableError) as caught:
        COPIES[how](held)
    text = str(caught.value)
    assert isinstance(caught.value, CtxGuardError) and isinstance(caught.value, TypeError)
    assert "\n" not in text and SECRET not in text and " holds " in text


@pytest.mark.parametrize("how", COPIES)
@pytest.mark.parametrize("name", VALUES)
def test_an_event_copies_equal(name: str, how: str) -> None:
    original = VALUES[name]()
    assert COPIES[how](original) == original
