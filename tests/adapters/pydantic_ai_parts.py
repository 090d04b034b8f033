"""One example of every Pydantic AI message part (tests/adapters/test_pydantic_ai.py)."""

from __future__ import annotations

import dataclasses
import typing
from datetime import UTC, datetime
from typing import Any

from pydantic_ai import messages as pai
from pydantic_ai._deferred_capabilities import LoadCapabilityCallPart, LoadCapabilityReturnPart
from pydantic_ai._tool_search import (
    NativeToolSearchCallPart,
    NativeToolSearchReturnPart,
    ToolSearchCallPart,
    ToolSearchReturnPart,
)

T = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
PNG = b"\x89PNG\r\n\x1a\n" + b"\0" * 8

REQUEST_PARTS: list[Any] = [
    pai.SystemPromptPart("You are terse.", timestamp=T),
    pai.UserPromptPart("plain text", timestamp=T),
    pai.UserPromptPart(
        [
            "look",  # (images and files: tests/adapters/test_media_parts.py)
            pai.TextContent("at this"),
            pai.CachePoint(),
        ],
        timestamp=T,
    ),
    pai.ToolReturnPart("weather", "18C", tool_call_id="call_a", timestamp=T),
    ToolSearchReturnPart(tool_call_id="call_s", content={"discovered_tools": []}, timestamp=T),
    LoadCapabilityReturnPart("call_l", content={"message": "loaded"}, timestamp=T),
    pai.RetryFeedbackPart("try again", retry=pai.RetryInfo("no_output"), timestamp=T),
    pai.SpeechPart(speaker="user", transcript="spoken words"),
    pai.ToolAvailabilityDeltaPart(tools_added=["weather"]),
    pai.CapabilityLoadDeltaPart(loaded=["web"]),
    pai.ModelSettingsDeltaPart(settings={"thinking": "high"}),
    pai.InstructionDeltaPart(id=None, content="new rule"),
    pai.InstructionBaselinePart(instructions=[]),
    pai.CompactionPart("summary of earlier turns"),
]

if hasattr(pai, "DataCapabilityPart"):  # Pydantic AI 2.78+: capability parts

    @dataclasses.dataclass(repr=False, kw_only=True)
    class WeatherNote(pai.DataCapabilityPart[str], namespace="tests", tag="weather"):
        """Data a capability tells the model mid-conversation."""

    @dataclasses.dataclass(repr=False, kw_only=True)
    class HouseRule(pai.InstructionCapabilityPart, namespace="tests"):
        """The application's own instruction."""

    REQUEST_PARTS += [
        WeatherNote(content="18C in Paris", source=pai.UserSource(), timestamp=T, record_id="r1"),
        HouseRule(content="Answer in French.", source=pai.OperatorSource(), timestamp=T),
    ]

RESPONSE_PARTS: list[Any] = [
    pai.TextPart("hello"),
    pai.ToolCallPart("weather", {"city": "Paris"}, tool_call_id="call_a"),
    ToolSearchCallPart(args={"queries": ["x"]}, tool_call_id="call_s"),
    LoadCapabilityCallPart("call_l", args={"id": "web"}),
    pai.NativeToolCallPart("web_search", {"q": "x"}, tool_call_id="n1", provider_name="openai"),
    NativeToolSearchCallPart(args={"queries": ["y"]}, tool_call_id="n2"),
    pai.NativeToolReturnPart(
        "web_search", {"hits": 1}, tool_call_id="n1", timestamp=T, provider_name="openai"
    ),
    NativeToolSearchReturnPart(tool_call_id="n2", content={"discovered_tools": []}, timestamp=T),
    pai.ThinkingPart("let me think", signature="sig", provider_name="anthropic"),
    pai.CompactionPart("compacted", provider_name="anthropic"),
    pai.FilePart(pai.BinaryContent(PNG, media_type="image/png")),
    pai.SpeechPart(speaker="assistant", transcript="said aloud"),
]

# Deprecated and upgraded by Pydantic AI itself on load (to a tool return or retry feedback).
NOT_ROUND_TRIPPED = {pai.RetryPromptPart}


def union_members(union: Any) -> set[type[Any]]:
    """The part classes of Pydantic AI's ``ModelRequestPart`` / ``ModelResponsePart``."""
    out: set[type[Any]] = set()
    for member in typing.get_args(typing.get_args(union)[0]):
        kind = typing.get_args(member)[0]
        while typing.get_origin(kind) is typing.Annotated:
            kind = typing.get_args(kind)[0]
        out.add(kind)
    return out


def as_message(part: Any) -> pai.ModelMessage:
    if any(part is p for p in REQUEST_PARTS):
        return pai.ModelRequest(parts=[part], timestamp=T)
    return pai.ModelResponse(parts=[part], timestamp=T)
