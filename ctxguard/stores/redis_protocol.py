"""Redis store logic without I/O: script arguments in, typed results out.

The sync and async Redis stores (and their cluster variants) only send what
this module builds and hand the replies back to it, so the two can never
drift apart (the httpx ``BaseClient`` shape).

Kept whole past ~400 lines on purpose: each script's call builder sits next to its reply
parser, and splitting them would let the two drift apart.
"""

from __future__ import annotations

import functools
import itertools
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import resources
from typing import Any

import pydantic

from ctxguard._frozen import fast_init
from ctxguard._validate import check_state_arg, show
from ctxguard.errors import (
    ConflictError,
    CorruptRecordError,
    InvalidInputError,
    InvalidMessageError,
    MessageIdReusedError,
    SessionFullError,
)
from ctxguard.stores.audit_compact import expand
from ctxguard.stores.audit_context import audit_arg, resolve
from ctxguard.stores.base import (
    AppendResult,
    NewMessage,
    RecordWrite,
    ReplaceResult,
    SessionInfo,
    StoredMessage,
    Summary,
    WindowFetch,
    WindowHit,
    WriteOptions,
    check_summary,
    check_window_args,
    decode_audits,
    decode_message,
    decode_record,
    decode_summary,
    encode_audit,
    ms_to_datetime,
    stored_before,
    tokens_or_none,
    virtual_window,
)
from ctxguard.stores.integrity import RawSession, RepairPlan
from ctxguard.stores.keys import SUFFIXES, KeySpace
from ctxguard.stores.records import undecodable_message

# CORRUPT <key> <what>, as _lib.lua's corrupt() answers (Redis may add " script: ...")
_CORRUPT_REPLY = re.compile(r"CORRUPT (\S+) ([^'\"]*?)(?: script: |['\"]|$)")

# removed_tail's CORRUPT <msgs key> ...: the position of the record that does not decode
_RECORD_AT = re.compile(r"record that does not decode at position (\d+)$")

SCRIPT_NAMES = (
    "append",
    "window",
    "read",
    "set_counts",
    "commit_summary",
    "add_audit",
    "record",
    "retract",
    "replace",
    "restore",
    "repair",
    "lease",
    "delete",
)


@functools.cache
def load_script(name: str) -> str:
    """The text Redis runs for script ``name``.

    For ``append`` and ``window``, the common case first (``_fast.lua`` and
    ``fast_<name>.lua``: straight-line, no helper made), then the general script
    (:func:`general_script`) wrapped in a function that runs only when the common case
    declines; it writes nothing when it declines. The other scripts: the general one.
    """
    lua = resources.files("ctxguard.stores") / "lua"
    dispatch = lua / f"fast_{name}.lua"
    if not dispatch.is_file():
        return general_script(name)
    fast = (lua / "_fast.lua").read_text() + "\n" + dispatch.read_text()
    general = general_source(name)
    return _inline_keys(f"{fast}\nlocal function general()\n{general}\nend\nreturn general()\n")


@functools.cache
def general_script(name: str) -> str:
    """Script text: the shared helpers it uses, followed by the operation's own file.

    Redis runs a script's whole text on every call, so each helper it carries is a
    closure made per call: only the ones the operation reaches are included
    (``_lib_chunks``), in their order in ``_lib.lua``.
    """
    return _inline_keys(general_source(name))


@functools.cache
def general_source(name: str) -> str:
    """:func:`general_script` before the key indices are written in."""
    lua = resources.files("ctxguard.stores") / "lua"
    body = (lua / f"{name}.lua").read_text()
    # _reuse.lua's helpers after _lib.lua's (kept apart: see its opening comment)
    chunks = _lib_chunks((lua / "_lib.lua").read_text() + "\n" + (lua / "_reuse.lua").read_text())
    wanted = set(_WORD.findall(body))
    added = True
    while added:  # the helpers the wanted ones use, until nothing new is reached
        added = False
        for defines, text in chunks:
            if defines & wanted and not set(_WORD.findall(text)) <= wanted:
                wanted |= set(_WORD.findall(text))
                added = True
    kept = [text for defines, text in chunks if not defines or defines & wanted]
    return "".join(kept) + "\n" + body


# `local K_META, K_MSGS, ... = 1, 2, ...` in _lib.lua: the key indices, written into the
# text as numbers at load. Each name a function reads is otherwise an upvalue of its
# closure, made on every call (the helpers are defined anew by every call).
_KEY_INDEX = re.compile(r"^local (K_[A-Z_]+(?:, K_[A-Z_]+)*) = (\d+(?:, \d+)*)\n", re.M)


def _inline_keys(text: str) -> str:
    index: dict[str, str] = {}
    for found in _KEY_INDEX.finditer(text):
        index.update(zip(found[1].split(", "), found[2].split(", "), strict=True))
    text = _KEY_INDEX.sub("", text)
    return re.sub(r"\bK_[A-Z_]+\b", lambda m: index.get(m[0], m[0]), text)


_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_DEFINES = re.compile(r"^local (?:function ([A-Za-z_]\w*)|([A-Za-z_][\w, ]*?)\s*=)", re.M)


def _lib_chunks(lib: str) -> list[tuple[frozenset[str], str]]:
    """``_lib.lua`` cut before each top-level ``local`` (with the comments above it),
    each piece with the names it defines; the first piece (the key indices) defines
    names every script uses and is always kept (empty set: see ``load_script``)."""
    lines = lib.splitlines(keepends=True)
    starts = [0]
    for i, line in enumerate(lines):
        if line.startswith("local ") and i > 0:
            j = i
            while j > 0 and lines[j - 1].startswith("--"):
                j -= 1
            starts.append(j)
    starts = [*sorted(set(starts)), len(lines)]
    chunks: list[tuple[frozenset[str], str]] = []
    for a, b in itertools.pairwise(starts):
        text = "".join(lines[a:b])
        names = {n.strip() for m in _DEFINES.finditer(text) for n in (m[1] or m[2]).split(",")}
        chunks.append((frozenset(names) if a else frozenset(), text))
    return chunks


# Scripts that append messages: a retry marks itself (a trailing '1') so that they
# report the ids an earlier, lost-reply attempt of the same call stored as stored.
_RETRY_MARKED = frozenset({"append", "window"})


@fast_init
@dataclass(frozen=True, slots=True)
class Call:
    """One script invocation: which script, its keys and arguments."""

    script: str
    keys: list[str]
    args: list[str | int]
    op: str = ""  # what an error names ("" = the script's name)

    @property
    def what(self) -> str:
        return self.op or self.script

    def again(self) -> Call:
        """The call to send when an earlier attempt may have run but lost its reply."""
        if self.script in _RETRY_MARKED:
            return Call(self.script, self.keys, [*self.args, "1"], self.op)
        return self


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def fast_reply(reply: bytes | str, messages: Sequence[NewMessage]) -> tuple[AppendResult, int]:
    """The common case's answer (``_fast.lua``): one string, ``count turn before after``,
    every message stored (it declines anything else); and the audit record's turn."""
    count, turn, before, after = _text(reply).split(" ")
    ids = tuple([m.message.id for m in messages])
    return AppendResult(ids, (), int(count), before or None, after or None), int(turn)


def _count_at(counts: Sequence[Any], index: int) -> int | None:
    """The stored count at ``index``; missing or not a number means unknown."""
    try:
        return tokens_or_none(int(counts[index]))
    except (IndexError, TypeError, ValueError):
        return None


def _ttl_arg(options: WriteOptions) -> int:
    return int(options.ttl_seconds or 0)


def _count_pairs(counts: Mapping[int, int]) -> list[str | int]:
    """Token counts as script arguments: (seq, tokens) pairs in seq order."""
    pairs: list[str | int] = []
    for seq, value in sorted(counts.items()):
        pairs += [int(seq), int(value)]
    return pairs


def _now_arg() -> str:
    """The caller's clock in microseconds: the scripts that append make the meta's
    ``updated``, the state token's stamp and a new session's epoch from it (no ``TIME``
    call in the script). A retry sends the same value (``Call.again``)."""
    return str(time.time_ns() // 1000)


def _message_args(messages: Sequence[NewMessage]) -> list[str | int]:
    args: list[str | int] = [len(messages)]
    for new in messages:
        tokens = -1 if new.tokens is None else int(new.tokens)
        args += [new.message.id, new.encoded(), tokens, "1" if new.message.is_pinned_role else "0"]
    return args


def _state_arg(expected_state: str | None) -> str:
    """A rewrite's expected state token as its script takes it ('' = no check)."""
    check_state_arg(expected_state)
    return "" if expected_state is None else "=" + expected_state


def _check_rewrite(session_id: str, reply: Sequence[Any]) -> int:
    """A retract's or replace's reply code; the conflicts raised (nothing was written)."""
    code = int(reply[0])
    if code == -1:
        raise ConflictError(
            f"session {session_id!r} now holds {int(reply[1])} messages, not the expected "
            "count; read it again and retry"
        )
    if code == -4:
        raise ConflictError(
            f"session {session_id!r} was written since it was read (its state token moved "
            "on); read it again and retry"
        )
    return code


class RedisProtocol:
    """Builds script calls and parses their replies for one key space."""

    def __init__(self, keyspace: KeySpace) -> None:
        self.keyspace = keyspace

    def keys(self, session_id: str, *, stored: bool = False) -> list[str]:
        """The session's keys; ``stored``: a read or delete (see ``KeySpace.session_keys``)."""
        return self.keyspace.session_keys(session_id, stored=stored)

    # -- building ------------------------------------------------------------

    def append_call(
        self,
        session_id: str,
        messages: Sequence[NewMessage],
        options: WriteOptions,
        audit: Mapping[str, Any] | None = None,
        retention: int = 0,
    ) -> Call:
        head: list[str | int] = [
            options.counter or "",
            _ttl_arg(options),
            options.max_messages or 0,
            "" if audit is None else audit_arg(audit),
            max(0, retention),
            _now_arg(),
        ]
        return Call("append", self.keys(session_id), head + _message_args(messages))

    def append_with_record_call(
        self,
        session_id: str,
        messages: Sequence[NewMessage],
        options: WriteOptions,
        write: RecordWrite,
    ) -> Call:
        """The append script with ``write``'s audit record and its recounts of stored
        messages (by ``write.counter``; none without one), in one call: every check of
        both runs before the first write (two scripts would leave the message stored
        when the counts' or the record's checks refuse)."""
        call = self.append_call(session_id, messages, options, write.audit, write.retention)
        if not (write.counts and write.counter):
            return call
        args = [*call.args, "counts", write.counter, len(write.counts)]
        return Call(call.script, call.keys, args + _count_pairs(write.counts))

    def window_call(
        self,
        session_id: str,
        budget: int,
        options: WriteOptions,
        new: Sequence[NewMessage],
        min_messages: int = 0,
        expect: str | None = None,
        write: RecordWrite | None = None,
    ) -> Call:
        """The window script: a fetch (never writes), or with ``expect`` (a state
        token; '' = no session yet) a commit if unchanged, with ``write``'s
        recounted tokens (by ``options.counter``) and audit record."""
        check_window_args(budget, min_messages)
        audit = None if write is None else write.audit
        head: list[str | int] = [
            options.counter or "",
            _ttl_arg(options),
            options.max_messages or 0,
            budget,
            min_messages,
            "" if expect is None else "=" + expect,
            "" if audit is None else audit_arg(audit),
            0 if write is None else max(0, write.retention),
            _now_arg(),
        ]
        counts: list[str | int] = [0]
        if write is not None and write.counts and options.counter and expect is not None:
            counts = [len(write.counts), *_count_pairs(write.counts)]
        return Call("window", self.keys(session_id), head + _message_args(new) + counts)

    def read_call(
        self, session_id: str, start: int, stop: int | None, with_token: bool = False
    ) -> Call:
        if not isinstance(start, int) or (stop is not None and not isinstance(stop, int)):
            raise InvalidInputError("start and stop must be ints")
        args: list[str | int] = [start, "" if stop is None else stop]
        return Call(
            "read", self.keys(session_id, stored=True), [*args, "1"] if with_token else args
        )

    def set_counts_call(
        self, session_id: str, counter: str, counts: Mapping[int, int], ttl: int
    ) -> Call:
        args: list[str | int] = [counter, ttl, *_count_pairs(counts)]
        return Call("set_counts", self.keys(session_id), args)

    def retract_call(
        self,
        session_id: str,
        count: int,
        expected: int | None,
        ttl: int,
        expected_state: str | None = None,
    ) -> Call:
        if not isinstance(count, int) or count < 0:
            raise InvalidInputError(f"count must be a non-negative int, got {show(count)}")
        now = datetime.now(UTC).isoformat()
        args: list[str | int] = [count, -1 if expected is None else expected, ttl, now]
        return Call("retract", self.keys(session_id), [*args, _state_arg(expected_state)])

    def parse_retract(self, session_id: str, reply: Sequence[Any]) -> list[StoredMessage]:
        _check_rewrite(session_id, reply)
        return list(self._removed(session_id, int(reply[3]), reply[1], reply[2]))

    def replace_call(
        self,
        session_id: str,
        start: int,
        messages: Sequence[NewMessage],
        expected: int | None,
        options: WriteOptions,
        expected_state: str | None = None,
    ) -> Call:
        head: list[str | int] = [
            start,
            -1 if expected is None else expected,
            options.counter or "",
            _ttl_arg(options),
            options.max_messages or 0,
            datetime.now(UTC).isoformat(),
            _now_arg(),
            _state_arg(expected_state),
        ]
        return Call("replace", self.keys(session_id), head + _message_args(messages))

    def parse_replace(
        self, session_id: str, messages: Sequence[NewMessage], reply: Sequence[Any]
    ) -> ReplaceResult:
        code = _check_rewrite(session_id, reply)
        if code == -2:
            raise InvalidMessageError(stored_before(_text(reply[1]), int(reply[2])))
        if code == -3:
            raise SessionFullError(session_id, int(reply[1]))
        removed = self._removed(session_id, int(reply[3]), reply[1], reply[2])
        return ReplaceResult(removed, self.parse_append(session_id, messages, reply[4:]))

    def restore_call(
        self,
        session_id: str,
        turns: int,
        summary: Summary | None,
        ttl: int,
        created_at: datetime | None = None,
    ) -> Call:
        raw = "" if summary is None else summary.model_dump_json()
        version = 0 if summary is None else summary.version
        created = ""
        if created_at is not None:
            aware = created_at if created_at.tzinfo else created_at.replace(tzinfo=UTC)
            created = str(int(aware.timestamp() * 1000))
        args: list[str | int] = [max(0, turns), raw, version, ttl, created]
        return Call("restore", self.keys(session_id), args)

    def commit_summary_call(
        self, session_id: str, summary: Summary, expected: int, ttl: int
    ) -> Call:
        args: list[str | int] = [
            expected,
            summary.model_dump_json(),
            summary.version,
            summary.covers_to,
            ttl,
        ]
        return Call("commit_summary", self.keys(session_id), args)

    def audit_call(
        self, session_id: str, record: Mapping[str, Any], retention: int, ttl: int
    ) -> Call:
        raw = audit_arg(record)
        return Call("add_audit", self.keys(session_id), [raw, max(0, retention), ttl])

    def record_call(self, session_id: str, write: RecordWrite) -> Call | None:
        """The one script call that writes ``write`` (None when it holds nothing): counts
        and an audit record together in ``record.lua``, which checks for both before it
        writes either (two scripts would leave the counts written when the record's
        checks refuse, or the record when the counts' do)."""
        counts = bool(write.counts and write.counter)
        if counts and write.audit is not None:
            args: list[str | int] = [
                write.counter or "",
                write.ttl,
                audit_arg(write.audit),
                max(0, write.retention),
                *_count_pairs(write.counts),
            ]
            return Call("record", self.keys(session_id), args)
        if counts:
            return self.set_counts_call(session_id, write.counter or "", write.counts, write.ttl)
        if write.audit is not None:
            return self.audit_call(session_id, write.audit, write.retention, write.ttl)
        return None

    def inspect_call(self, session_id: str) -> Call:
        return Call("repair", self.keys(session_id, stored=True), ["inspect"], "inspect")

    def parse_inspect(self, reply: Sequence[Any]) -> RawSession | None:
        types = dict(zip(SUFFIXES, (_text(t) for t in reply[0]), strict=True))
        if all(t == "none" for t in types.values()):
            return None
        flat = [_text(x) for x in reply[1]]
        ids = [_text(x) for x in reply[4]]
        return RawSession(
            types=types,
            meta=dict(zip(flat[::2], flat[1::2], strict=True)),
            records=[bytes(r) if not isinstance(r, str) else r.encode() for r in reply[2]],
            toks=[_text(t) for t in reply[3]],
            ids=dict(zip(ids[::2], ids[1::2], strict=True)),
            pins=[_text(p) for p in reply[5]],
            summary=(reply[6] if isinstance(reply[6], bytes) else _text(reply[6]).encode())
            if int(reply[7])
            else None,
            fingerprint=_text(reply[8]),
        )

    def repair_call(self, session_id: str, plan: RepairPlan, record: Mapping[str, Any]) -> Call:
        args: list[str | int] = ["apply", plan.fingerprint, encode_audit(record)]
        args.append("1" if plan.drop_summary else "0")
        args.append(len(plan.meta))
        for name, value in plan.meta.items():
            args += [name, value]
        args.append(len(plan.ids))
        args += [*plan.ids, *plan.toks]
        args.append(len(plan.pins))
        args += plan.pins
        return Call("repair", self.keys(session_id), args)

    # -- parsing ---------------------------------------------------------------

    def parse_append(
        self, session_id: str, messages: Sequence[NewMessage], reply: Any
    ) -> AppendResult:
        if isinstance(reply, bytes | str):  # the common case's one string (_fast.lua)
            return fast_reply(reply, messages)[0]
        count, flags = int(reply[0]), reply[1]
        if count == -2:  # the id of message `flags` (1-based) is stored with another
            raise MessageIdReusedError(session_id, messages[int(flags) - 1].message.id)
        if count < 0:
            raise SessionFullError(session_id, int(flags))
        # 2: stored by an earlier attempt of this same call whose reply was lost
        stored: tuple[str, ...]
        dups: tuple[str, ...]
        if len(messages) == 1 and len(flags) == 1:  # a turn's user message or reply
            only = messages[0].message.id
            stored, dups = ((only,), ()) if int(flags[0]) != 0 else ((), (only,))
        else:
            pairs = list(zip(messages, flags, strict=True))
            stored = tuple(m.message.id for m, f in pairs if int(f) != 0)
            dups = tuple(m.message.id for m, f in pairs if int(f) == 0)
        if len(reply) > 3:
            return AppendResult(
                stored, dups, count, _text(reply[2]) or None, _text(reply[3]) or None
            )
        return AppendResult(stored, dups, count, None, None)

    def parse_info(
        self, session_id: str, meta_flat: Sequence[Any], ttl: Any, audit_count: int = 0
    ) -> SessionInfo | None:
        if not meta_flat:
            return None
        it = iter(meta_flat)
        ttl_value = int(ttl) if ttl is not None else -1
        try:
            meta = {_text(k): _text(v) for k, v in zip(it, it, strict=True)}
            return SessionInfo(
                session_id=session_id,
                message_count=int(meta.get("count", 0)),
                token_total=int(meta.get("tokens", 0)),
                counter=meta.get("counter") or None,
                created_at=ms_to_datetime(int(meta.get("created", 0))),
                updated_at=ms_to_datetime(int(meta.get("updated", 0))),
                ttl_seconds=float(ttl_value) if ttl_value >= 0 else None,
                summary_version=int(meta.get("sumver", 0)),
                audit_count=audit_count,
            )
        except (ValueError, OverflowError, OSError) as exc:  # OSError: datetime out of range
            key = self.keys(session_id, stored=True)[0]
            raise CorruptRecordError(session_id, "meta", str(exc)[:200], key=key) from None

    def parse_window(
        self,
        session_id: str,
        new: Sequence[NewMessage],
        reply: Sequence[Any],
        options: WriteOptions | None = None,
    ) -> WindowFetch | WindowHit:
        if isinstance(reply, bytes | str):  # the common commit's one string: 'hit ...'
            appended, turn = fast_reply(_text(reply).removeprefix("hit "), new)
            return WindowHit(appended, turn, appended.token_after or "")
        if len(reply) == 1:
            self.parse_append(session_id, new, reply[0])  # raises SessionFullError
        if reply[0] == b"hit" or reply[0] == "hit":
            appended_hit = self.parse_append(session_id, new, reply[1])
            return WindowHit(appended_hit, int(reply[2]), _text(reply[3]))
        flags = [int(f) for f in reply[0]]
        meta, summary_raw, first, stored_count = reply[1], reply[2], int(reply[3]), int(reply[12])
        counted = options is not None and bool(options.counter)
        stop = tokens_or_none(int(reply[11])) if first > 0 else None
        info = self.parse_info(session_id, meta, reply[9])
        if info is None:
            from ctxguard.stores.memory_session import empty_window

            empty = empty_window(session_id).info
            return virtual_window(empty, 0, first, (), (), None, None, stop, new, flags, counted)
        recent = self._stored_run(session_id, first, reply[4], reply[5])
        pinned = tuple(
            StoredMessage(int(s), decode_message(session_id, int(s), r), _count_at(reply[8], i))
            for i, (s, r) in enumerate(zip(reply[6], reply[7], strict=True))
        )
        summary = check_summary(
            session_id,
            decode_summary(session_id, summary_raw or None),
            stored_count,
            self.keys(session_id)[5],
        )
        token = _text(reply[10]) or None
        return virtual_window(
            info, stored_count, first, recent, pinned, summary, token, stop, new, flags, counted
        )

    def corrupt_error(self, reply: str, keys: Sequence[str] = ()) -> CorruptRecordError | None:
        """The CorruptRecordError an error reply stands for, else None.

        A script answers ``CORRUPT <key> <what>`` when it finds a key it cannot
        use (it wrote nothing); Redis itself answers ``WRONGTYPE ...`` when a
        plain command meets a key of another type: the key is then the one the
        pipeline error names, or the command's only key.
        """
        # a pipeline's error starts with the command (maybe the whole script text)
        text = reply.rsplit("caused error: ", 1)[-1]
        found = _CORRUPT_REPLY.search(text)
        if found is not None:
            return self._corrupt_key(found[1], found[2].strip() or "is not what ctxguard wrote")
        if "WRONGTYPE" not in text:
            return None
        named = [k for k in keys if k in reply] or list(keys)
        key = named[0] if len(named) == 1 else " or ".join(named) or "(unknown)"
        return self._corrupt_key(key, "holds a value of the wrong type", named[:1])

    def _corrupt_key(
        self, key: str, what: str, candidates: Sequence[str] = ()
    ) -> CorruptRecordError:
        found = self.keyspace.session_id_from_key(candidates[0] if candidates else key)
        session_id, suffix = found if found is not None else ("?", "?")
        at = _RECORD_AT.search(what)
        if suffix == "msgs" and at is not None:  # one record (removed_tail): named as read names it
            return CorruptRecordError(session_id, int(at[1]), "not a record ctxguard wrote")
        return CorruptRecordError(session_id, suffix, what, key=key)

    def parse_read(self, session_id: str, reply: Sequence[Any]) -> list[StoredMessage]:
        return list(self._stored_run(session_id, int(reply[0]), reply[1], reply[2]))

    def token_read(self, session_id: str) -> tuple[Any, ...]:
        """The session's state token as one plain read (``state_token`` in _lib.lua):
        the meta fields it is made of, in one ``HMGET``."""
        return ("HMGET", self.keys(session_id, stored=True)[0], "epoch", "ver", "stamp")

    @staticmethod
    def parse_token(fields: Any) -> str:
        """The token :meth:`token_read` read ('' = no session)."""
        if not isinstance(fields, list) or len(fields) != 3 or not fields[0]:
            return ""
        epoch, ver, stamp = (_text(f) if f is not None else None for f in fields)
        return f"{epoch}:{ver or '0'}:{stamp or ''}"

    def parse_read_with_token(
        self, session_id: str, reply: Sequence[Any]
    ) -> tuple[list[StoredMessage], str]:
        """A read and the session's state token, in one script call ('' = no session)."""
        return self.parse_read(session_id, reply), _text(reply[3])

    def _removed(
        self, session_id: str, first: int, records: Sequence[Any], counts: Sequence[Any]
    ) -> tuple[StoredMessage, ...]:
        """What a retract or replace removed, parsed after its write: never an error.

        The script refused (CORRUPT, nothing written) a record that is not JSON with a
        string id; one that is but is not a message this version reads (a newer
        ctxguard's) was removed, and raising now would tell the caller its write failed
        (it would be retried). Its message is read as far as it goes, unvalidated
        (``Message.model_construct``), flagged ``metadata["ctxguard_undecodable"]``.
        """
        try:
            return self._stored_run(session_id, first, records, counts)
        except CorruptRecordError:
            pass
        found = []
        for i, raw in enumerate(records):
            try:
                message = decode_message(session_id, first + i, raw)
            except CorruptRecordError as exc:
                message = undecodable_message(raw, str(exc))
            found.append(StoredMessage(first + i, message, _count_at(counts, i)))
        return tuple(found)

    @staticmethod
    def _stored_run(
        session_id: str, first: int, records: Sequence[Any], counts: Sequence[Any]
    ) -> tuple[StoredMessage, ...]:
        # Fast path (every record decodes, every count is a number): one comprehension,
        # no per-record error handling. Anything else takes the careful path below,
        # which gives the same results and names the position of a corrupt record.
        try:
            if len(counts) == len(records):
                decode = decode_record
                return tuple(
                    [
                        StoredMessage(seq, decode(r), c if c >= 0 else None)
                        for seq, r, c in zip(
                            range(first, first + len(records)),
                            records,
                            [int(c) for c in counts],
                            strict=True,
                        )
                    ]
                )
        except (pydantic.ValidationError, ValueError, TypeError, InvalidInputError):
            pass
        # A record pushed by something other than ctxguard has no count beside it:
        # it still decodes (or fails) on its own, and its count is unknown.
        return tuple(
            StoredMessage(
                first + i,
                decode_message(session_id, first + i, r),
                _count_at(counts, i),
            )
            for i, r in enumerate(records)
        )

    def parse_audit(
        self,
        session_id: str,
        raw: Sequence[Any],
        contexts: Any = None,
        damaged: list[CorruptRecordError] | None = None,
    ) -> list[dict[str, Any]]:
        """The trail's records as written: each one expanded (``stores.audit_compact``)
        and each request record's context put back from the ``ctx`` hash
        (``contexts``: its HGETALL, or the error reading it); an undecodable record
        goes to ``damaged`` when that is a list (see ``decode_audits``)."""
        if isinstance(contexts, Exception):
            key = self.keys(session_id, stored=True)[8]
            detail = str(contexts).splitlines()[0][:200]
            raise CorruptRecordError(session_id, "ctx", detail, key=key) from None
        found = {_text(k): _text(v) for k, v in (contexts or {}).items()}
        records = [expand(r) for r in decode_audits(session_id, raw, damaged)]
        return resolve(records, found)
