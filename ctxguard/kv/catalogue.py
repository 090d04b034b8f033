"""Built-in architecture facts for popular open models, and model-name resolution.

The numbers live in ``catalogue.json`` as config.json excerpts, each with its ``source``
(the public config.json URL on the model's hub page), and go through the same parser as
a user's config, so the catalogue cannot disagree with how a real config would be read.
Aliases are short spellings of the same checkpoint: a name that is not in the catalogue
is refused with the closest spellings suggested, never resolved to a similar model.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from ctxguard._validate import show
from ctxguard.errors import ConfigError
from ctxguard.kv.architecture import (
    KVArchitecture,
    architecture_from_config,
    load_config_file,
    load_model_directory,
)

_SUGGESTION_MARGIN = 0.05  # suggest only spellings about as close as the closest one


@cache
def _entries() -> Mapping[str, Mapping[str, Any]]:
    text = resources.files("ctxguard.kv").joinpath("catalogue.json").read_text("utf-8")
    models: Mapping[str, Mapping[str, Any]] = json.loads(text)["models"]
    return models


@cache
def _spellings() -> Mapping[str, tuple[str, str]]:
    """Every accepted spelling lower-cased, to (the spelling as written, the entry id)."""
    index: dict[str, tuple[str, str]] = {}
    for model_id, entry in _entries().items():
        for spelling in (model_id, model_id.split("/")[-1], *entry.get("aliases", ())):
            for form in (spelling, spelling.split("/")[-1]):
                index.setdefault(form.lower(), (form, model_id))
    return index


def _index() -> Mapping[str, str]:
    return {key: model_id for key, (_, model_id) in _spellings().items()}


def catalogue_names() -> list[str]:
    """The model ids in the catalogue, sorted."""
    return sorted(_entries())


def from_catalogue(name: str) -> KVArchitecture:
    """Look a model up by id, short name or alias; unknown names get close matches."""
    found = _spellings().get(name.strip().lower())
    if found is None:
        raise ConfigError(_unknown_message(name))
    model_id = found[1]
    entry = _entries()[model_id]
    return architecture_from_config(entry["config"], name=model_id, source=entry["source"])


def _unknown_message(name: str) -> str:
    """Suggest the closest spellings (one per model, best first); never pick one silently."""
    spellings, typed = _spellings(), name.strip().lower()
    close = difflib.get_close_matches(typed, list(spellings), n=12, cutoff=0.6)
    best = difflib.SequenceMatcher(None, typed, close[0]).ratio() if close else 0.0
    suggestions: dict[str, str] = {}  # entry id -> best spelling, only the near-best ones
    for key in close:
        if difflib.SequenceMatcher(None, typed, key).ratio() >= best - _SUGGESTION_MARGIN:
            written, model_id = spellings[key]
            suggestions.setdefault(model_id, written)
    picked = [repr(s) for s in list(suggestions.values())[:3]]
    hint = f"; did you mean {' or '.join(picked)}?" if picked else ""
    return (
        f"unknown model {show(name, 200)}{hint} (give a catalogue name from `ctxguard kv "
        "--list-models`, a config.json path or a local model directory)"
    )


def resolve_model(model: str | Path | KVArchitecture) -> KVArchitecture:
    """Turn what a user typed into an architecture: an object, a path, or a catalogue name."""
    if isinstance(model, KVArchitecture):
        return model
    if isinstance(model, str) and not model.strip():  # Path("") is ".", the current directory
        raise ConfigError(
            "model is empty: give a catalogue name from `ctxguard kv --list-models`, "
            "a config.json path or a local model directory"
        )
    path = Path(model)
    if path.is_dir():
        config = path / "config.json"
        return load_model_directory(path) if config.exists() else _missing_config(path)
    if path.is_file():
        return load_config_file(path)
    if path.exists():  # a fifo, a device, a socket: was said "does not exist"
        raise ConfigError(
            f"{str(model)!r} is not a regular file (a device, pipe or socket); "
            "pass a config.json file or a model directory"
        )
    if isinstance(model, Path) or str(model).endswith(".json"):
        raise ConfigError(f"config file {str(model)!r} does not exist")
    return from_catalogue(str(model))


def _missing_config(path: Path) -> KVArchitecture:
    raise ConfigError(f"directory {str(path)!r} has no config.json; is it a model checkpoint?")
