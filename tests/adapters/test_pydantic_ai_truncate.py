"""Pydantic AI with ``GuardConfig(oversized="truncate")``: what is sent is what was counted.

The guard cuts the middle out of a message over ``max_message_tokens``. A model
response in the history is one piece (its parts' text joined): the guard counted the
cut text, but the window gave back the caller's whole response, so the request went
over the limit. Now a response of text parts is sent with the cut text, its tool calls
kept; a response with parts that are not plain text (thinking, native tool calls,
files) cannot be cut part by part, so it is MessageTooLongError, never sent whole.
"""

from __future__ import annotations

import pytest

pytest.importorskip("pydantic_ai")

from pydantic_ai import messages as pai

from ctxguard.adapters.pydantic_ai import dump, fit_history, from_stored, to_pieces
from ctxguard.errors import MessageTooLongError
from ctxguard.guard import Guard, GuardConfig
from tests.conftest import private_memory_url

LONG = "word " * 1500  # ~1,500 approx tokens
LIMIT, RESERVE, CAP = 3000, 50, 200


@pytest.fixture
def guard() -> Guard:
    config = GuardConfig(max_message_tokens=CAP, oversized="truncate")
    return Guard(private_memory_url(), limit=LIMIT, counter="approx", config=config)


def history(*parts: pai.ModelResponsePart) -> list[pai.ModelMessage]:
    return [
        pai.ModelRequest(parts=[pai.UserPromptPart("hi")]),
        pai.ModelResponse(parts=list(parts)),
        pai.ModelRequest(parts=[pai.ToolReturnPart("f", "ok", tool_call_id="c1")]),
    ]


def sent_chars(message: pai.ModelMessage) -> int:
    return sum(len(str(getattr(p, "content", ""))) for p in message.parts)


def test_a_long_text_response_is_sent_cut(guard: Guard) -> None:
    call = pai.ToolCallPart("f", {"a": 1}, tool_call_id="c1")
    fitted = fit_history(guard, history(pai.TextPart(LONG), call), max_tokens=RESERVE)
    response = fitted.messages[1]
    assert isinstance(response, pai.ModelResponse)
    assert sent_chars(response) < len(LONG) / 2
    assert "removed by ctxguard" in response.parts[0].content  # type: ignore[union-attr]
    assert response.parts[-1] == call  # the call its result answers is kept
    counted = guard.counter.count_request(fitted.prepared.messages)
    assert counted + RESERVE <= LIMIT and fitted.prepared.tokens <= LIMIT


@pytest.mark.parametrize(
    "part",
    [pai.ThinkingPart(LONG), pai.NativeToolCallPart("web_search", {"q": LONG}, tool_call_id="n")],
    ids=["thinking", "native-call"],
)
def test_a_long_response_of_other_parts_is_refused_not_sent_whole(
    guard: Guard, part: pai.ModelResponsePart
) -> None:
    call = pai.ToolCallPart("f", {"a": 1}, tool_call_id="c1")
    with pytest.raises(MessageTooLongError):
        fit_history(guard, history(part, pai.TextPart("ok"), call), max_tokens=RESERVE)


def test_a_long_thinking_response_is_still_stored_whole(guard: Guard) -> None:
    """Stored (the capability's session), the message rides whole beside its piece, so
    the piece may be cut: nothing is refused and nothing is lost."""
    response = pai.ModelResponse(parts=[pai.ThinkingPart(LONG), pai.TextPart("ok")])
    guard.append("s", to_pieces([response], keep=True).messages)
    assert [dump(m) for m in from_stored([s.message for s in guard.store.read("s")])] == [
        dump(response)
    ]
