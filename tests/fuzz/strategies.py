"""What a caller can pass, as hypothesis strategies, and the canary check."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

# Every code point, lone surrogates included (see test_unstorable_inputs.py).
TEXT = st.text(max_size=40)
WILD_TEXT = st.one_of(
    TEXT,
    st.text(st.characters(codec="utf-8"), max_size=200),
    st.sampled_from(["", "\x00", "\r\n", "\u2028", "{x}", "*", "a:b", "\x1b[2J", "🙂" * 50]),
    st.builds(lambda n: "x" * n, st.integers(0, 300_000)),
)
JSON_LEAF = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False),
    TEXT,
)
JSON = st.recursive(
    JSON_LEAF,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(TEXT, inner, max_size=4)),
    max_leaves=12,
)
ANY = st.one_of(JSON, st.binary(max_size=8), st.just(object()), st.sets(st.integers(), max_size=2))
ROLE = st.one_of(st.sampled_from(["system", "developer", "user", "assistant", "tool"]), TEXT)


def tool_calls() -> st.SearchStrategy[Any]:
    call = st.fixed_dictionaries(
        {"id": WILD_TEXT, "type": st.just("function")},
        optional={
            "function": st.fixed_dictionaries(
                {"name": WILD_TEXT, "arguments": st.one_of(WILD_TEXT, JSON.map(_dumps))}
            )
        },
    )
    return st.one_of(st.lists(call, max_size=3), ANY)


def _dumps(value: Any) -> str:
    import json

    return json.dumps(value)


def message_dicts() -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(
        {"role": ROLE},
        optional={
            "content": st.one_of(
                WILD_TEXT,
                st.none(),
                st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": WILD_TEXT})),
                ANY,
            ),
            "name": st.one_of(WILD_TEXT, ANY),
            "tool_calls": tool_calls(),
            "tool_call_id": st.one_of(WILD_TEXT, ANY),
            "id": st.one_of(WILD_TEXT, ANY),
            "metadata": st.one_of(st.dictionaries(TEXT, st.one_of(JSON, ANY), max_size=4), ANY),
            "refusal": JSON,
        },
    )


SESSION_IDS = st.one_of(WILD_TEXT, st.integers(), st.none(), st.binary(max_size=10))
