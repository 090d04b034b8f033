"""Images, files and audio in a framework's message: passed on or refused, never counted as nothing.

ctxguard's counters count text; each refuses an OpenAI ``image_url`` part
(UncountableContentError). The adapters kept such content as the text beside it (a
LlamaIndex ``ImageBlock`` of bytes, a LangChain v1 "image"/"file" block, an Agents SDK
tool output's ``input_image``/``input_file`` or a screenshot, a Pydantic AI document or
a tool return's file), so it was stored and counted as nothing while the framework sent
it. Now an image a chat message can hold passes on as its ``image_url`` part (the
counter decides: these text counters refuse it), and anything else is refused with its
place, one line; either way nothing is stored.
"""

from __future__ import annotations

from typing import Any

import pytest

from ctxguard.errors import UncountableContentError
from ctxguard.guard import Guard
from ctxguard.messages import ImagePart

PNG = b"\x89PNG\r\n\x1a\n" + b"\0" * 8
B64 = "iVBORw0KGgoAAAAAAAAAAA=="


def check_refusal(exc: pytest.ExceptionInfo[UncountableContentError], *where: str) -> None:
    text = str(exc.value)
    assert "\n" not in text and ("keep it out" in text or "send text parts" in text), text
    for place in where:
        assert place in text, text


# -- LlamaIndex --------------------------------------------------------------------------


def llama_cases() -> list[tuple[Any, str]]:
    from llama_index.core.base.llms.types import AudioBlock, DocumentBlock
    from llama_index.core.llms import ChatMessage, ImageBlock, TextBlock

    def user(block: Any) -> ChatMessage:
        return ChatMessage(role="user", blocks=[TextBlock(text="a"), block])

    tool = ChatMessage(
        role="tool",
        blocks=[TextBlock(text="a"), ImageBlock(url="http://a/b.png")],
        additional_kwargs={"tool_call_id": "c1"},
    )
    return [
        (
            user(ImageBlock(image=PNG)),
            "content part 1 (image_url)",
        ),  # passed on; the text counter refuses it
        (user(AudioBlock(audio=b"RIFF")), "blocks[1] (AudioBlock)"),
        (user(DocumentBlock(data=b"%PDF-1.4")), "blocks[1] (DocumentBlock)"),
        (tool, "tool ChatMessage's blocks[1] (ImageBlock)"),
    ]


@pytest.mark.parametrize("case", range(4))
def test_llamaindex_media_is_refused_and_nothing_stored(guard: Guard, case: int) -> None:
    pytest.importorskip("llama_index.core")
    from llama_index.core.llms import ChatMessage

    from ctxguard.adapters.llamaindex import CtxGuardChatStore

    store = CtxGuardChatStore(guard)
    first = ChatMessage(role="user", content="first")
    store.add_message("s", first)
    message, where = llama_cases()[case]
    with pytest.raises(UncountableContentError) as exc:
        store.add_message("s", message)
    check_refusal(exc, where)
    assert [m.content for m in store.get_messages("s")] == ["first"]


def test_llamaindex_image_bytes_pass_on_as_a_data_url() -> None:
    pytest.importorskip("llama_index.core")
    from llama_index.core.llms import ChatMessage, ImageBlock, TextBlock

    from ctxguard.adapters._llamaindex_convert import to_ctxguard

    message = ChatMessage(role="user", blocks=[TextBlock(text="a"), ImageBlock(image=PNG)])
    content = to_ctxguard(message).content
    assert isinstance(content, tuple) and isinstance(content[1], ImagePart)
    assert content[1].image_url.url == f"data:image/png;base64,{B64}"


# -- OpenAI Agents SDK -------------------------------------------------------------------

CALL = {"type": "function_call", "call_id": "c1", "name": "look", "arguments": "{}"}


def output(*parts: dict[str, Any]) -> list[dict[str, Any]]:
    return [CALL, {"type": "function_call_output", "call_id": "c1", "output": list(parts)}]


AGENT_CASES: list[tuple[list[dict[str, Any]], str]] = [
    (
        output(
            {"type": "input_text", "text": "x"},
            {"type": "input_image", "image_url": "http://a/b.png"},
        ),
        "items[1].output[1] (input_image)",
    ),
    (
        output({"type": "input_file", "file_data": "JVBERi0=", "filename": "a.pdf"}),
        "items[1].output[0] (input_file)",
    ),
    (
        [
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "x"},
                    {"type": "input_file", "file_id": "f1"},
                ],
            }
        ],
        "items[0].content[1] (input_file)",
    ),
    (
        [
            {"type": "computer_call", "call_id": "c2", "action": {"type": "screenshot"}},
            {
                "type": "computer_call_output",
                "call_id": "c2",
                "output": {
                    "type": "computer_screenshot",
                    "image_url": f"data:image/png;base64,{B64}",
                },
            },
        ],
        "items[1].output (computer_screenshot)",
    ),
    (  # the generated image as base64: its JSON counted ~290k tokens per 1024x1024 PNG
        [
            {"role": "user", "content": "draw"},
            {"type": "image_generation_call", "id": "ig_1", "status": "completed", "result": B64},
        ],
        "items[1] (image_generation_call)",
    ),
]


@pytest.mark.parametrize("case", range(len(AGENT_CASES)))
async def test_agents_media_is_refused_and_nothing_stored(guard: Guard, case: int) -> None:
    pytest.importorskip("agents")
    from ctxguard.adapters.openai_agents import CtxGuardSession

    session = CtxGuardSession("s", guard)
    first = [{"role": "user", "content": "first"}]
    await session.add_items(first)
    items, where = AGENT_CASES[case]
    with pytest.raises(UncountableContentError) as exc:
        await session.add_items(items)
    check_refusal(exc, where)
    assert await session.get_items() == first


@pytest.mark.parametrize("case", range(len(AGENT_CASES)))
async def test_agents_media_in_a_model_call_is_refused(guard: Guard, case: int) -> None:
    """The model input filter refuses what the session refuses (it counted a tool
    output's image or file as nothing, and a generated image as its base64 text)."""
    pytest.importorskip("agents")
    from types import SimpleNamespace

    from agents.run_config import ModelInputData

    from ctxguard.adapters.openai_agents import CtxGuardSession

    fit = CtxGuardSession("s", guard).model_input_filter()
    items, where = AGENT_CASES[case]
    call = SimpleNamespace(model_data=ModelInputData(input=items, instructions="be brief"))
    with pytest.raises(UncountableContentError) as exc:
        await fit(call)
    check_refusal(exc, where.replace("items[", "input[", 1))


def test_agents_user_image_by_url_passes_on() -> None:
    pytest.importorskip("agents")
    from ctxguard.adapters.openai_agents import items_to_messages

    item = {"role": "user", "content": [{"type": "input_image", "image_url": "http://a/b.png"}]}
    [message] = items_to_messages([item])
    assert isinstance(message.content, tuple) and isinstance(message.content[0], ImagePart)


# -- LangChain ---------------------------------------------------------------------------

LC_CASES: list[tuple[str, dict[str, Any], str]] = [
    (
        "human",
        {"type": "image", "base64": B64, "mime_type": "image/png"},
        "content part 1 (image_url)",
    ),
    ("human", {"type": "image", "url": "https://x.test/a.png"}, "content part 1 (image_url)"),
    (
        "human",
        {"type": "file", "base64": "JVBERi0=", "mime_type": "application/pdf"},
        "content[1] (file block)",
    ),
    ("human", {"type": "image", "file_id": "f1"}, "content[1] (image block)"),
    (
        "human",
        {"type": "audio", "base64": "UklGRg==", "mime_type": "audio/wav"},
        "content[1] (audio block)",
    ),
    (
        "tool",
        {"type": "image_url", "image_url": {"url": "https://x.test/a.png"}},
        "tool message's content[1]",
    ),
]


@pytest.mark.parametrize("case", range(len(LC_CASES)))
def test_langchain_media_is_refused_and_nothing_stored(guard: Guard, case: int) -> None:
    pytest.importorskip("langchain_core")
    from langchain_core.messages import HumanMessage, ToolMessage

    from ctxguard.adapters.langchain import CtxGuardChatMessageHistory

    history = CtxGuardChatMessageHistory(guard, "s")
    history.add_messages([HumanMessage(content="first", id="m0")])
    kind, block, where = LC_CASES[case]
    content: list[Any] = [{"type": "text", "text": "a"}, block]
    message = (
        HumanMessage(content=content)
        if kind == "human"
        else ToolMessage(content=content, tool_call_id="c1")
    )
    with pytest.raises(UncountableContentError) as exc:
        history.add_messages([message])
    check_refusal(exc, where)
    assert [m.content for m in history.messages] == ["first"]


def test_langchain_v1_image_blocks_pass_on_as_image_parts() -> None:
    pytest.importorskip("langchain_core")
    from langchain_core.messages import HumanMessage

    from ctxguard.adapters.langchain import to_ctxguard, to_langchain

    message = HumanMessage(
        content=[
            {"type": "text", "text": "a"},
            {"type": "image", "base64": B64, "mime_type": "image/png"},
            {"type": "image", "url": "https://x.test/a.png"},
        ]
    )
    stored = to_ctxguard(message)
    assert isinstance(stored.content, tuple)
    urls = [p.image_url.url for p in stored.content if isinstance(p, ImagePart)]
    assert urls == [f"data:image/png;base64,{B64}", "https://x.test/a.png"]
    assert to_langchain(stored) == message  # the blocks themselves come back


# -- Pydantic AI -------------------------------------------------------------------------


def pai_cases() -> list[tuple[list[Any], str]]:
    from pydantic_ai import messages as pai

    call = pai.ModelResponse(parts=[pai.ToolCallPart("look", {}, tool_call_id="c1")])

    def user(item: Any) -> list[Any]:
        return [pai.ModelRequest(parts=[pai.UserPromptPart(["a", item])])]

    returned = pai.ToolReturnPart(
        "look", ["x", pai.BinaryContent(PNG, media_type="image/png")], tool_call_id="c1"
    )
    return [
        (user(pai.ImageUrl("https://x.test/a.png")), "content part 1 (image_url)"),
        (user(pai.BinaryContent(PNG, media_type="image/png")), "content part 1 (image_url)"),
        (
            user(pai.DocumentUrl("https://x.test/a.pdf")),
            "history[0].parts[0].content[1] (DocumentUrl)",
        ),
        (user(pai.AudioUrl("https://x.test/a.mp3")), "history[0].parts[0].content[1] (AudioUrl)"),
        (
            user(pai.BinaryContent(b"%PDF", media_type="application/pdf")),
            "content[1] (BinaryContent)",
        ),
        ([call, pai.ModelRequest(parts=[returned])], "history[1].parts[0] (ToolReturnPart)"),
    ]


@pytest.mark.parametrize("case", range(6))
def test_pydantic_ai_media_is_refused_and_nothing_stored(guard: Guard, case: int) -> None:
    pytest.importorskip("pydantic_ai")
    from ctxguard.adapters.pydantic_ai import CtxGuardCapability, to_pieces

    history, where = pai_cases()[case]
    capability = CtxGuardCapability(guard, session_id="s")
    with pytest.raises(UncountableContentError) as exc:
        guard.append("s", to_pieces(history, keep=True).messages)
    check_refusal(exc, where)
    assert capability.load() == []


def test_pydantic_ai_images_pass_on_as_image_parts() -> None:
    pytest.importorskip("pydantic_ai")
    from ctxguard.adapters.pydantic_ai import to_pieces

    history, _ = pai_cases()[1]
    [piece] = to_pieces(history).messages
    assert isinstance(piece.content, list | tuple)
    assert piece.content[1] == ImagePart.model_validate(
        {"image_url": {"url": f"data:image/png;base64,{B64}"}}
    )


def test_pydantic_ai_agent_run_with_a_document_stores_nothing(guard: Guard) -> None:
    pytest.importorskip("pydantic_ai")
    from pydantic_ai import Agent
    from pydantic_ai import messages as pai
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    from ctxguard.adapters.pydantic_ai import CtxGuardCapability

    def reply(messages: list[pai.ModelMessage], info: AgentInfo) -> pai.ModelResponse:
        return pai.ModelResponse(parts=[pai.TextPart("ok")])

    capability = CtxGuardCapability(guard, session_id="s")
    agent = Agent(FunctionModel(reply), capabilities=[capability])
    with pytest.raises(UncountableContentError):
        agent.run_sync(["read this", pai.DocumentUrl("https://x.test/a.pdf")])
    assert capability.load() == []


@pytest.mark.parametrize(
    "content",
    ["image", "in a dict", "in a list"],
)
def test_pydantic_ai_native_tool_file_counts_as_a_file_part_not_its_base64(
    guard: Guard, content: str
) -> None:
    """(a NativeToolReturnPart holding BinaryContent, an image generation tool's result,
    was counted as its JSON with the bytes in base64: 300 kB of image, ~100k tokens, could
    refuse the session) It is counted as a FilePart is: ``[file: <media type>]``."""
    pytest.importorskip("pydantic_ai")
    from pydantic_ai import messages as pai

    from ctxguard.adapters.pydantic_ai import CtxGuardCapability, to_pieces

    image = pai.BinaryContent(PNG + b"\x01" * 300_000, media_type="image/png")
    value: Any = {
        "image": image,
        "in a dict": {"revised_prompt": "a cat", "images": [image]},
        "in a list": ["a cat", image],
    }[content]
    history = [
        pai.ModelRequest(parts=[pai.UserPromptPart("draw a cat")]),
        pai.ModelResponse(
            parts=[
                pai.NativeToolCallPart("image_generation", {"prompt": "cat"}, tool_call_id="n1"),
                pai.NativeToolReturnPart("image_generation", value, tool_call_id="n1"),
                pai.TextPart("here it is"),
            ]
        ),
    ]
    pieces = to_pieces(history, keep=True).messages
    reply = pieces[-1].text
    assert "[file: image/png]" in reply and len(reply) < 1_000  # no base64 of 300 kB
    assert guard.counter.count_message(pieces[-1]) < 500
    guard.append("s", pieces)  # a limit of thousands of tokens: not refused
    loaded = CtxGuardCapability(guard, session_id="s").load()
    back = loaded[-1].parts[1].content  # the bytes themselves come back (as a BinaryImage:
    found = (
        back if content == "image" else (back["images"][0] if content == "in a dict" else back[1])
    )
    assert isinstance(found, pai.BinaryContent) and found.data == image.data  # Pydantic AI's)
