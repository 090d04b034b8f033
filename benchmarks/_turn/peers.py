"""The peers of bench_turn: LangChain and LlamaIndex on the same Redis (peers.md §5)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import redis
import redis.asyncio as aredis

from _turn.systems import System, delete_prefix
from _turn.workload import PROMPT_BUDGET, REPLY_PRIMING, Cl100k, Outcome, SizeData


class LangChain(System):
    """langchain-community RedisChatMessageHistory + trim_messages (peers.md §5)."""

    name = "langchain"

    def __init__(self, url: str, prefix: str, tok: Cl100k) -> None:
        from langchain_community.chat_message_histories import RedisChatMessageHistory
        from langchain_core.messages import (
            AIMessage,
            HumanMessage,
            SystemMessage,
            message_to_dict,
            trim_messages,
        )

        self._history_cls = RedisChatMessageHistory
        self.AIMessage, self.HumanMessage, self.SystemMessage = (
            AIMessage,
            HumanMessage,
            SystemMessage,
        )
        self.message_to_dict, self.trim_messages = message_to_dict, trim_messages
        self.url, self.prefix, self.tok = url, f"{prefix}:lc:", tok
        self.client = redis.Redis.from_url(url)
        self.histories: dict[str, Any] = {}
        roles = {"system": "system", "human": "user", "ai": "assistant"}

        def count(messages: Sequence[Any]) -> int:
            return sum(tok.message(roles.get(m.type, "user"), m.content) for m in messages)

        self.count = count

    def _history(self, session: str) -> Any:
        if session not in self.histories:
            h = self._history_cls(session, url=self.url, key_prefix=self.prefix)
            h.redis_client.close()
            h.redis_client = self.client  # one connection pool for every session
            self.histories[session] = h
        return self.histories[session]

    def load(self, data: SizeData, session: str) -> None:
        types = {"system": self.SystemMessage, "user": self.HumanMessage}
        records = [
            json.dumps(self.message_to_dict(types.get(m["role"], self.AIMessage)(m["content"])))
            for m in data.history
        ]
        key = self._history(session).key
        pipe = self.client.pipeline(transaction=False)
        for i in range(0, len(records), 1000):
            pipe.lpush(key, *records[i : i + 1000])  # LPUSH: newest first, like add_message
        pipe.execute()

    def turn(self, session: str, user: dict[str, str], reply: dict[str, str]) -> Outcome:
        history = self._history(session)
        history.add_message(self.HumanMessage(user["content"]))
        window = self.trim_messages(
            history.messages,
            max_tokens=PROMPT_BUDGET - REPLY_PRIMING,
            token_counter=self.count,
            strategy="last",
            include_system=True,
            start_on="human",
        )
        history.add_message(self.AIMessage(reply["content"]))
        roles = {"system": "system", "human": "user", "ai": "assistant"}
        sent = [(roles[m.type], m.content) for m in window]
        return Outcome(sent, REPLY_PRIMING + self.count(window), 0, PROMPT_BUDGET)

    def cleanup(self) -> None:
        delete_prefix(self.client, self.prefix.rstrip(":"))
        self.client.close()


class LlamaIndex(System):
    """RedisChatStore + ChatMemoryBuffer; the system prompt goes in initial_token_count."""

    name = "llamaindex"

    def __init__(self, url: str, prefix: str, tok: Cl100k) -> None:
        from llama_index.core.base.llms.types import ChatMessage, MessageRole
        from llama_index.core.memory import ChatMemoryBuffer
        from llama_index.storage.chat_store.redis import RedisChatStore

        self.ChatMessage, self.MessageRole = ChatMessage, MessageRole
        self.buffer_cls = ChatMemoryBuffer
        self.client = redis.Redis.from_url(url)
        self.store = RedisChatStore(
            redis_url=url, redis_client=self.client, aredis_client=aredis.Redis.from_url(url)
        )
        self.prefix, self.tok = f"{prefix}:li", tok
        self.encode = tok.encoding.encode
        self.buffers: dict[str, Any] = {}

    def _buffer(self, session: str) -> Any:
        if session not in self.buffers:
            self.buffers[session] = self.buffer_cls.from_defaults(
                token_limit=PROMPT_BUDGET - REPLY_PRIMING,
                tokenizer_fn=self.encode,
                chat_store=self.store,
                chat_store_key=f"{self.prefix}:{session}",
            )
        return self.buffers[session]

    def load(self, data: SizeData, session: str) -> None:
        system, *rest = data.history
        key = f"{self.prefix}:{session}"
        records = [self.ChatMessage(role=m["role"], content=m["content"]) for m in rest]
        raw = [r.model_dump_json() for r in records]
        pipe = self.client.pipeline(transaction=False)
        for i in range(0, len(raw), 1000):
            pipe.rpush(key, *raw[i : i + 1000])
        sys_msg = self.ChatMessage(role="system", content=system["content"])
        pipe.rpush(f"{key}:system", sys_msg.model_dump_json())
        pipe.execute()
        self._buffer(session)

    def turn(self, session: str, user: dict[str, str], reply: dict[str, str]) -> Outcome:
        buffer = self._buffer(session)
        buffer.put(self.ChatMessage(role=self.MessageRole.USER, content=user["content"]))
        system = self.store.get_messages(f"{self.prefix}:{session}:system")[0]
        initial = len(self.encode(system.content))
        window = buffer.get(initial_token_count=initial)
        buffer.put(self.ChatMessage(role=self.MessageRole.ASSISTANT, content=reply["content"]))
        sent = [("system", system.content)] + [(str(m.role.value), m.content) for m in window]
        return Outcome(sent, None, 0, None)

    def cleanup(self) -> None:
        delete_prefix(self.client, self.prefix)
        self.client.close()
