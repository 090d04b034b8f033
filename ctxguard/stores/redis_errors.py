"""How a redis-py error becomes a ctxguard error, for the sync and async Redis stores.

Which errors are worth a retry (:data:`RETRYABLE`), where a connection failed
(:func:`connection_phase`: tls, connect, read or lost, read from the exception
chain and the frames it passed), the one-line message saying so without the
URL's secrets (:func:`wrap_error`), and what redis-py raises from its own
internals when a connection is torn down under a call
(:data:`CLIENT_INTERNAL_ERRORS`, :func:`raised_in_client`).
"""

from __future__ import annotations

import ssl

import redis
from redis.exceptions import (
    AuthenticationError,
    ClusterDownError,
    RedisClusterException,
    RedisError,
    ResponseError,
    TryAgainError,
)

from ctxguard._secrets import forget, forget_in_chain, redact_text
from ctxguard.errors import ConnectionPhase, StoreConnectionError, StoreError
from ctxguard.stores.urls import StoreURL

RETRYABLE = (redis.ConnectionError, redis.TimeoutError, ClusterDownError, TryAgainError)


def wrap_error(
    exc: RedisError | RedisClusterException,
    what: str,
    where: str,
    url: StoreURL | None = None,
    attempts: int = 1,
) -> StoreError:
    # RedisClusterException is redis-py's "no node of the cluster can be reached".
    # redis-py's own texts hold host:port at most (never the URL), and the messages
    # below are ctxguard's own; but a server's answer may quote what it was sent: one
    # that knows no AUTH (Redis 5 answering HELLO, a proxy) sends the password back,
    # into this error, the chain under it (a traceback) and an error tracker.
    secrets = url.secret_values if url is not None else ()
    forget_in_chain(exc, secrets)
    said = redact_text(forget(str(exc), secrets), limit=300)
    if isinstance(exc, AuthenticationError):
        return StoreConnectionError(
            f"{what} failed: {where} refused the credentials ({type(exc).__name__}); "
            "check the user name and password in the store URL",
            phase="connect",
        )
    if isinstance(exc, (*RETRYABLE, RedisClusterException)):
        phase = connection_phase(exc)
        tried = f"; tried {attempts} times (RetryPolicy)" if attempts > 1 else ""
        return StoreConnectionError(
            f"{what} failed: {_connection_problem(exc, phase, where, url)}{tried}", phase=phase
        )
    if isinstance(exc, ResponseError) and connection_phase(exc) == "connect":
        # the handshake (AUTH, HELLO, SELECT) was refused: our command never went out
        return StoreConnectionError(
            f"{what} failed: {where} refused the connection handshake (AUTH, HELLO or "
            f"SELECT: {said.strip()}); is it a Redis server that takes these, with that "
            "database? nothing was sent, safe to retry",
            phase="connect",
        )
    return StoreError(f"{what} failed on {where}: {type(exc).__name__}: {said}")


# redis-py runs these while it opens a connection (TCP, TLS, AUTH/HELLO/SELECT):
# an error raised inside them means our command was never sent.
_CONNECT_FRAMES = frozenset({"connect_check_health", "on_connect_check_health", "_connect"})
_TLS_FRAMES = frozenset({"_wrap_socket_with_ssl", "do_handshake", "wrap_socket"})


def deadline_error(cut: BaseException, where: str) -> redis.TimeoutError:
    """The async store's operation deadline (``asyncio.timeout``) cut an attempt short:
    what redis-py would have said of it, the cut (``cut``, its cancellation and the frames
    it went through) as its cause, so that :func:`connection_phase` tells where it was.
    redis-py disconnects a connection whose command or handshake was cancelled, so no
    reply is left on a pooled connection for a later command to read."""
    frames = _frames(_chain(cut))
    connecting = "_connect" in frames and not frames & _HANDSHAKE_FRAMES
    said = "Timeout connecting to server" if connecting else f"Timeout reading from {where}"
    error = redis.TimeoutError(said)
    error.__cause__ = cut
    return error


# where redis-py reads the handshake's replies (5.x: on_connect; 6 on: on_connect_check_health)
_HANDSHAKE_FRAMES = frozenset({"on_connect", "on_connect_check_health"})


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    item: BaseException | None = exc
    while item is not None and item not in seen:
        seen.append(item)
        item = item.__cause__ or item.__context__
    return seen


def _frames(chain: list[BaseException]) -> set[str]:
    names: set[str] = set()
    for item in chain:
        tb = item.__traceback__
        while tb is not None:
            names.add(tb.tb_frame.f_code.co_name)
            tb = tb.tb_next
    return names


def connection_phase(exc: RedisError | RedisClusterException) -> ConnectionPhase:
    """Where the connection failed: see :class:`~ctxguard.errors.StoreConnectionError`."""
    chain = _chain(exc)
    frames = _frames(chain)
    if any(isinstance(e, ssl.SSLError) for e in chain) or frames & _TLS_FRAMES:
        return "tls"
    if frames & _CONNECT_FRAMES:
        return "connect"
    if isinstance(exc, RedisClusterException) and not isinstance(exc, RETRYABLE):
        return "connect"  # the cluster client could reach no startup node
    if isinstance(exc, redis.TimeoutError):
        # redis-py's words for a send the socket timeout cut short (sync and asyncio)
        if any(str(e).startswith("Timeout writing") for e in chain):
            return "write"
        return "read"
    return "lost"


def _connection_problem(
    exc: RedisError | RedisClusterException,
    phase: ConnectionPhase,
    where: str,
    url: StoreURL | None,
) -> str:
    connect_s = f"{url.connect_timeout:g} s" if url else "the connect timeout"
    read_s = f"{url.read_timeout:g} s" if url else "the read timeout"
    chain = _chain(exc)
    timed_out = any(isinstance(e, (redis.TimeoutError, TimeoutError)) for e in chain)
    nothing = "nothing was sent, safe to retry"
    if phase == "tls":
        bad_cert = next((e for e in chain if isinstance(e, ssl.SSLCertVerificationError)), None)
        if bad_cert is not None:
            return (
                f"TLS handshake with {where} failed: the server's certificate was not accepted "
                f"({bad_cert.verify_message}); set ssl_ca_certs in the URL; {nothing}"
            )
        if timed_out:
            return (
                f"TLS handshake with {where} got no answer within {read_s}: is this a TLS port? "
                f"{nothing}"
            )
        # (an SSLError raised by SSLContext itself, set_ciphers say, has no reason)
        reasons = (getattr(e, "reason", None) for e in chain if isinstance(e, ssl.SSLError))
        reason = next((r for r in reasons if r), "")
        shown = f" ({reason})" if reason else ""
        return f"TLS handshake with {where} failed{shown}: is this a TLS port? {nothing}"
    if phase == "connect":
        tls_hint = " or finish the TLS handshake" if url is not None and url.tls else ""
        handshake = "the connection or TLS handshake" if tls_hint else "the handshake"
        if timed_out and any(str(e).startswith("Timeout connecting") for e in chain):
            return (
                f"could not connect to {where}{tls_hint} within {connect_s} (connect timeout; "
                f"raise it with ?socket_connect_timeout=...); {nothing}"
            )
        if timed_out:
            return (
                f"{where} accepted the connection but did not answer {handshake} within "
                f"{read_s} (read timeout; raise it with ?socket_timeout=...): is it a Redis "
                f"server{_tls_question(url)}? {nothing}"
            )
        oserror = next((e for e in chain if isinstance(e, OSError) and e.strerror), None)
        if oserror is not None:
            return f"could not connect to {where}{tls_hint} ({oserror.strerror}); {nothing}"
        if isinstance(exc, RedisClusterException) and not isinstance(exc, RETRYABLE):
            return f"could not reach any node of {where}; {nothing}"
        return (
            f"{where} closed the connection during {handshake} ({type(exc).__name__}): "
            f"is it a Redis server{_tls_question(url)}? {nothing}"
        )
    if phase == "write":
        return (
            f"could not finish sending to {where} within {read_s}: the server stopped reading "
            "(busy or stalled; raise the timeout with ?socket_timeout=...); what was sent may "
            "still reach it, so the operation may or may not have run"
        )
    if phase == "read":
        return (
            f"no reply from {where} within {read_s} (read timeout; raise it with "
            "?socket_timeout=...); the operation may or may not have run"
        )
    return (
        f"lost the connection to {where} ({type(exc).__name__}); "
        "the operation may or may not have run"
    )


def _tls_question(url: StoreURL | None) -> str:
    if url is None:
        return ""
    return ", and is this a TLS port" if url.tls else " (a TLS port needs rediss://)"


# What redis-py (and the asyncio streams under it) raise from its own internals
# when a connection is torn down under a call, instead of a ConnectionError: for
# example AttributeError "'NoneType' object has no attribute 'writelines'" when
# a connection is closed while a command is being written on it.
CLIENT_INTERNAL_ERRORS = (
    AttributeError,
    TypeError,
    KeyError,
    IndexError,
    ValueError,
    RuntimeError,
    EOFError,
    OSError,
)


def raised_in_client(exc: BaseException) -> bool:
    """True when ``exc`` was raised inside redis-py, not in ctxguard's own code."""
    tb = exc.__traceback__
    while tb is not None:
        module = str(tb.tb_frame.f_globals.get("__name__", ""))
        if module == "redis" or module.startswith("redis."):
            return True
        tb = tb.tb_next
    return False


def client_failure(exc: BaseException, what: str, where: str) -> StoreConnectionError:
    # The connection was dropped under the call: whether it was applied is unknown.
    return StoreConnectionError(
        f"{what} failed: the Redis client lost its connection to {where} mid-call "
        f"({type(exc).__name__} inside redis-py)",
        phase="lost",
    )
