"""LlamaIndex: a chat engine whose memory is a ctxguard session, every request within budget.

Runs offline: a scripted LLM stands in for one served by vLLM, the store is memory://
(use redis://... in production). ``CtxGuardMemory.get()`` is the guard's window of the
session: the system prompt pinned, the newest turns that fit; ``get_all()`` is
everything. The system prompt is kept in the memory, so it is counted exactly.

    python examples/llamaindex_chat.py
"""

from __future__ import annotations

from typing import Any

from llama_index.core.chat_engine import SimpleChatEngine
from llama_index.core.llms import ChatMessage, ChatResponse, MockLLM
from pydantic import Field

from ctxguard import Guard
from ctxguard.adapters.llamaindex import CtxGuardChatStore, CtxGuardMemory, to_ctxguard

# In production: limit=ServerLimit("http://vllm:8000"), counter="hf:/path/to/tokenizer".
guard = Guard("memory://", counter="approx", limit=500, max_tokens=96)


class ScriptedLLM(MockLLM):
    """Answers every question the same way (offline), remembering what it was sent."""

    sent: list[list[ChatMessage]] = Field(default_factory=list)

    def chat(self, messages: Any, **kwargs: Any) -> ChatResponse:
        self.sent.append(list(messages))
        answer = "Noted. Your order is on its way and should arrive within two days."
        return ChatResponse(message=ChatMessage(role="assistant", content=answer))


llm = ScriptedLLM()
memory = CtxGuardMemory.from_defaults(
    guard,
    session_id="user-42",
    max_tokens=96,
    chat_history=[ChatMessage(role="system", content="You are a concise support agent.")],
)
engine = SimpleChatEngine.from_defaults(llm=llm, memory=memory)
for turn in range(12):
    engine.chat(f"Question {turn}: where is my order 11{turn}, and when will it arrive?")

largest = max(guard.counter.count_request([to_ctxguard(m) for m in sent]) for sent in llm.sent)
print(f"Stored: {len(memory.get_all())} messages; last request sent {len(llm.sent[-1])}")
print(f"First message of every request: {sorted({sent[0].role.value for sent in llm.sent})}")
print(f"Largest request: {largest} tokens + 96 reserved <= 500")
print(f"Sessions in the chat store: {CtxGuardChatStore(guard).get_keys()}")
