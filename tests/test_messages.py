"""The message model: lossless OpenAI round trips, stored records, ids, validation."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ctxguard.errors import CtxGuardError, InvalidIdError, InvalidMessageError
from ctxguard.ids import MAX_ID_BYTES, new_message_id, validate_id, validate_name
from ctxguard.messages import Message, expand_record, to_message, to_messages

CROCKFORD = set("0123456789ABCDEFGHJKMNPQRSTVWXYZ")

OPENAI_MESSAGES: list[dict[str, Any]] = [
    {"role": "system", "content": "You are terse."},
    {"role": "developer", "content": "Use metric units.", "name": "policy"},
    {
        "role": "user",
        "name": "ann",
        "content": [
            {"type": "text", "text": "What is in this picture?"},
            {
                "type": "image_url",
                "image_url": {"url": "https://example.com/cat.png", "detail": "high"},
            },
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
        ],
    },
    {
        "role": "assistant",
        "content": None,
        "refusal": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            },
            {
                "id": "call_2",
                "type": "function",
                "function": {"name": "get_time", "arguments": "{}"},
            },
        ],
    },
    {"role": "tool", "content": "18°C, clear", "tool_call_id": "call_1"},
    {"role": "tool", "content": [{"type": "text", "text": "12:00"}], "tool_call_id": "call_2"},
    {
        "role": "assistant",
        "content": "It is 18°C in Paris at noon.",
        "reasoning_content": "Combine both tool results.",
        "refusal": None,
        "audio": {"id": "audio_1", "expires_at": 1700000000},
    },
    {"role": "user", "content": "", "name": "bob"},
]


@pytest.mark.parametrize("data", OPENAI_MESSAGES, ids=lambda d: d["role"])
def test_openai_round_trip_is_lossless(data: dict[str, Any]) -> None:
    message = Message.from_openai(data)
    assert message.to_openai() == data
    stored = Message.from_record(message.to_record())
    assert stored == message
    assert stored.to_openai() == data


def test_a_conversation_round_trips_in_order() -> None:
    messages = to_messages(OPENAI_MESSAGES)
    assert [m.to_openai() for m in messages] == OPENAI_MESSAGES


def test_unmodelled_keys_are_kept_in_extra() -> None:
    message = Message.from_openai(OPENAI_MESSAGES[6])
    assert message.extra == {
        "reasoning_content": "Combine both tool results.",
        "refusal": None,
        "audio": {"id": "audio_1", "expires_at": 1700000000},
    }
    assert message.text == "It is 18°C in Paris at noon."


def test_ctxguard_fields_travel_beside_the_openai_keys() -> None:
    data = {"role": "user", "content": "hi", "id": "my-id", "metadata": {"turn": 3}}
    message = Message.from_openai(data)
    assert (message.id, message.metadata) == ("my-id", {"turn": 3})
    assert message.to_openai() == {"role": "user", "content": "hi"}
    chosen = Message.from_openai({"role": "user", "content": "hi"}, id="x-1", metadata={"a": 1})
    assert (chosen.id, chosen.metadata) == ("x-1", {"a": 1})


def test_record_round_trip_keeps_every_field() -> None:
    message = Message(
        role="assistant",
        content=[{"type": "text", "text": "片仮名 and emoji 🙂"}],
        name="helper",
        id="msg-1",
        metadata={"nested": {"list": [1, 2.5, None, "x"]}, "flag": True},
        extra={"reasoning_content": "why", "refusal": None},
    )
    record = message.to_record()
    decoded = json.loads(record)
    assert decoded["id"] == "msg-1" and decoded["role"] == "assistant"
    assert Message.from_record(record) == message
    assert Message.from_record(record.encode()) == message
    assert Message.from_record(record).created_at == message.created_at


def test_text_joins_text_parts() -> None:
    message = Message.from_openai(OPENAI_MESSAGES[2])
    assert message.text == "What is in this picture?"
    assert Message(role="assistant", content=None, tool_calls=[]).text == ""


def test_to_message_accepts_messages_and_dicts() -> None:
    message = Message(role="user", content="hi")
    assert to_message(message) is message
    assert to_message({"role": "user", "content": "hi"}).content == "hi"


# -- ids ---------------------------------------------------------------------------


def test_generated_ids_are_time_ordered_and_unique() -> None:
    ids = [new_message_id() for _ in range(10_000)]
    assert len(set(ids)) == len(ids)
    assert ids == sorted(ids)
    assert all(len(i) == 26 and set(i) <= CROCKFORD for i in ids)
    time.sleep(0.002)
    assert new_message_id() > ids[-1]


def test_generated_ids_are_unique_across_threads() -> None:
    found: list[list[str]] = []

    def make() -> None:
        found.append([new_message_id() for _ in range(2_500)])

    threads = [threading.Thread(target=make) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    every = [i for batch in found for i in batch]
    assert len(set(every)) == 10_000
    assert all(batch == sorted(batch) for batch in found)


def test_messages_get_ordered_ids_by_default() -> None:
    messages = [Message(role="user", content=str(n)) for n in range(100)]
    assert [m.id for m in messages] == sorted(m.id for m in messages)


@pytest.mark.parametrize(
    ("value", "hint"),
    [
        ("", "empty"),
        ("x" * (MAX_ID_BYTES + 1), "257 bytes"),
        ("é" * 129, "258 bytes"),
        ("a\nb", "control character"),
        ("\x00", "control character"),
        ("\x7f", "control character"),
        ("\ud800", "lone surrogate"),
        (42, "must be a string"),
        (None, "must be a string"),
    ],
)
def test_validate_id_refuses(value: object, hint: str) -> None:
    with pytest.raises(InvalidIdError, match=hint) as caught:
        validate_id(value, "session id")
    assert isinstance(caught.value, CtxGuardError) and isinstance(caught.value, ValueError)
    assert "session id" in str(caught.value)


@pytest.mark.parametrize("value", ["a", "x" * MAX_ID_BYTES, "é" * 128, "日本語", "*", "a b"])
def test_validate_id_accepts(value: str) -> None:
    assert validate_id(value) == value


@pytest.mark.parametrize("value", ["", "a:b", "a*", "x" * 65, "ünï", None])
def test_validate_name_refuses(value: object) -> None:
    with pytest.raises(InvalidIdError):
        validate_name(value, "namespace")


# -- validation ------------------------------------------------------------------------

TOOL_CALL = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}

BAD: list[tuple[Any, str]] = [
    ({"role": "wizard", "content": "hi"}, "not a chat role; role must be one of system, developer"),
    ({"content": "hi"}, "role"),
    ({"role": "tool", "content": "42"}, "needs tool_call_id"),
    ({"role": "user", "content": "hi", "tool_call_id": "c1"}, "only allowed on tool"),
    ({"role": "user", "content": "hi", "tool_calls": [TOOL_CALL]}, "only allowed on assistant"),
    (
        {
            "role": "assistant",
            "tool_calls": [{**TOOL_CALL, "function": {"name": "f", "arguments": "{'a': 1}"}}],
        },
        "must be a JSON string",
    ),
    ({"role": "assistant", "tool_calls": [{"id": "c1", "type": "function"}]}, "function"),
    ({"role": "user", "content": 42}, "content must be"),
    ({"role": "user", "content": {"text": "hi"}}, "content must be"),
    ({"role": "user", "content": [{"type": "audio", "data": "x"}]}, "content"),
    ({"role": "tool", "tool_call_id": "c", "content": OPENAI_MESSAGES[2]["content"]}, "text"),
    ({"role": "user", "content": None}, "needs content"),
    ({"role": "system"}, "needs content"),
    ({"role": "user", "content": "hi", "id": ""}, "empty"),
    ({"role": "user", "content": "hi", "id": "x" * 257}, "257 bytes"),
    ({"role": "user", "content": "hi", "id": "a\tb"}, "control character"),
    ({"role": "user", "content": "hi", "id": 7}, "id"),
    ({"role": "user", "content": "hi", "metadata": "not a dict"}, "metadata"),
    (["role", "user"], "must be a dict"),
    ("hello", "must be a dict"),
]


@pytest.mark.parametrize(("data", "hint"), BAD, ids=[hint for _, hint in BAD])
def test_invalid_messages_raise_a_typed_error(data: Any, hint: str) -> None:
    with pytest.raises(InvalidMessageError, match=hint) as caught:
        to_message(data)
    assert isinstance(caught.value, CtxGuardError)


def test_extra_must_not_repeat_modelled_keys() -> None:
    with pytest.raises(InvalidMessageError, match="extra must not repeat"):
        Message(role="user", content="hi", extra={"role": "system"})
    with pytest.raises(InvalidMessageError, match="extra must not repeat"):
        Message(role="user", content="hi", extra={"id": "x"})


def test_batch_errors_name_the_position() -> None:
    with pytest.raises(InvalidMessageError, match="message 1: "):
        to_messages([{"role": "user", "content": "ok"}, {"role": "nobody", "content": "x"}])


@pytest.mark.parametrize(
    "raw",
    [
        b"\x00{not json",
        "[]",
        '{"role": "user"}',
        '{"role": "wizard", "content": "x", "id": "a"}',
        '{"role": "user", "content": "x", "id": "a", "bogus": 1}',
        '{"role": "user", "content": "x", "id": ""}',
    ],
)
def test_from_record_refuses_what_is_not_a_record(raw: str | bytes) -> None:
    with pytest.raises(ValueError):  # the stores turn this into CorruptRecordError
        Message.from_record(raw)


# -- issue 12, item 19: what is stored is JSON, so what comes back is what went in ------

NOT_JSON_VALUES: dict[str, Any] = {
    "bytes": b"raw",
    "bytearray": bytearray(b"raw"),
    "set": {1, 2},
    "tuple": (1, 2),
    "object": object(),
    "nan": float("nan"),
    "inf": float("inf"),
    "complex": 1j,
    "int-key": {1: "x"},
    "surrogate": "a\ud800",
}


def _deep_list(depth: int) -> Any:
    value: Any = []
    for _ in range(depth):
        value = [value]
    return value


NOT_JSON_VALUES["deep"] = _deep_list(5_000)


@pytest.mark.parametrize("field", ["metadata", "extra"])
@pytest.mark.parametrize("kind", sorted(NOT_JSON_VALUES))
def test_non_json_values_in_message_fields_are_refused_naming_the_field(
    field: str, kind: str
) -> None:
    value = NOT_JSON_VALUES[kind]
    with pytest.raises(InvalidMessageError) as info:
        if field == "metadata":
            Message(role="user", content="x", metadata={"k": value})
        else:
            Message.from_openai({"role": "user", "content": "x", "vendor_field": value})
    text = str(info.value)
    assert field in text and "\n" not in text


@pytest.mark.parametrize(
    "data",
    [
        {"role": "user", "content": "x", "name": b"raw"},
        {"role": "tool", "content": "x", "tool_call_id": b"c1"},
        {"role": "user", "content": "x", "id": b"id-1"},
        {"role": b"user", "content": "x"},
        {"role": "user", "content": [{"type": "text", "text": b"raw"}]},
        {
            "role": "assistant",
            "tool_calls": [{"id": b"c", "function": {"name": "f", "arguments": "{}"}}],
        },
    ],
)
def test_bytes_are_not_taken_as_text(data: dict[str, Any]) -> None:
    with pytest.raises(InvalidMessageError) as info:
        Message.from_openai(data)
    assert "\n" not in str(info.value)


def test_json_values_round_trip_exactly() -> None:
    meta = {"a": [1, 2.5, None, True, "t", {"b": []}], "big": 10**30, "deep": _deep_list(60)}
    message = Message(role="user", content="x", metadata=meta, extra={"vendor": {"k": [1]}})
    back = Message.from_record(message.to_record())
    assert back == message and back.metadata == meta


_LEAF = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=8), st.binary(max_size=4)
)
_VALUE = st.recursive(
    st.one_of(_LEAF, st.sets(st.integers(), max_size=2), st.tuples(st.integers())),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.one_of(st.text(max_size=4), st.integers()), inner, max_size=3),
    ),
    max_leaves=10,
)


@settings(max_examples=300, deadline=None)
@given(metadata=st.dictionaries(st.text(max_size=6), _VALUE, max_size=4), extra=_VALUE)
def test_any_metadata_is_refused_or_comes_back_unchanged(metadata: Any, extra: Any) -> None:
    data = {"role": "user", "content": "x", "metadata": metadata, "vendor": extra}
    try:
        message = Message.from_openai(data)
    except InvalidMessageError as exc:
        assert "\n" not in str(exc)
        return
    back = Message.from_record(message.to_record())
    assert back == message
    assert back.metadata == metadata and back.to_openai()["vendor"] == extra
    assert repr(back.metadata) == repr(metadata)  # no silent bytes->str, tuple->list, nan->None


# -- the plain {"role", "content"} dict built without pydantic's pass (messages._plain_message)


class _Str(str):
    pass


_PLAIN_VALUES: list[Any] = [
    "",
    "hi",
    'tab\tquote"back\\slash\nctl\x01\x7f',
    "ü 𝄞 \u2028 \u00e9",
    "\ud800",  # a lone surrogate: cannot be stored
    _Str("sub"),
    None,
    3,
    b"bytes",
    [{"type": "text", "text": "part"}],
    {"k": "v"},
]
_PLAIN_ROLES: list[Any] = ["system", "developer", "user", "assistant", "tool", "User", "", 1]
_PLAIN_IDS: list[Any] = [None, "m1", 'q"\\', "sp ace", "", "x" * 300, "\x00", "é", 5]


def _full(data: dict[str, Any], id: Any) -> Message:  # noqa: A002
    """What from_openai built before the plain path: pydantic's validation, always."""
    fields = {**data, "extra": {}}
    if id is not None:
        fields["id"] = id
    return Message(**fields)


def _outcome(make: Any) -> tuple[str, Any]:
    try:
        return "ok", make()
    except Exception as exc:  # the very error is the comparison
        return type(exc).__name__, str(exc)


@pytest.mark.parametrize("role", _PLAIN_ROLES)
@pytest.mark.parametrize("content", _PLAIN_VALUES)
@pytest.mark.parametrize("mid", _PLAIN_IDS)
def test_plain_dict_is_the_validated_message(role: Any, content: Any, mid: Any) -> None:
    """from_openai's plain path gives, for every role/content/id, the message (or the
    error) pydantic's validation gives: same fields, fields set, record and error text."""
    from ctxguard.messages import record_of

    data = {"role": role, "content": content}
    fast = _outcome(lambda: Message.from_openai(data, id=mid))
    full = _outcome(lambda: _full(data, mid))
    assert fast[0] == full[0]
    if fast[0] != "ok":
        assert fast[1] == full[1]
        return
    made, slow = fast[1], full[1]
    record = record_of(made)  # the JSON the plain path made, as the guard stores it
    assert record == made.to_record()
    assert type(made) is Message and made.model_fields_set == slow.model_fields_set
    same = slow.model_copy(update={"id": made.id, "created_at": made.created_at})
    assert made == same and made.__dict__ == same.__dict__
    assert made.to_record() == same.to_record()
    assert type(made.content) is type(slow.content) and type(made.role) is type(slow.role)
    assert json.loads(expand_record(record))["created_at"].endswith("Z")  # ISO once expanded
    if mid is None:
        assert made.id != slow.id and len(made.id) == 26  # a fresh id, as the default makes


def test_plain_dict_fields_are_its_own() -> None:
    """A plain dict's message holds new dicts of its own (not shared between messages)."""
    a = Message.from_openai({"role": "user", "content": "a"})
    b = Message.from_openai({"role": "user", "content": "a"})
    assert a.metadata == {} and a.extra == {} and a.metadata is not b.metadata
    assert a.extra is not b.extra and a.id < b.id
    with pytest.raises(Exception, match="frozen"):
        a.content = "x"  # type: ignore[misc]


def test_plain_dict_skips_the_validation_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """The commonest turn messages take the plain path (else the test above tests nothing)."""

    def no_pass(self: Message, **data: Any) -> None:
        raise AssertionError("validated")

    monkeypatch.setattr(Message, "__init__", no_pass)
    for role in ("system", "developer", "user", "assistant"):
        assert Message.from_openai({"role": role, "content": "hi"}).role == role
    assert Message.from_openai({"role": "user", "content": "hi"}, id="m-1").id == "m-1"
    for other in ({"role": "tool", "content": "x"}, {"role": "user", "content": "x", "name": "a"}):
        with pytest.raises(AssertionError, match="validated"):
            Message.from_openai(other)
