"""A LlamaIndex memory or chat store never shows a password its fields were given:
not the store URL's written into the fields directly (``CtxGuardMemory(store=url)``,
``from_dict`` of a hand-written dict), not a counter spec's (``vllm:http://u:pw@h``),
in its repr, ``to_dict``, ``model_dump_json`` or pickle; it still works with them.

(The counter spec was kept as given, and a store URL given as a field too: the repr
and every serialisation held the password.)
"""

from __future__ import annotations

import json
import pickle
from collections.abc import Callable, Iterator
from typing import Any

import pytest

pytest.importorskip("llama_index.core")

from faults.servers import RedisServer
from llama_index.core.llms import ChatMessage

from ctxguard import ConfigError
from ctxguard.adapters import _llamaindex_fields
from ctxguard.adapters.llamaindex import CtxGuardChatStore, CtxGuardMemory
from tests.conftest import private_memory_url

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]
STORE_PW = "QJ-store-ZXW"
COUNTER_PW = "QJ-counter-ZXW"
COUNTER = f"vllm:http://admin:{COUNTER_PW}@127.0.0.1:1"


@pytest.fixture(scope="module")
def auth_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("li-auth"), ["--requirepass", STORE_PW]).start()
    yield server
    server.stop(kill=True)


def shown(obj: Any) -> str:
    return "\n".join([repr(obj), str(obj), json.dumps(obj.to_dict()), obj.model_dump_json()]) + str(
        pickle.dumps(obj)
    )


BUILDS: dict[str, Callable[[dict[str, Any]], Any]] = {
    "memory fields": lambda f: CtxGuardMemory(**f),
    "memory from_dict": lambda f: CtxGuardMemory.from_dict(f),
    "memory from_defaults": lambda f: CtxGuardMemory.from_defaults(f.pop("store"), **f),
    "chat store fields": lambda f: CtxGuardChatStore(**f),
    "chat store model_validate": lambda f: CtxGuardChatStore.model_validate(f),
    "chat store url": lambda f: CtxGuardChatStore(f.pop("store"), **f),
}


@pytest.mark.parametrize("build", sorted(BUILDS))
def test_a_store_password_given_in_the_fields_works_and_never_shows(
    build: str, auth_redis: RedisServer, namespace: str
) -> None:
    url = f"redis://:{STORE_PW}@127.0.0.1:{auth_redis.port}/0"
    obj = BUILDS[build]({"store": url, "namespace": namespace, "limit": 400})
    assert STORE_PW not in shown(obj) and "***" in obj.store
    hello = [ChatMessage(role="user", content="hello")]
    if isinstance(obj, CtxGuardMemory):
        obj.put_messages(hello)
        assert [m.content for m in obj.get_all()] == ["hello"]
    else:
        obj.set_messages("k", hello)
        assert [m.content for m in obj.get_messages("k")] == ["hello"]
    assert STORE_PW not in shown(obj)
    obj.close()


@pytest.mark.parametrize("build", sorted(BUILDS))
def test_a_counter_specs_password_never_shows(build: str, monkeypatch: pytest.MonkeyPatch) -> None:
    obj = BUILDS[build]({"store": private_memory_url(), "counter": COUNTER, "limit": 400})
    assert COUNTER_PW not in shown(obj) and obj.counter == "vllm:http://***@127.0.0.1:1"
    data = json.loads(json.dumps(obj.to_dict()))
    _llamaindex_fields._LIVE.clear()  # as if in another process: opened from the fields
    again = type(obj).from_dict(data)
    with pytest.raises(ConfigError, match="never serialised") as info:
        again.ref  # noqa: B018 - opens the guard
    assert COUNTER_PW not in str(info.value) and "\n" not in str(info.value)
