"""The per-call argument checks import nothing once bound (issue 16, client CPU): a
``from`` import inside a check cost ~1 us a call, several calls a turn."""

from __future__ import annotations

import builtins
from typing import Any

import pytest

from ctxguard import _validate as v
from ctxguard.guard.prepared import PreparedRequest
from ctxguard.messages import Message
from ctxguard.stores.base import NewMessage, RecordWrite, WriteOptions


def test_the_hot_checks_import_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    message = Message(role="user", content="hi")
    new = [NewMessage(message, 5, message.to_record())]
    options = WriteOptions()
    write = RecordWrite(counter="c", audit={"kind": "request"})
    v.check_message_batch(iter([message]))  # binds the types, if nothing did yet
    imported: list[str] = []
    real = builtins.__import__

    def counting(name: str, *args: Any, **kwargs: Any) -> Any:
        imported.append(name)
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", counting)
    v.check_message_batch([message])
    v.check_message_batch(iter([message]))
    v.check_new_messages(new)
    v.check_options(options)
    v.check_store_args(new=new, options=options, write=write)
    v.check_prepared(None, "s")
    with pytest.raises(Exception, match="PreparedRequest"):
        v.check_prepared(object(), "s")
    monkeypatch.undo()
    assert imported == []
    assert v.PreparedRequest is PreparedRequest  # type: ignore[attr-defined]
