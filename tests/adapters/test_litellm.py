"""The LiteLLM guardrail, with real LiteLLM objects, over memory:// and a real Redis.

The guardrail is built the way LiteLLM's proxy builds a custom guardrail from
``config.yaml`` (its ``LitellmParams`` dumped into the class's keyword arguments), and
its hooks are called the way the proxy calls them: ``should_run_guardrail`` for the
event, then ``async_pre_call_hook`` / ``async_post_call_success_hook`` /
``async_post_call_streaming_iterator_hook`` with a ``UserAPIKeyAuth``; replies are
real ``ModelResponse`` objects and streams from ``litellm.acompletion`` (its
``mock_response``, no network).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no cost-map download
litellm = pytest.importorskip("litellm")

from litellm.caching import DualCache  # noqa: E402
from litellm.types.guardrails import GuardrailEventHooks, LitellmParams  # noqa: E402
from litellm.types.proxy.auth.user_api_key_auth import UserAPIKeyAuth  # noqa: E402

from ctxguard import Guard  # noqa: E402
from ctxguard.adapters.litellm import (  # noqa: E402
    CtxGuardGuardrail,
    GuardrailRefusal,
    team_tenant,
)
from ctxguard.errors import ConfigError, CtxGuardError  # noqa: E402
from ctxguard.messages import Message  # noqa: E402
from tests.conftest import private_memory_url  # noqa: E402

from .conftest import LIMIT, RESERVE, assert_fits  # noqa: E402

NAME = "ctxguard-fit"
# what LiteLLM's registry leaves out of the class's keyword arguments
EXCLUDED = {"guardrail", "mode", "default_on", "stream_scope"}


def from_config(**params: Any) -> CtxGuardGuardrail:
    """The guardrail as ``initialize_custom_guardrail`` makes it from a config.yaml entry."""
    litellm_params = LitellmParams(
        guardrail="ctxguard.adapters.litellm.CtxGuardGuardrail",
        mode=["pre_call", "post_call"],
        default_on=True,
        **params,
    )
    extra = {
        k: v for k, v in litellm_params.model_dump(exclude_none=True).items() if k not in EXCLUDED
    }
    return CtxGuardGuardrail(
        guardrail_name=NAME,
        event_hook=litellm_params.mode,
        default_on=litellm_params.default_on,
        **extra,
    )


@pytest.fixture
async def guardrail(store_url: str, namespace: str) -> AsyncIterator[CtxGuardGuardrail]:
    g = from_config(
        url=store_url, namespace=namespace, counter="approx", limit=LIMIT, max_tokens=RESERVE
    )
    yield g
    await g.aclose()


@pytest.fixture
def reader(store_url: str, namespace: str) -> Any:
    guards: dict[str | None, Guard] = {}

    def read(session_id: str, tenant: str | None = None) -> list[dict[str, Any]]:
        if tenant not in guards:
            guards[tenant] = Guard(store_url, namespace=namespace, tenant=tenant, limit=LIMIT)
        return [s.message.to_openai() for s in guards[tenant].store.read(session_id)]

    yield read
    for g in guards.values():
        g.close()


def request(
    messages: list[dict[str, Any]],
    *,
    header: str | None = None,
    **body: Any,
) -> dict[str, Any]:
    """A request body as the proxy hands it to guardrails."""
    headers = {"content-type": "application/json"}
    if header is not None:
        headers["x-session-id"] = header
    return {
        "model": "local",
        "messages": messages,
        "litellm_call_id": str(uuid.uuid4()),
        "metadata": {},
        "proxy_server_request": {"url": "http://proxy/v1/chat/completions", "headers": headers},
        **body,
    }


async def pre_call(
    g: CtxGuardGuardrail, data: dict[str, Any], team: str | None = None
) -> dict[str, Any]:
    assert g.should_run_guardrail(data=data, event_type=GuardrailEventHooks.pre_call)
    out = await g.async_pre_call_hook(
        user_api_key_dict=UserAPIKeyAuth(team_id=team),
        cache=DualCache(),
        data=data,
        call_type="completion",
    )
    assert isinstance(out, dict)
    return out


async def call_model(data: dict[str, Any], reply: str = "ok", **mock: Any) -> Any:
    """A real LiteLLM call (mocked answer, no network) with the fitted request."""
    return await litellm.acompletion(
        model="openai/local",
        messages=data["messages"],
        max_tokens=data.get("max_tokens"),
        mock_response=reply,
        **mock,
    )


async def post_call(g: CtxGuardGuardrail, data: dict[str, Any], response: Any) -> Any:
    assert g.should_run_guardrail(data=data, event_type=GuardrailEventHooks.post_call)
    return await g.async_post_call_success_hook(
        data=data, user_api_key_dict=UserAPIKeyAuth(), response=response
    )


def words(n: int, tag: str) -> str:
    return " ".join(f"{tag}{i}" for i in range(n))


# -- session mode ---------------------------------------------------------------------------


async def test_session_turns_are_fitted_appended_and_recorded(
    guardrail: CtxGuardGuardrail, reader: Any
) -> None:
    system = {"role": "system", "content": "You are terse."}
    guard = guardrail.gateway.guard(None)
    for turn in range(10):
        new = [system] if turn == 0 else []
        new.append({"role": "user", "content": f"question {turn}: " + words(40, f"q{turn}-")})
        data = await pre_call(guardrail, request(new, header="s1"))
        sent = data["messages"]
        assert sent[-1] == new[-1]
        assert sent[0] == system  # pinned, even once older turns are left out
        assert data["max_tokens"] == RESERVE
        assert_fits(guard, [Message.from_openai(m) for m in sent], RESERVE)
        response = await call_model(data, reply=f"answer {turn}")
        assert await post_call(guardrail, data, response) is response
    stored = reader("s1")
    assert [m["role"] for m in stored] == ["system"] + ["user", "assistant"] * 10
    assert [m["content"] for m in stored if m["role"] == "assistant"] == [
        f"answer {t}" for t in range(10)
    ]
    assert len(sent) < len(stored)  # the last request left older turns out


async def test_a_retried_request_is_stored_once(guardrail: CtxGuardGuardrail, reader: Any) -> None:
    first = [{"role": "user", "content": "hello"}]
    await pre_call(guardrail, request(first, header="s2"))
    await pre_call(guardrail, request(first, header="s2"))  # the call failed; client retries
    data = await pre_call(guardrail, request(first, header="s2"))
    await post_call(guardrail, data, await call_model(data, reply="hi"))
    assert reader("s2") == [
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": "hi"},
    ]


async def test_tool_calls_in_the_reply_are_recorded(
    guardrail: CtxGuardGuardrail, reader: Any
) -> None:
    data = await pre_call(guardrail, request([{"role": "user", "content": "weather?"}], header="t"))
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
    }
    response = await call_model(data, reply="", mock_tool_calls=[call])
    await post_call(guardrail, data, response)
    reply = reader("t")[-1]
    assert reply["role"] == "assistant"
    assert reply["tool_calls"] == [call]
    # the tool result is accepted as the next new message, after the call it answers
    result = {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}
    data = await pre_call(guardrail, request([result], header="t"))
    assert data["messages"][-2:] == [reply, result]


async def test_a_streamed_reply_passes_through_and_is_recorded(
    guardrail: CtxGuardGuardrail, reader: Any
) -> None:
    data = await pre_call(guardrail, request([{"role": "user", "content": "tell"}], header="st"))
    stream = await litellm.acompletion(
        model="openai/local", messages=data["messages"], stream=True, mock_response="one two three"
    )
    assert guardrail.should_run_guardrail(data=data, event_type=GuardrailEventHooks.post_call)
    seen = []
    async for chunk in guardrail.async_post_call_streaming_iterator_hook(
        user_api_key_dict=UserAPIKeyAuth(), response=stream, request_data=data
    ):
        seen.append(chunk)
    text = "".join(c.choices[0].delta.content or "" for c in seen)
    assert text == "one two three"
    assert reader("st")[-1] == {"role": "assistant", "content": "one two three"}


async def test_a_shared_call_id_never_crosses_sessions(
    guardrail: CtxGuardGuardrail, reader: Any
) -> None:
    # clients choose their call id (x-litellm-call-id): two requests may carry the same one
    a = request([{"role": "user", "content": "from a"}], header="sa", litellm_call_id="same")
    b = request([{"role": "user", "content": "from b"}], header="sb", litellm_call_id="same")
    a = await pre_call(guardrail, a)
    b = await pre_call(guardrail, b)
    await post_call(guardrail, b, await call_model(b, reply="for b"))
    await post_call(guardrail, a, await call_model(a, reply="for a"))
    assert [m["content"] for m in reader("sa")] == ["from a", "for a"]
    assert [m["content"] for m in reader("sb")] == ["from b", "for b"]


async def test_session_id_sources_and_their_order(
    store_url: str, namespace: str, reader: Any
) -> None:
    g = from_config(
        url=store_url,
        namespace=namespace,
        counter="approx",
        limit=LIMIT,
        max_tokens=RESERVE,
        session_from_user=True,
    )
    try:
        say = [{"role": "user", "content": "x"}]
        await pre_call(g, request(say, header="h", litellm_session_id="l", user="u"))
        await pre_call(g, request(say, litellm_session_id="l", user="u", metadata={}))
        await pre_call(g, request(say, metadata={"session_id": "m"}, user="u"))
        await pre_call(g, request([{"role": "user", "content": "y"}], user="u"))
        assert [len(reader(s)) for s in ("h", "l", "m", "u")] == [1, 1, 1, 1]
    finally:
        await g.aclose()


async def test_user_is_not_a_session_unless_asked(
    guardrail: CtxGuardGuardrail, reader: Any
) -> None:
    # LiteLLM's proxy may fill `user` with the key's user id: not a conversation
    await pre_call(guardrail, request([{"role": "user", "content": "x"}], user="key-owner"))
    assert reader("key-owner") == []


async def test_the_keys_team_is_the_tenant(guardrail: CtxGuardGuardrail, reader: Any) -> None:
    say = [{"role": "user", "content": "mine"}]
    await pre_call(guardrail, request(say, header="same"), team="team-a")
    await pre_call(guardrail, request([{"role": "user", "content": "theirs"}], header="same"))
    assert reader("same", tenant="team-a") == say
    assert reader("same") == [{"role": "user", "content": "theirs"}]


async def test_no_team_id_names_another_teams_tenant(
    guardrail: CtxGuardGuardrail, reader: Any
) -> None:
    """A team id that is no tenant name is kept as ``team-<hash>``; a team whose id is
    that hash's text once shared its sessions (and read them back): it is hashed too."""
    odd = "acme corp"  # (a space: not a tenant name)
    hashed = team_tenant(odd)
    assert hashed.startswith("team-") and team_tenant(hashed) != hashed
    assert team_tenant("team-a") == "team-a"  # a plain name stays where it was
    await pre_call(guardrail, request([{"role": "user", "content": "acme's"}], header="s"), odd)
    await pre_call(guardrail, request([{"role": "user", "content": "x"}], header="s"), hashed)
    assert reader("s", tenant=hashed) == [{"role": "user", "content": "acme's"}]
    assert reader("s", tenant=team_tenant(hashed)) == [{"role": "user", "content": "x"}]


@pytest.mark.parametrize("configured", [None, "acme"])
async def test_a_team_named_like_the_no_team_tenant_has_sessions_of_its_own(
    store_url: str, namespace: str, reader: Any, configured: str | None
) -> None:
    """(a key without a team lands in the configured tenant, else ``default``: a team
    whose id was that name shared, and read back, the sessions of every key without a
    team). Such a team is hashed like a team id that is no tenant name; the keys of
    requests without a team do not move."""
    settings: dict[str, Any] = {"tenant": configured} if configured else {}
    g = from_config(
        url=store_url,
        namespace=namespace,
        counter="approx",
        limit=LIMIT,
        max_tokens=RESERVE,
        **settings,
    )
    no_team = configured or "default"
    try:
        await pre_call(g, request([{"role": "user", "content": "no team"}], header="s"))
        await pre_call(g, request([{"role": "user", "content": "team"}], header="s"), no_team)
    finally:
        await g.aclose()
    assert reader("s", tenant=no_team) == [{"role": "user", "content": "no team"}]
    hashed = team_tenant(no_team, no_team)
    assert hashed.startswith("team-") and hashed != no_team
    assert reader("s", tenant=hashed) == [{"role": "user", "content": "team"}]
    assert team_tenant("default", "acme") == "default"  # only the no-team name is hashed


# -- stateless mode ---------------------------------------------------------------------------


async def test_stateless_requests_are_fitted_and_nothing_is_kept(
    guardrail: CtxGuardGuardrail, store_url: str, namespace: str
) -> None:
    history: list[dict[str, Any]] = [{"role": "system", "content": "sys"}]
    for i in range(30):
        history.append({"role": "user", "content": words(20, f"u{i}-")})
        history.append({"role": "assistant", "content": words(20, f"a{i}-")})
    history.append({"role": "user", "content": "last"})
    data = await pre_call(guardrail, request(list(history)))
    sent = data["messages"]
    assert sent[0] == history[0] and sent[-1] == history[-1]
    assert len(sent) < len(history)
    assert sent[1]["role"] == "user"  # a window that leaves turns out starts on a user turn
    await post_call(guardrail, data, await call_model(data))
    g = Guard(store_url, namespace=namespace, limit=LIMIT)
    try:
        assert list(g.store.list_sessions()) == []
    finally:
        g.close()


# -- refusals -------------------------------------------------------------------------------


async def test_a_request_that_cannot_fit_is_a_400_and_stores_nothing(
    guardrail: CtxGuardGuardrail, reader: Any
) -> None:
    data = await pre_call(guardrail, request([{"role": "user", "content": "hi"}], header="r"))
    await post_call(guardrail, data, await call_model(data, reply="hello"))
    before = reader("r")
    huge = request([{"role": "user", "content": words(2000, "w")}], header="r")
    original = [dict(m) for m in huge["messages"]]
    with pytest.raises(GuardrailRefusal) as caught:
        await pre_call(guardrail, huge)
    err = caught.value
    assert isinstance(err, CtxGuardError)
    assert isinstance(err, litellm.exceptions.GuardrailRaisedException)
    assert err.status_code == 400
    assert err.type == "invalid_request_error"
    assert err.code == "context_length_exceeded"
    assert err.param == "messages"
    assert err.provider_specific_fields == {"ctxguard_code": "context_length_exceeded"}
    assert str(LIMIT) in err.message and str(RESERVE) in err.message
    assert reader("r") == before
    assert huge["messages"] == original and "max_tokens" not in huge


async def test_bad_input_is_a_400_naming_where(guardrail: CtxGuardGuardrail, reader: Any) -> None:
    with pytest.raises(GuardrailRefusal) as caught:
        await pre_call(guardrail, request([{"role": "user", "content": "x"}], header="bad\nid"))
    assert (caught.value.status_code, caught.value.param) == (400, "X-Session-Id")
    with pytest.raises(GuardrailRefusal) as caught:
        await pre_call(guardrail, request([{"role": "wizard", "content": "x"}], header="ok"))
    assert caught.value.status_code == 400
    assert caught.value.code == "invalid_message"
    assert reader("ok") == []


async def test_other_call_types_pass_untouched(guardrail: CtxGuardGuardrail) -> None:
    data = {"model": "e", "input": ["text"]}
    out = await guardrail.async_pre_call_hook(
        user_api_key_dict=UserAPIKeyAuth(), cache=DualCache(), data=data, call_type="embeddings"
    )
    assert out == {"model": "e", "input": ["text"]}


async def test_store_down_is_a_503_without_the_password() -> None:
    g = from_config(
        url="redis://:s3cretpw@127.0.0.1:1/0",
        counter="approx",
        limit=LIMIT,
        max_tokens=RESERVE,
        connect_timeout=0.5,
    )
    try:
        assert "s3cretpw" not in repr(g)
        with pytest.raises(GuardrailRefusal) as caught:
            await pre_call(g, request([{"role": "user", "content": "x"}], header="s"))
        assert caught.value.status_code == 503
        assert "s3cretpw" not in caught.value.message
        assert "s3cretpw" not in repr(caught.value)
        assert caught.value.__cause__ is None and caught.value.__suppress_context__
    finally:
        await g.aclose()


def test_settings_are_checked_when_the_proxy_starts() -> None:
    with pytest.raises(ConfigError, match="upstream"):
        from_config(url=private_memory_url(), counter="approx")
    with pytest.raises(ConfigError, match="max_tokens"):
        from_config(url=private_memory_url(), counter="approx", limit=100, max_tokens=0)
    g = from_config(
        url=private_memory_url(), counter="approx", limit="100"
    )  # os.environ/ gives text
    assert g.gateway.config.limit == 100


def test_the_readme_config_snippet_builds_the_guardrail(monkeypatch: pytest.MonkeyPatch) -> None:
    yaml = pytest.importorskip("yaml")
    from pathlib import Path

    readme = Path(__file__).resolve().parents[2] / "README.md"
    blocks = readme.read_text(encoding="utf-8").split("```yaml\n")[1:]
    snippet = next(b.split("```")[0] for b in blocks if "CtxGuardGuardrail" in b)
    entry = yaml.safe_load(snippet)["guardrails"][0]
    params = dict(entry["litellm_params"])
    assert params["guardrail"] == "ctxguard.adapters.litellm.CtxGuardGuardrail"
    params["url"] = private_memory_url()  # os.environ/CTXGUARD_URL, resolved by the proxy
    for key in ("guardrail", "mode", "default_on"):
        params.pop(key)
    g = from_config(**params)
    assert g.guardrail_name == NAME
    assert g.event_hook == ["pre_call", "post_call"]
    assert g.gateway.config.max_tokens == 512
    assert g.gateway.config.counter_spec == "vllm:http://vllm:8000"


async def test_the_same_request_through_the_hook_twice_is_stored_once(
    guardrail: CtxGuardGuardrail, reader: Any
) -> None:
    """LiteLLM's deployment-level hook (a guardrail named in the request's ``guardrails``)
    runs the pre-call hook again on the request dict it is handed; when that dict is one
    the hook already fitted (the same kwargs on a retry or fallback, or a proxy that did
    not mark the first run), its messages are the window sent, not new ones (the whole
    window was appended again and sent twice over)."""
    first = await pre_call(guardrail, request([{"role": "user", "content": "hello"}], header="d"))
    await post_call(guardrail, first, await call_model(first, reply="hi"))
    data = request([{"role": "user", "content": "again"}], header="d", guardrails=[NAME])
    data = await pre_call(guardrail, data)
    window = list(data["messages"])
    for _ in range(2):  # a retry, then a fallback
        out = await guardrail.async_pre_call_deployment_hook(data, litellm.CallTypes.acompletion)
        assert out is not None and out["messages"] == window
    await post_call(guardrail, data, await call_model(data, reply="ok"))
    assert [m["content"] for m in reader("d")] == ["hello", "hi", "again", "ok"]
