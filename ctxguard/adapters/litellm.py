"""A LiteLLM proxy guardrail that fits every chat request and keeps its session.

For teams already behind LiteLLM's proxy: ``CtxGuardGuardrail`` does what
``ctxguard serve`` does, inside the proxy, through the very same code (the gateway's
:class:`~ctxguard.serve.gateway.Gateway` state, its session-id checks, derived
message ids and error mapping):

* ``pre_call``: with a session id, the request's messages are the *new* ones; they are
  appended to the session and ``data["messages"]`` becomes the fitted window (pinned
  system, whole tool groups, summary, a user turn first). Without one, the request's
  own messages are fitted and nothing is kept. ``max_tokens`` is set to the reserve
  when the client gave none. A request that cannot fit is refused with a 400
  (``invalid_request_error``; LiteLLM's proxy puts the HTTP status in the body's
  ``code``, so ctxguard's code, ``context_length_exceeded``, is in
  ``provider_specific_fields.ctxguard_code``) and nothing is stored.
* ``post_call``: the reply (tool calls included) is appended with the usage the model
  reported; a streamed reply is assembled chunk by chunk and stored when the stream
  ends (a stream cut short stores nothing; the retry's derived ids store nothing twice).

The session id comes from, in this order: the ``X-Session-Id`` header,
``litellm_session_id`` (the body field, which LiteLLM also fills from its own session
headers and ``metadata.session_id``), ``metadata.session_id``, and the ``user`` field
only with ``session_from_user: true`` (the proxy may fill ``user`` with the API key's
user id, which would join every conversation of that key into one session). The tenant
is the key's team (``team_id``), else the configured ``tenant`` (else the store URL's, else
``default``); a team id that is no tenant name, or that equals that no-team tenant, is
kept as ``team-<hash>`` (see :func:`team_tenant`).

Settings (``litellm_params`` in the proxy's ``config.yaml``) are the gateway's:
``url`` (store), ``counter``, ``limit``, ``upstream`` (the vLLM server: default counter
through its ``/tokenize`` and default limit from its ``/v1/models``), ``model``,
``max_tokens`` (the reserve), ``safety_margin``, ``namespace``, ``tenant``,
``ttl_seconds``, ``connect_timeout``, ``commit`` (``prepare``, the default, stores the
new messages in ``pre_call``; ``with_reply`` stores them with the reply in ``post_call``,
in one step, so a call that fails or is cut short stores nothing).
"""

from __future__ import annotations

import hashlib
import re
import uuid
from collections import OrderedDict
from collections.abc import AsyncGenerator, Mapping
from dataclasses import dataclass
from typing import Any

from ctxguard._nocopy import NotPicklable
from ctxguard._secrets import redact_text
from ctxguard.adapters._shared import require
from ctxguard.errors import ConfigError, CtxGuardError, InvalidIdError
from ctxguard.guard.prepared import PreparedRequest
from ctxguard.guard.sync import Guard
from ctxguard.ids import validate_name
from ctxguard.messages import Message
from ctxguard.serve import identity
from ctxguard.serve.config import ServeConfig
from ctxguard.serve.gateway import Gateway
from ctxguard.serve.inbound import ChatRequest, check_storable, parse_chat
from ctxguard.serve.openai_errors import ApiError, from_ctxguard
from ctxguard.serve.outcomes import reply_not_stored
from ctxguard.serve.sse import ReplyAssembler, reply_of
from ctxguard.stores.urls import parse_store_url

require("litellm", "the LiteLLM guardrail", "litellm")

from litellm.exceptions import GuardrailRaisedException  # noqa: E402
from litellm.integrations.custom_guardrail import CustomGuardrail  # noqa: E402

# only used for the defaults of the settings no LiteLLM request reaches
_NO_UPSTREAM = "http://upstream.unset"
_HASHED_TEAM = re.compile(r"team-[0-9a-f]{24}")
CHAT_CALL_TYPES = frozenset({"completion", "acompletion"})
MAX_OPEN_TURNS = 4096  # turns between pre_call and post_call kept per proxy worker


def team_tenant(team: str, no_team: str = "default") -> str:
    """A team id as a tenant: itself when it is a tenant name, else ``team-<hash>``. A
    team id of that hashed form is hashed too, so no team can name another's tenant, and
    so is a team id equal to ``no_team``, the tenant of requests whose key has no team
    (a team named ``default`` shared their sessions)."""
    try:
        validate_name(team, "tenant (the key's team_id)")
    except InvalidIdError:
        pass
    else:
        if team != no_team and not _HASHED_TEAM.fullmatch(team):
            return team
    digest = hashlib.blake2b(team.encode("utf-8", "surrogatepass"), digest_size=12)
    return "team-" + digest.hexdigest()


_SETTINGS = (
    "url",
    "counter",
    "limit",
    "upstream",
    "model",
    "max_tokens",
    "safety_margin",
    "namespace",
    "tenant",
    "ttl_seconds",
    "connect_timeout",
    "upstream_api_key",
    "idempotency_window",
    "commit",
)


class GuardrailRefusal(CtxGuardError, GuardrailRaisedException):  # type: ignore[misc]
    """A request ctxguard refused, shaped for LiteLLM's proxy: ``status_code``,
    ``message``, ``type``, ``param`` and ``code`` become the OpenAI-shaped error answer."""

    def __init__(self, error: ApiError, guardrail_name: str | None) -> None:
        Exception.__init__(self, error.message)
        self.guardrail_name = guardrail_name
        self.status_code = error.status
        self.message = error.message
        self.type = error.type
        self.param = error.param
        self.code = error.code
        self.provider_specific_fields = {"ctxguard_code": error.code}
        # a verdict on the payload (it does not fit, it is malformed), not a failure
        self.blocked_content = error.status < 500


@dataclass
class _Turn:
    guard: Guard
    session_id: str
    reply_id: str
    prepared: PreparedRequest
    sent: list[dict[str, Any]]  # data["messages"] as pre_call left it


_TurnKey = tuple[str, str | None, str]  # (call id, tenant, session id)


class CtxGuardGuardrail(NotPicklable, CustomGuardrail):  # type: ignore[misc]
    """Fits chat requests in ``pre_call`` and stores replies in ``post_call``."""

    def __init__(self, session_from_user: bool = False, **kwargs: Any) -> None:
        settings = {name: kwargs.pop(name) for name in _SETTINGS if name in kwargs}
        if not isinstance(session_from_user, bool):
            raise ConfigError("session_from_user must be true or false")
        super().__init__(**kwargs)
        self.session_from_user = session_from_user
        self.gateway = Gateway(_config(settings))
        config = self.gateway.config
        # the tenant a key without a team lands in: no team id may map to it
        self._no_team = parse_store_url(config.url, config.namespace, config.tenant).tenant
        self._turns: OrderedDict[_TurnKey, _Turn] = OrderedDict()

    def __repr__(self) -> str:
        return f"CtxGuardGuardrail({self.guardrail_name!r}, {self.gateway.config!r})"

    # -- pre_call ---------------------------------------------------------------------

    async def async_pre_call_hook(
        self,
        user_api_key_dict: Any,
        cache: Any,
        data: dict[str, Any],
        call_type: Any,
    ) -> dict[str, Any]:
        """Fit ``data["messages"]`` (and keep the session); refuse what cannot fit."""
        if str(getattr(call_type, "value", call_type)) not in CHAT_CALL_TYPES:
            return data
        if self._fitted_here(data, user_api_key_dict):
            return data  # this very request again (see _fitted_here): already fitted and kept
        where = "X-Session-Id"
        chat: ChatRequest | None = None
        try:
            chat = parse_chat(data)
            session_id, where = self.session_id_of(data)
            if session_id is not None:
                check_storable(chat)
            tenant = self.tenant_of(user_api_key_dict)
            gw = self.gateway
            if session_id is None:
                guard = await gw.run(gw.stateless_guard)
                sid = gw.stateless_session()
                messages = [Message.from_openai(m) for m in chat.messages]
                try:
                    prepared = await gw.prepare(guard, sid, messages, chat.max_tokens, chat.tools)
                finally:
                    await gw.run(guard.store.delete, sid)
            else:
                guard = await gw.run(gw.guard, tenant)
                key = identity.idempotency_key_of(_headers(data))
                anchor = (
                    identity.idempotency_anchor(key)
                    if key is not None
                    else await gw.anchor(guard, session_id)
                )
                ids = identity.message_ids(tenant, session_id, anchor, chat.messages)
                messages = [
                    Message.from_openai(m, id=i) for m, i in zip(chat.messages, ids, strict=True)
                ]
                prepared = await gw.prepare(
                    guard, session_id, messages, chat.max_tokens, chat.tools
                )
                reply_id = identity.reply_id(ids, anchor)
                turn = _Turn(guard, session_id, reply_id, prepared, prepared.openai_messages())
                self._keep(data, tenant, turn)
        except ApiError as exc:
            raise GuardrailRefusal(exc, self.guardrail_name) from None
        except CtxGuardError as exc:
            error = from_ctxguard(
                exc,
                session_param=where or "X-Session-Id",
                output_param=chat.max_tokens_field if chat is not None else "max_tokens",
            )
            raise GuardrailRefusal(error, self.guardrail_name) from None
        data["messages"] = prepared.openai_messages()
        if chat.max_tokens is None:
            data["max_tokens"] = prepared.reserved_output
        return data

    def session_id_of(self, data: Mapping[str, Any]) -> tuple[str | None, str]:
        """The session id and where it came from; (None, "") when the request has none."""
        metadata = data.get("metadata")
        if metadata is not None and not isinstance(metadata, Mapping):
            metadata = None
        named = identity.header(_headers(data), identity.SESSION_HEADER, "X-Session-Id")
        candidates: list[tuple[object, str]] = [
            (named, "X-Session-Id"),
            (data.get("litellm_session_id"), "litellm_session_id"),
            ((metadata or {}).get("session_id"), "metadata.session_id"),
        ]
        if self.session_from_user:
            candidates.append((data.get("user"), "user"))
        return identity.pick_session_id(candidates)

    def tenant_of(self, user_api_key_dict: Any) -> str | None:
        """The key's team (never the tenant of keys without one), else the configured
        tenant."""
        team = getattr(user_api_key_dict, "team_id", None)
        if isinstance(team, str) and team:
            return team_tenant(team, self._no_team)
        return self.gateway.config.tenant

    # -- post_call --------------------------------------------------------------------

    async def async_post_call_success_hook(
        self, data: dict[str, Any], user_api_key_dict: Any, response: Any
    ) -> Any:
        """Store the reply (non-streaming) with its usage."""
        turn = self._take(data, user_api_key_dict)
        if turn is None:
            return response
        body = _as_dict(response)
        try:
            reply = reply_of(body)
        except (KeyError, TypeError, IndexError):
            return response  # not a chat completion: nothing to store
        await self._store(turn, reply, body.get("usage"))
        return response

    async def async_post_call_streaming_iterator_hook(
        self, user_api_key_dict: Any, response: Any, request_data: dict[str, Any]
    ) -> AsyncGenerator[Any, None]:
        """Pass every chunk on as it comes; store the assembled reply when the stream ends."""
        turn = self._take(request_data, user_api_key_dict)
        assembler = ReplyAssembler()
        async for chunk in response:
            if turn is not None:
                assembler.add_chunk(_as_dict(chunk))
            yield chunk
        if turn is not None and assembler.finished:  # a stream cut short stores no reply
            await self._store(turn, assembler.message(), assembler.usage)

    async def async_post_call_failure_hook(
        self,
        request_data: dict[str, Any],
        original_exception: Exception,
        user_api_key_dict: Any,
        traceback_str: str | None = None,
    ) -> None:
        """The call failed: forget the turn (its new messages stay stored once; with
        ``commit: with_reply`` none were stored)."""
        self._take(request_data, user_api_key_dict)

    async def _store(
        self, turn: _Turn, reply: dict[str, Any], usage: dict[str, Any] | None
    ) -> None:
        try:
            await self.gateway.complete(
                turn.guard, turn.session_id, reply, turn.reply_id, turn.prepared, usage
            )
        except CtxGuardError as exc:
            raise GuardrailRefusal(reply_not_stored(exc, False), self.guardrail_name) from None

    # -- turns between the hooks ---------------------------------------------------------

    # A turn is found again by the call id *and* the tenant and session the request names:
    # a client can choose its call id (``x-litellm-call-id``), so the id alone must never
    # let one request's reply land in another's session.

    def _keep(self, data: dict[str, Any], tenant: str | None, turn: _Turn) -> None:
        call_id = data.get("litellm_call_id")
        if not isinstance(call_id, str) or not call_id:
            call_id = data["litellm_call_id"] = str(uuid.uuid4())
        self._turns[(call_id, tenant, turn.session_id)] = turn
        while len(self._turns) > MAX_OPEN_TURNS:
            self._turns.popitem(last=False)

    def _take(self, data: Mapping[str, Any], user_api_key_dict: Any) -> _Turn | None:
        key = self._key(data, user_api_key_dict)
        return None if key is None else self._turns.pop(key, None)

    def _fitted_here(self, data: Mapping[str, Any], user_api_key_dict: Any) -> bool:
        """Whether ``data`` is a request this guardrail already fitted, its messages the
        window it sent. LiteLLM may hand the same request dict to the hook again (its
        deployment-level hook runs it on the router's kwargs, per retry or fallback): the
        window must not be taken for new messages and stored twice."""
        key = self._key(data, user_api_key_dict)
        turn = None if key is None else self._turns.get(key)
        return turn is not None and data.get("messages") == turn.sent

    def _key(self, data: Mapping[str, Any], user_api_key_dict: Any) -> _TurnKey | None:
        call_id = data.get("litellm_call_id")
        if not isinstance(call_id, str) or not self._turns:
            return None
        try:
            session_id, _ = self.session_id_of(data)
        except ApiError:
            return None
        return (call_id, self.tenant_of(user_api_key_dict), session_id or "")

    async def aclose(self) -> None:
        await self.gateway.aclose()


def _config(settings: dict[str, Any]) -> ServeConfig:
    upstream = settings.pop("upstream", None)
    if upstream is None and (settings.get("counter") is None or settings.get("limit") is None):
        raise ConfigError(
            "the ctxguard guardrail needs upstream (the model server, e.g. http://vllm:8000: "
            "its /tokenize counts, its /v1/models gives the limit) or both counter and limit"
        )
    for name in ("limit", "max_tokens", "safety_margin", "ttl_seconds", "idempotency_window"):
        value = settings.get(name)
        if isinstance(value, str) and value.strip().isdigit():
            settings[name] = int(value)  # config.yaml values from os.environ/ are strings
    try:
        return ServeConfig(upstream=upstream or _NO_UPSTREAM, **settings)
    except TypeError as exc:
        raise ConfigError(f"bad ctxguard guardrail setting: {redact_text(str(exc))}") from None


def _headers(data: Mapping[str, Any]) -> dict[str, str]:
    """The client's request headers as the proxy records them, names lowercased."""
    request = data.get("proxy_server_request")
    headers = request.get("headers") if isinstance(request, Mapping) else None
    if not isinstance(headers, Mapping):
        return {}
    return {str(k).lower(): v for k, v in headers.items() if isinstance(v, str)}


def _as_dict(value: Any) -> dict[str, Any]:
    if isinstance(value, dict):
        return value
    dump = getattr(value, "model_dump", None)
    out = dump() if callable(dump) else None
    return out if isinstance(out, dict) else {}
