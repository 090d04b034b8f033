"""A model config's numbers, read one way: whole, finite, and positive where a size.

Configs name the same number in many ways, so a reader takes the first of several keys
present; an error names the field that is there and the model, and says to fix the
config.json. A count, size or period that is zero or negative (``num_hidden_layers: -3``,
``full_attention_interval: 0``) is refused here, never read as "absent" or as its absolute
value (Python's ``%`` with a negative period still matches every n-th layer).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ctxguard._validate import show
from ctxguard.errors import ConfigError
from ctxguard.kv.refusals import check_finite


def first(cfg: Mapping[str, Any], keys: tuple[str, ...]) -> Any:
    for key in keys:
        if cfg.get(key) is not None:
            return cfg[key]
    return None


def first_int(cfg: Mapping[str, Any], keys: tuple[str, ...]) -> int | None:
    for key in keys:  # (an error names the field that is there)
        if cfg.get(key) is not None:
            return as_int(cfg[key], key)
    return None


def optional_int(cfg: Mapping[str, Any], key: str) -> int | None:
    value = cfg.get(key)
    return None if value is None else as_int(value, key)


def as_int(value: Any, key: str) -> int:
    check_finite(value, key)
    if isinstance(value, bool) or not isinstance(value, int | float) or int(value) != value:
        raise ConfigError(f"config field {key!r} must be a whole number, got {show(value)}")
    return int(value)


def positive(cfg: Mapping[str, Any], keys: tuple[str, ...], name: str, what: str) -> int:
    """The first of ``keys`` present, which must be positive; a missing one is an error."""
    value = first_size(cfg, keys, name, what)
    if value is None:
        raise ConfigError(
            f"model {name!r}: config has no {what} (looked for {', '.join(keys)}); "
            "pass the model's full config.json"
        )
    return value


def first_size(
    cfg: Mapping[str, Any], keys: tuple[str, ...], name: str, what: str = ""
) -> int | None:
    """The first of ``keys`` present (None if none is), which must be positive: a count,
    a size or a layer period, for which zero or less means nothing."""
    for key in keys:
        if cfg.get(key) is not None:
            value = as_int(cfg[key], key)
            if value <= 0:
                named = f"{what} is {value} (field {key})" if what else f"{key} is {value}"
                raise ConfigError(
                    f"model {name!r}: {named}; it must be positive: fix it in config.json"
                )
            return value
    return None
