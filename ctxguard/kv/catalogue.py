"""Built-in architecture facts for popular open models, and model-name resolution.

The numbers live in ``catalogue.json`` as config.json excerpts, each with a ``source``
note, and go through the same parser as a user's config, so the catalogue cannot
disagree with how a real config would be read.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from ctxguard.errors import ConfigError
from ctxguard.kv.architecture import (
    KVArchitecture,
    architecture_from_config,
    load_config_file,
    load_model_directory,
)


@cache
def _entries() -> Mapping[str, Mapping[str, Any]]:
    text = resources.files("ctxguard.kv").joinpath("catalogue.json").read_text("utf-8")
    models: Mapping[str, Mapping[str, Any]] = json.loads(text)["models"]
    return models


@cache
def _index() -> Mapping[str, str]:
    """Every accepted spelling (full id, short name, alias), lower-cased, to the entry id."""
    index: dict[str, str] = {}
    for model_id, entry in _entries().items():
        for spelling in (model_id, model_id.split("/")[-1], *entry.get("aliases", ())):
            index.setdefault(spelling.lower(), model_id)
            index.setdefault(spelling.split("/")[-1].lower(), model_id)
    return index


def catalogue_names() -> list[str]:
    """The model ids in the catalogue, sorted."""
    return sorted(_entries())


def from_catalogue(name: str) -> KVArchitecture:
    """Look a model up by id, short name or alias; unknown names get close matches."""
    model_id = _index().get(name.strip().lower())
    if model_id is None:
        raise ConfigError(_unknown_message(name))
    entry = _entries()[model_id]
    return architecture_from_config(entry["config"], name=model_id, source=entry["source"])


def _unknown_message(name: str) -> str:
    spellings = list(_index())
    close = difflib.get_close_matches(name.strip().lower(), spellings, n=4, cutoff=0.5)
    suggestions = sorted({_index()[c] for c in close})
    hint = f"did you mean {', '.join(suggestions)}? " if suggestions else ""
    return (
        f"unknown model {name!r}: not in the built-in catalogue and not a file or directory. "
        f"{hint}Pass a config.json path, a local model directory, or one of "
        "`ctxguard kv --list-models`."
    )


def resolve_model(model: str | Path | KVArchitecture) -> KVArchitecture:
    """Turn what a user typed into an architecture: an object, a path, or a catalogue name."""
    if isinstance(model, KVArchitecture):
        return model
    path = Path(model)
    if path.is_dir():
        config = path / "config.json"
        return load_model_directory(path) if config.exists() else _missing_config(path)
    if path.is_file():
        return load_config_file(path)
    if isinstance(model, Path) or str(model).endswith(".json"):
        raise ConfigError(f"config file {str(model)!r} does not exist")
    return from_catalogue(str(model))


def _missing_config(path: Path) -> KVArchitecture:
    raise ConfigError(f"directory {str(path)!r} has no config.json; is it a model checkpoint?")
