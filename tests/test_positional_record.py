"""A plain message is stored as the positional record ``["u",<content>,"<id>",<time>]``
(ctxguard/_record_time.py): it reads back as the message field for field, its expansion
is the ISO record earlier releases wrote, text for text, it is chosen exactly when the
rules say, and a damaged one, or one read by a release before it, fails validation.
"""

from __future__ import annotations

import contextlib
import json
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pydantic
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ctxguard._record_time import EPOCH, ROLE_CODES, expand_record, ulid_ms
from ctxguard.ids import new_message_id, new_message_id_ms
from ctxguard.messages import Message, iso_record, plain_from_record

CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
US = timedelta(microseconds=1)
ULID = "01M8TPGMZ9096T539X8BKPDQCF"
LAST = (datetime.max.replace(tzinfo=UTC) - EPOCH) // US


def as_released(raw: str | bytes) -> Any:
    """What a release before the positional form does with a record: its ``"t"``
    expansion (which leaves an array as it is), then the model's validation."""
    return Message.model_validate_json(raw)


def micros(when: datetime) -> int:
    return (when - EPOCH) // US


ulids = st.builds(
    lambda first, rest: first + rest,
    st.sampled_from("01234567"),
    st.text(alphabet=CROCKFORD, min_size=25, max_size=25),
)
# ids a user may give: any printable text, quotes and backslashes included, and near-ULIDs
other_ids = st.one_of(
    st.text(
        alphabet=st.characters(blacklist_categories=("Cc", "Cs", "Cf", "Zl", "Zp")),
        min_size=1,
        max_size=40,
    ).filter(lambda s: len(s.encode()) <= 256),
    st.sampled_from(
        [
            '"',
            "\\",
            '\\"',
            'a","b',
            ULID[:-1],
            ULID + "0",
            "8" + ULID[1:],
            ULID.lower(),
            ULID[:-1] + "I",
            ULID[:-1] + '"',
            '",' + ULID[3:],
            "x" + ULID,
            ULID + "\\",
        ]
    ),
)
contents = st.one_of(
    st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=60),
    st.lists(
        st.sampled_from(
            ['"', "\\", ",", "]", "[", '","', "é", "\n", "\x00", "\u2028", ULID, f',"{ULID}",5]']
        ),
        max_size=8,
    ).map("".join),
)
times = st.one_of(
    st.datetimes(
        min_value=datetime(1970, 1, 1), max_value=datetime(9999, 12, 31), timezones=st.just(UTC)
    ),
    st.datetimes(timezones=st.sampled_from([UTC, timezone(timedelta(hours=-3))])),
    st.datetimes(),  # naive: the ISO form
)


@settings(max_examples=600, deadline=None)
@given(
    role=st.sampled_from(["system", "developer", "user", "assistant"]),
    content=contents,
    message_id=st.one_of(ulids, st.builds(new_message_id), other_ids, st.just(None)),
    created_at=times,
    near=st.booleans(),
    offset=st.integers(min_value=-(10**12), max_value=10**12),
)
def test_a_plain_message_round_trips_through_its_record(
    role: str,
    content: str,
    message_id: str | None,
    created_at: datetime,
    near: bool,
    offset: int,
) -> None:
    fields: dict[str, Any] = {"role": role, "content": content}
    if message_id is not None:
        fields["id"] = message_id
        ms = ulid_ms(message_id)
        if near and ms is not None and 0 <= ms * 1000 + offset < LAST:
            created_at = EPOCH + (ms * 1000 + offset) * US  # a time near the id's
    message = Message(created_at=created_at, **fields)
    record, iso = message.to_record(), iso_record(message)
    positional = created_at.utcoffset() == timedelta(0) and created_at >= EPOCH
    assert record.startswith("[") is positional  # the array exactly when the rules say
    if positional:
        value = json.loads(record)
        assert value[:3] == [ROLE_CODES[role], content, message.id]
        ms = ulid_ms(message.id)
        assert value[3] == micros(created_at) - (0 if ms is None else ms * 1000)
        assert type(value[3]) is int and len(value) == 4
        with pytest.raises(pydantic.ValidationError):
            as_released(record)  # an earlier release refuses it: never a wrong message
    assert expand_record(record) == iso  # the ISO record, text for text
    assert expand_record(record.encode()) == iso.encode()
    for raw in (record, record.encode()):
        read = Message.from_record(raw)
        assert read.__dict__ == message.__dict__  # field for field
        assert read.created_at.utcoffset() == message.created_at.utcoffset()
    assert Message.from_record(record).to_record() == record  # written back the same
    fast = Message.from_openai({"role": role, "content": content}, id=message_id)  # plain path
    slow = Message(created_at=fast.created_at, id=fast.id, **{"role": role, "content": content})
    assert fast.to_record() == slow.to_record() and fast.to_record().startswith("[")
    assert Message.from_record(fast.to_record()).__dict__ == fast.__dict__
    for raw in (record, record.encode()):
        assert_decoded_alike(raw)
        simple_id = message.id.isascii() and message.id.isprintable()  # else the full way
        assert (plain_from_record(raw) is not None) is (positional and simple_id)


def assert_decoded_alike(raw: str | bytes) -> None:
    """plain_from_record gives what the full decode gives, field for field (the fields
    set, the tzinfo's type, the repr), or None; None wherever the full decode raises."""
    quick = plain_from_record(raw)
    try:
        full = Message.from_record(raw)
    except (pydantic.ValidationError, ValueError):
        assert quick is None
        return
    if quick is not None:
        assert quick.__dict__ == full.__dict__ and quick == full
        assert quick.model_fields_set == full.model_fields_set
        assert type(quick.created_at.tzinfo) is type(full.created_at.tzinfo)
        assert repr(quick) == repr(full)
        assert quick.__pydantic_extra__ == full.__pydantic_extra__
        assert quick.__pydantic_private__ == full.__pydantic_private__
        assert quick.to_record() == full.to_record()


@settings(max_examples=600, deadline=None)
@given(
    code=st.sampled_from(["u", "a", "s", "d", "t", "x", "user", ""]),
    content=st.one_of(contents, st.integers(), st.none()),
    message_id=st.one_of(ulids, other_ids, st.just(""), st.text(max_size=3), st.integers()),
    time=st.one_of(
        st.integers(),
        st.integers(min_value=-(10**18), max_value=10**18),
        st.sampled_from([0, -1, LAST, LAST + 1, -micros(EPOCH.replace(year=1)), 10**24]),
    ),
    cut=st.integers(min_value=0, max_value=400),
    insert=st.sampled_from(["", " ", "\n", ",", "-", "0", '"', "\\", "]", "1.0", "\u00e9"]),
)
def test_a_positional_record_decodes_alike_without_the_validation(
    code: str, content: Any, message_id: Any, time: int, cut: int, insert: str
) -> None:
    """Hand-made arrays (any code, content, id and time, the datetime range's edges
    and past them), each also with a few bytes put in anywhere: the quick decode is the
    full one or None."""
    raw = json.dumps([code, content, message_id, time], ensure_ascii=False, separators=(",", ":"))
    for text in (raw, raw[:cut] + insert + raw[cut:]):
        assert_decoded_alike(text)
        with contextlib.suppress(UnicodeEncodeError):
            assert_decoded_alike(text.encode())


def test_the_plain_path_and_the_model_write_the_same_record() -> None:
    fast = Message.from_openai({"role": "user", "content": 'a "quoted" \\ line'})
    assert fast.to_record().startswith('["u","a \\"quoted\\" \\\\ line","')
    slow = Message(role="user", content=fast.content, id=fast.id, created_at=fast.created_at)
    assert slow.to_record() == fast.to_record()
    record = fast.to_record()
    assert record.endswith(f'"{fast.id}",{micros(fast.created_at) - ulid_ms(fast.id) * 1000}]')
    made = Message.from_openai({"role": "user", "content": "x"}, id='q","' + ULID)
    assert (
        json.loads(made.to_record())[2] == 'q","' + ULID
        and Message.from_record(made.to_record()) == made
    )


@pytest.mark.parametrize(
    "fields",
    [
        {"role": "tool", "content": "r", "tool_call_id": "c1"},
        {"role": "user", "content": "x", "name": "ann"},
        {"role": "user", "content": "x", "metadata": {"k": 1}},
        {"role": "user", "content": "x", "extra": {"refusal": None}},
        {"role": "user", "content": [{"type": "text", "text": "x"}]},
        {"role": "assistant", "content": None},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}
            ],
        },
        {"role": "user", "content": "x", "created_at": datetime(1969, 12, 31, 23, 59, tzinfo=UTC)},
        {
            "role": "user",
            "content": "x",
            "id": ULID,
            "created_at": datetime(1969, 12, 31, 23, 59, tzinfo=UTC),
        },
    ],
    ids=[
        "tool",
        "name",
        "metadata",
        "extra",
        "parts",
        "no-content",
        "tool-calls",
        "pre-1970",
        "pre-1970-ulid",
    ],
)
def test_anything_but_a_plain_message_keeps_the_dict_form(fields: dict[str, Any]) -> None:
    message = Message(**fields)
    record = message.to_record()
    assert record.startswith("{") and Message.from_record(record) == message


def test_ulid_shape_is_the_layout_new_ids_have() -> None:
    made = new_message_id()
    assert ulid_ms(made) is not None
    for _ in range(2000):  # the plain path writes the ms it is handed: the one ulid_ms reads
        pair = new_message_id_ms()
        assert ulid_ms(pair[0]) == pair[1]
    assert abs(ulid_ms(made) - datetime.now(UTC).timestamp() * 1000) < 60_000  # type: ignore[operator]
    assert ulid_ms("0000000000" + "0" * 16) == 0
    assert ulid_ms("7ZZZZZZZZZ" + "0" * 16) == 2**48 - 1
    for bad in [
        "8" + ULID[1:],
        ULID[:-1],
        ULID + "0",
        ULID.lower(),
        ULID[:-1] + "U",
        "",
        " " * 26,
        "+" + ULID[1:],
        ULID[:12] + "_" + ULID[13:],
        " " + ULID[1:],
        "é" + ULID[2:],
        "\ud800" + ULID[1:],
    ]:
        assert ulid_ms(bad) is None


GOOD = Message(role="user", content="fine", id=ULID).to_record()
DAMAGED = {
    "truncated": GOOD[:-3],
    "truncated-head": GOOD[:4],
    "no-close": GOOD[:-1],
    "wrong-role-code": GOOD.replace('["u"', '["x"', 1),
    "tool-code": GOOD.replace('["u"', '["t"', 1),
    "role-word": GOOD.replace('["u"', '["user"', 1),
    "time-float": GOOD[:-1].rsplit(",", 1)[0] + ",1.5]",
    "time-text": GOOD[:-1].rsplit(",", 1)[0] + ',"5"]',
    "time-huge": GOOD[:-1].rsplit(",", 1)[0] + "," + "9" * 30 + "]",
    "time-far": GOOD[:-1].rsplit(",", 1)[0] + "," + "9" * 20 + "]",
    "time-plus": GOOD[:-1].rsplit(",", 1)[0] + ",+5]",
    "time-missing": GOOD[:-1].rsplit(",", 1)[0] + "]",
    "extra-last": GOOD[:-1] + ",7]",
    "extra-middle": GOOD.replace('"fine",', '"fine","more",', 1),
    "extra-first": GOOD.replace('["u",', '["u","more",', 1),
    "keys-inside": GOOD.replace('"fine",', '"fine","name":"n",', 1),
    "content-number": GOOD.replace('"fine"', "5", 1),
    "content-null": GOOD.replace('"fine"', "null", 1),
    "id-number": GOOD.replace(f'"{ULID}"', "5", 1),
    "id-escaped-close": GOOD.replace(f'"{ULID}"', f'"{ULID}\\"', 1),
    "object-inside": '["u",{"a":1},"x",5]',
    "empty": "[]",
}


@pytest.mark.parametrize("raw", DAMAGED.values(), ids=DAMAGED.keys())
def test_a_damaged_positional_record_fails_validation(raw: str) -> None:
    for value in (raw, raw.encode()):
        with pytest.raises((pydantic.ValidationError, ValueError)):
            Message.from_record(value)
        with pytest.raises((pydantic.ValidationError, ValueError)):
            as_released(value)
        assert plain_from_record(value) is None
