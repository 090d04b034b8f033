"""`ctxguard serve --workers 4` under 32 clients x 50 turns over 8 sessions, one store.

Every upstream request fits; every message is stored exactly once; each client's
turns keep their order inside its session, each reply right after its question in
that client's view (other clients of the same session interleave)."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterator

import httpx
import pytest

from ctxguard import Guard

from .processes import CliGateway
from .upstream import FakeVLLM

CLIENTS, TURNS, SESSIONS, WORKERS = 32, 50, 8, 4
RESERVE = 64


@pytest.fixture(params=["redis_url", "cluster_url"])
def store_url(request: pytest.FixtureRequest) -> str:
    return str(request.getfixturevalue(request.param))


@pytest.fixture
def cli_gateway(store_url: str, namespace: str, vllm: FakeVLLM) -> Iterator[CliGateway]:
    gateway = CliGateway(
        "--upstream",
        vllm.url,
        "--url",
        store_url,
        "--namespace",
        namespace,
        "--workers",
        str(WORKERS),
        "--max-tokens",
        str(RESERVE),
    )
    yield gateway
    gateway.stop()


def run_client(url: str, client: int) -> list[int | str]:
    session = f"s{client % SESSIONS}"
    statuses: list[int | str] = []
    with httpx.Client(timeout=60) as http:
        for turn in range(TURNS):
            body = {
                "model": "m",
                "messages": [{"role": "user", "content": f"c{client} t{turn} " + "pad " * 20}],
                "stream": client % 2 == 1,
            }
            response = http.post(
                url + "/v1/chat/completions", json=body, headers={"X-Session-Id": session}
            )
            ok = response.status_code == 200
            statuses.append(200 if ok else f"{response.status_code} {response.text[:300]}")
    return statuses


@pytest.mark.slow
def test_many_clients_many_workers_nothing_lost_or_duplicated(
    cli_gateway: CliGateway, vllm: FakeVLLM, store_url: str, namespace: str
) -> None:
    vllm.max_model_len = 2048
    with concurrent.futures.ThreadPoolExecutor(CLIENTS) as pool:
        results = list(pool.map(lambda c: run_client(cli_gateway.url, c), range(CLIENTS)))
    failed = [s for statuses in results for s in statuses if s != 200]
    assert failed == []
    assert len(vllm.requests) == CLIENTS * TURNS
    assert all(p + RESERVE <= 2048 for p in vllm.prompt_tokens)
    assert any(len(r["messages"]) < 2 * TURNS for r in vllm.requests[-SESSIONS:])

    guard = Guard(store_url, limit=4096, namespace=namespace)
    try:
        for index in range(SESSIONS):
            messages = [s.message for s in guard.store.read(f"s{index}")]
            assert len(messages) == 2 * TURNS * (CLIENTS // SESSIONS)
            texts = [str(m.content).split(" pad")[0] for m in messages]
            assert len(set(m.id for m in messages)) == len(messages)
            for client in range(index, CLIENTS, SESSIONS):
                questions = [t for t in texts if t.startswith(f"c{client} ")]
                assert questions == [f"c{client} t{turn}" for turn in range(TURNS)]
                replies = [i for i, t in enumerate(texts) if t.startswith(f"echo: c{client} ")]
                assert len(replies) == TURNS
                asked = [texts.index(f"c{client} t{turn}") for turn in range(TURNS)]
                for turn, position in enumerate(replies):
                    assert texts[position] == f"echo: c{client} t{turn}"
                    assert asked[turn] < position  # the reply after its question ...
                    if turn + 1 < TURNS:
                        assert position < asked[turn + 1]  # ... and before the next one
    finally:
        guard.close()
