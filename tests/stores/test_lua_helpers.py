"""Each script carries the `_lib.lua` helpers it reaches, each defined before its first use.

Lua resolves a `local function`'s free names when it is defined: a helper that
calls one defined further down calls a nil global, an error only on the path that
reaches it (which a test may never take). Checked statically for every script.
"""

from __future__ import annotations

import re
from importlib import resources

import pytest

from ctxguard.stores.redis_protocol import SCRIPT_NAMES, load_script

DEFINITION = re.compile(r"^local function (\w+)|^local ([A-Za-z_][\w, ]*?)\s*=", re.M)
WORD = re.compile(r"[A-Za-z_]\w*")
# string literals and comments (their words are not uses); same length, so positions hold
NOT_CODE = re.compile(r"'(?:[^'\\\n]|\\.)*'|\"(?:[^\"\\\n]|\\.)*\"|--[^\n]*")


def code_only(text: str) -> str:
    return NOT_CODE.sub(lambda m: " " * len(m.group()), text)


def definitions(text: str) -> dict[str, int]:
    found: dict[str, int] = {}
    for match in DEFINITION.finditer(text):
        for name in (match[1] or match[2]).split(","):
            found.setdefault(name.strip(), match.start())
    return found


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_every_helper_is_defined_before_it_is_used(name: str) -> None:
    text = code_only(load_script(name))
    defined = definitions(text)
    all_helpers = definitions((resources.files("ctxguard.stores") / "lua" / "_lib.lua").read_text())
    for word_match in WORD.finditer(text):
        word = word_match.group()
        if word not in all_helpers:
            continue
        assert word in defined, f"{name}.lua uses {word} but does not carry it"
        assert defined[word] <= word_match.start(), f"{name}.lua uses {word} before defining it"


def test_a_script_leaves_out_helpers_it_never_reaches() -> None:
    assert "local function append_many" not in load_script("read")
    assert "local function append_many" in load_script("append")


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_key_indices_are_written_in_as_numbers(name: str) -> None:
    # the key index names (K_META ...) are gone from the text Redis runs: none is left
    # as a free name (a nil global at run time) or an upvalue of every helper closure
    assert re.search(r"\bK_[A-Z]+\b", code_only(load_script(name))) is None


def test_a_key_index_written_in_is_the_key_s_position() -> None:
    # KEYS order: meta msgs toks ids pins sum audit rids ctx (keys.SUFFIXES)
    assert "check_types(2, 3)" in load_script("read")  # msgs, toks
    window = load_script("window")
    assert "must(4, redis.pcall('HEXISTS', KEYS[4]" in window  # ids
    assert "redis.pcall('HSETNX', KEYS[9], digest, context)" in window  # ctx
    assert "redis.call('RPUSH', KEYS[7], record)" in window  # audit
