"""What guards ``srifty serve`` (issue #14): its settings, the Host check, the write token, the body limit and the
bounded heavy work.

One ASGI middleware (:class:`Guard`) runs before any route: a ``Host`` header the service does not answer to is a
400 (DNS rebinding), a write without the bearer token a 401 (403 when writes are off), a body over the limit a 413.
:class:`HeavyWork` runs rankings and predictions in a pool of ``max_concurrent`` threads: a request that finds every
thread busy and ``max_queued`` requests already waiting is a 429, one without an answer after
``request_timeout_s`` a 503, both with ``Retry-After``. A thread cannot be killed: after a 503 the work it started
finishes (it is bounded: see docs/service.md) and holds its slot until then, so memory stays bounded by
``max_concurrent`` of the largest allowed request.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import hmac
import json
import math
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from starlette.responses import JSONResponse

from predictor.documents.checks import check_int, check_number
from predictor.exceptions import ConfigError
from predictor.service.client import MAX_BODY_BYTES  # 1 MiB: room for a profile, bounded work (one figure)
from predictor.service.runs import RunTokens, is_run_token

LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")
OBSERVE, ISSUE_RUN = ("POST", "/v1/observations"), ("POST", "/v1/runs")
WRITES = frozenset({OBSERVE, ISSUE_RUN})
RUN_STATE = "srifty_run"  # the request's scope["state"] key of the run a run token was issued for
BUSY_RETRY_S = 2  # Retry-After of a 429: a slot frees when a ranking ends (the largest allowed takes seconds)


MIN_TOKEN_BYTES = 32  # secrets.token_urlsafe(32) gives 43


@dataclass(frozen=True)
class ServiceSettings:
    """How the service bounds its work and whom it answers (``srifty serve``'s options, same defaults).

    Args:
        max_body_bytes: a larger request body is a 413.
        max_concurrent: rankings and predictions computed at once (each in its own thread).
        max_queued: requests that may wait for a thread; one more is a 429.
        request_timeout_s: a ranking or prediction not answered by then (waiting included) is a 503.
        token: the bearer token that writes (``POST /v1/observations``) must carry; None: see
            ``allow_unauthenticated_writes``.
        allow_unauthenticated_writes: with no token, accept writes from anyone who reaches the port (else 403).
        host: the address the service is bound to; answered as a ``Host`` name besides 127.0.0.1, localhost, ::1.
        allowed_hosts: more ``Host`` names to answer (the names clients use to reach a service bound elsewhere).
        read_timeout_s: a request's head must arrive within this many seconds of the connection (or of the previous
            answer on it), and then its body within as many again: a 408 after that (the connection is closed).
        max_connections: connections open at once; one more is answered 503 and closed at once.
    """

    max_body_bytes: int = MAX_BODY_BYTES
    max_concurrent: int = 2
    max_queued: int = 64
    request_timeout_s: float = 60.0
    token: str | None = field(default=None, repr=False)
    allow_unauthenticated_writes: bool = False
    host: str = "127.0.0.1"
    allowed_hosts: tuple[str, ...] = ()
    read_timeout_s: float = 30.0
    max_connections: int = 256

    def __post_init__(self) -> None:
        owner = "ServiceSettings()"
        check_int(owner, "max_body_bytes", self.max_body_bytes, minimum=1)
        check_number(owner, "read_timeout_s", self.read_timeout_s, minimum=0, exclusive=True, maximum=3600)
        check_int(owner, "max_connections", self.max_connections, minimum=1, maximum=100_000)
        check_int(owner, "max_concurrent", self.max_concurrent, minimum=1, maximum=64)
        check_int(owner, "max_queued", self.max_queued, minimum=0, maximum=10_000)
        check_number(owner, "request_timeout_s", self.request_timeout_s, minimum=0, exclusive=True)
        if self.token is not None and (not isinstance(self.token, str) or not self.token.strip()):
            raise ConfigError(
                f"The 'token' parameter of {owner} must be a non-empty string or None. Got an empty one. "
                "Write a random token (e.g. `python -c 'import secrets; print(secrets.token_urlsafe(32))'`).",
                parameter="token",
                value="",
            )
        if self.token is not None and len(self.token.strip().encode()) < MIN_TOKEN_BYTES:
            raise ConfigError(
                f"The 'token' parameter of {owner} must be at least {MIN_TOKEN_BYTES} bytes (a guessable token lets "
                f"anyone steer the rankings). Got {len(self.token.strip().encode())}. Write a random one: "
                "`python -c 'import secrets; print(secrets.token_urlsafe(32))'`.",
                parameter="token",
                value=f"<{len(self.token.strip().encode())} bytes>",
            )
        object.__setattr__(self, "allowed_hosts", tuple(h.lower() for h in self.allowed_hosts))

    def host_names(self) -> frozenset[str]:
        """The ``Host`` names (port stripped) the service answers."""
        bound = () if self.host in ("0.0.0.0", "::", "") else (self.host.lower(),)
        return frozenset((*LOCAL_HOSTS, *bound, *self.allowed_hosts))


class SafeJSONResponse(JSONResponse):
    """JSON with non-ASCII escaped, so that text the client sent (a lone surrogate included) always renders."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, ensure_ascii=True, allow_nan=False, separators=(",", ":")).encode("ascii")


def error_response(
    loc: list[Any], message: str, kind: str, status: int = 422, headers: dict[str, str] | None = None, **extra: Any
) -> JSONResponse:
    """The service's one error shape: ``{"detail": [{"loc", "msg", "type", ...}]}``."""
    body = {"detail": [{"loc": loc, "msg": message, "type": kind, **extra}]}
    return SafeJSONResponse(body, status_code=status, headers=headers)


def _unauthorized(message: str) -> JSONResponse:
    """A 401 of the one error shape, with the challenge."""
    return error_response(
        ["header", "authorization"],
        message,
        "unauthorized",
        status=401,
        headers={"WWW-Authenticate": 'Bearer realm="srifty"'},
    )


class Guard:
    """ASGI middleware: Host check (400), write authorisation (401/403), body limit (413), in that order."""

    def __init__(self, app: Any, settings: ServiceSettings, runs: RunTokens) -> None:
        self.app, self.settings, self.runs = app, settings, runs
        self.hosts = settings.host_names()
        self.token = settings.token.encode() if settings.token is not None else None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        refusal = self._host(headers.get(b"host")) or self._write(scope, headers.get(b"authorization"))
        if refusal is None:
            refusal = self._length(headers.get(b"content-length"))
        if refusal is not None:
            await refusal(scope, receive, send)
            return
        seen, limit, timeout = 0, self.settings.max_body_bytes, self.settings.read_timeout_s
        deadline: float | None = None
        answered = False  # the guard answered (413, 408) while the app was reading the body: drop its own answer

        async def limited() -> dict[str, Any]:
            nonlocal seen, deadline, answered
            if answered:
                return {"type": "http.disconnect"}
            deadline = deadline or time.monotonic() + timeout  # the body's time counts from its first read
            try:
                message = await asyncio.wait_for(receive(), max(0.0, deadline - time.monotonic()))
            except asyncio.TimeoutError:
                refusal = self._stalled()
            else:
                seen += len(message.get("body", b""))
                if seen <= limit:  # chunked bodies have no Content-Length to check first: counted as they come
                    return message
                refusal = self._too_large()
            answered = True
            await refusal(scope, receive, send)
            return {"type": "http.disconnect"}  # the app stops reading; what it answers then is dropped

        async def guarded_send(message: dict[str, Any]) -> None:
            if not answered:
                await send(message)

        try:
            await self.app(scope, limited, guarded_send)
        except Exception:  # the app's reaction to the disconnect (FastAPI: 400 or an error) after the guard's answer
            if not answered:
                raise

    def _host(self, raw: bytes | None) -> JSONResponse | None:
        value = (raw or b"").decode("latin-1")
        name = value.lower()
        if name.startswith("["):  # [::1]:8000
            name = name[1:].split("]", 1)[0]
        elif name.count(":") == 1:
            name = name.split(":", 1)[0]
        if name in self.hosts:
            return None
        known = ", ".join(sorted(self.hosts))
        return error_response(
            ["header", "host"],
            f"Host {value!r} is not a name this service answers to ({known}); a page on another site may be "
            "trying to reach it through DNS rebinding. If clients reach it by that name, start it with "
            f"`srifty serve --allowed-host {name or 'NAME'}`.",
            "host_not_allowed",
            status=400,
        )

    def _write(self, scope: dict[str, Any], raw: bytes | None) -> JSONResponse | None:
        """A write needs the service's token; an observation may instead carry a run token (issue #36 M5), whose
        run it is then counted under (``scope["state"]["srifty_run"]``)."""
        route = (scope.get("method"), scope.get("path"))
        if route not in WRITES:
            return None
        scheme, _, given = (raw or b"").partition(b" ")
        given = given.strip()
        if scheme.lower() == b"bearer" and is_run_token(given.decode("latin-1")):
            return self._run_token(scope, route, given.decode("latin-1"))
        if self.token is None:
            if self.settings.allow_unauthenticated_writes:
                return None
            return error_response(
                ["header", "authorization"],
                "Writes are disabled: the service was started without a token. Start it with "
                "`srifty serve --token-file PATH` (or SRIFTY_SERVICE_TOKEN) and send 'Authorization: Bearer "
                "<token>', or with --allow-unauthenticated-writes on a machine you trust.",
                "writes_disabled",
                status=403,
            )
        if scheme.lower() == b"bearer" and hmac.compare_digest(given, self.token):
            return None
        what = "no Authorization header" if raw is None else "a wrong or malformed bearer token"
        return _unauthorized(
            f"This write needs the service's token; the request had {what}. Send 'Authorization: Bearer <token>' "
            "(ServiceClient(url, token=...) or SRIFTY_SERVICE_TOKEN in the client's environment)."
        )

    def _run_token(self, scope: dict[str, Any], route: tuple[Any, Any], token: str) -> JSONResponse | None:
        if route != OBSERVE:
            return error_response(
                ["header", "authorization"],
                "A run token may post observations of its run only; issuing runs (POST /v1/runs) needs the "
                "service's own token.",
                "forbidden",
                status=403,
            )
        try:
            run_id = self.runs.verify(token)
        except ConfigError as exc:
            return _unauthorized(
                f"The run token was refused: {exc}. Ask the service's owner for a new one (`srifty run-token "
                "--service URL`, with the service's token)."
            )
        scope["state"] = {**(scope.get("state") or {}), RUN_STATE: run_id}
        return None

    def _length(self, raw: bytes | None) -> JSONResponse | None:
        if raw is not None and (not raw.isdigit() or int(raw) > self.settings.max_body_bytes):
            return self._too_large()
        return None

    def _too_large(self) -> JSONResponse:
        limit = self.settings.max_body_bytes
        return error_response(
            ["body"],
            f"request body over {limit} bytes (srifty serve --max-body raises the limit)",
            "too_large",
            status=413,
            headers={"Connection": "close"},  # the rest of the body is not read
        )

    def _stalled(self) -> JSONResponse:
        return error_response(
            ["body"],
            f"the request body did not arrive within {self.settings.read_timeout_s:g} s (srifty serve "
            "--read-timeout-s)",
            "timeout",
            status=408,
            headers={"Connection": "close"},
        )


class _Slots:
    """``n`` slots, at most ``max_waiting`` waiters; thread-safe (a slot is freed by the worker thread that held
    it) and bound to no event loop (a waiter is woken on its own loop)."""

    def __init__(self, n: int, max_waiting: int) -> None:
        self._lock = threading.Lock()
        self._free, self._max_waiting = n, max_waiting
        self._waiters: collections.deque[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = collections.deque()

    def take(self) -> asyncio.Future[None] | bool:
        """True: a slot is yours; False: none and the queue is full; a future: wait on it for a slot."""
        with self._lock:
            if self._free:
                self._free -= 1
                return True
            if len(self._waiters) >= self._max_waiting:
                return False
            loop = asyncio.get_running_loop()
            waiter: asyncio.Future[None] = loop.create_future()
            self._waiters.append((loop, waiter))
            return waiter

    def give_up(self, waiter: asyncio.Future[None]) -> None:
        """A waiter that timed out leaves the queue (if a slot was already handed to it, it is passed on)."""
        with self._lock:
            for i, (_, w) in enumerate(self._waiters):
                if w is waiter:
                    del self._waiters[i]
                    return

    def release(self) -> None:
        with self._lock:
            while self._waiters:
                loop, waiter = self._waiters.popleft()
                if not loop.is_closed():
                    loop.call_soon_threadsafe(self._hand_over, waiter)
                    return
            self._free += 1

    def _hand_over(self, waiter: asyncio.Future[None]) -> None:
        if waiter.done():  # it timed out meanwhile: the slot goes to the next one
            self.release()
        else:
            waiter.set_result(None)

    def in_use(self, n: int) -> int:
        with self._lock:
            return n - self._free


_BUSY = (
    b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nConnection: close\r\nContent-Type: text/plain\r\n"
    b"Content-Length: 62\r\n\r\ntoo many connections at once (srifty serve --max-connections)\n"
)


def server_config(app: Any, settings: ServiceSettings, host: str, port: int, **options: Any) -> Any:
    """uvicorn's configuration for the service: its HTTP protocol closes a connection that sends no request head
    within ``read_timeout_s`` (issue #23 item 6: 400 connections that never sent a byte stayed open), and at
    ``max_connections`` a new connection closes the one idle the longest (no request in progress) to take its place;
    only when every connection is busy with a request is the new one refused (503) at once. Idle connections held
    the cap for the read timeout before (issue #36 L10: 256 of them from one local user, `/healthz` 503 meanwhile)."""
    import uvicorn
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class Bounded(H11Protocol):
        _head_timer: asyncio.TimerHandle | None = None
        _idle_since: float = 0.0

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            if len(self.connections) > settings.max_connections and not self._evict_one():
                transport.write(_BUSY)
                transport.close()
                return
            self._arm()

        def _idle(self) -> bool:
            return (self.cycle is None or self.cycle.response_complete) and not self.transport.is_closing()

        def _evict_one(self) -> bool:
            """Close the connection idle the longest (not this one); False when every other one is busy."""
            idle = [c for c in self.connections if c is not self and isinstance(c, Bounded) and c._idle()]
            if not idle:
                return False
            min(idle, key=lambda c: c._idle_since).transport.close()
            return True

        def _arm(self) -> None:
            self._idle_since = self.loop.time()
            self._head_timer = self.loop.call_later(settings.read_timeout_s, self._no_head)

        def _no_head(self) -> None:  # no request in progress: none arrived, or the next one did not
            if self._idle():
                self.transport.close()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
            super().connection_lost(exc)

    return uvicorn.Config(app, host=host, port=port, http=Bounded, **options)


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim`` (None elsewhere: musl, macOS, Windows)."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc.malloc_trim
    except (OSError, AttributeError):
        return None


def release_memory() -> None:
    """Hand freed heap memory back to the system: glibc keeps the free pages of its arenas (each worker thread has
    its own) for reuse, so a process that once ranked 4.8 million candidates stayed at its peak."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


class HeavyWork:
    """Rankings and predictions: at most ``max_concurrent`` computed at once, in their own threads; 429 when the
    queue is full, 503 after ``request_timeout_s`` (the started work finishes and keeps its slot until then)."""

    def __init__(self, settings: ServiceSettings) -> None:
        self.settings = settings
        self._pool: ThreadPoolExecutor | None = None  # made by the first request after each start of the app
        self._slots = _Slots(settings.max_concurrent, settings.max_queued)

    def close(self) -> None:
        """The pool's threads end (the app's shutdown): queued work is cancelled, running work finishes; an app
        started again makes a new pool."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)

    def _executor(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.settings.max_concurrent, thread_name_prefix="srifty-heavy")
        return self._pool

    def running(self) -> int:
        """Heavy requests holding a slot now (computing, or finishing after a 503)."""
        return self._slots.in_use(self.settings.max_concurrent)

    async def run(self, what: str, fn: Callable[[], JSONResponse]) -> JSONResponse:
        s = self.settings
        deadline = time.monotonic() + s.request_timeout_s
        got = self._slots.take()
        if got is False:
            return error_response(
                ["body"],
                f"Too many {what} requests at once: {s.max_concurrent} running and {s.max_queued} waiting "
                f"(srifty serve --max-concurrent / --max-queued). Retry after {BUSY_RETRY_S} s.",
                "too_many_requests",
                status=429,
                headers={"Retry-After": str(BUSY_RETRY_S)},
            )
        if got is not True:
            try:
                await asyncio.wait_for(got, max(0.0, deadline - time.monotonic()))
            except asyncio.TimeoutError:
                self._slots.give_up(got)
                return self._timed_out(what, "waiting for a free slot")
        future = self._executor().submit(fn)  # the pool lives as long as the app's run (its threads end with it)
        future.add_done_callback(self._done)
        try:
            return await asyncio.wait_for(asyncio.wrap_future(future), max(0.0, deadline - time.monotonic()))
        except asyncio.TimeoutError:
            return self._timed_out(what, "computing")

    def _done(self, _: Any) -> None:
        """A heavy request's work ended (in its worker thread): free its slot, and give the memory its arrays held
        back to the system once none is running (issue #23 item 6: glibc kept 2.3 GB of a 3.3 GB peak)."""
        self._slots.release()
        if self.running() == 0:
            release_memory()

    def _timed_out(self, what: str, where: str) -> JSONResponse:
        s = self.settings
        retry = max(1, math.ceil(s.request_timeout_s / 2))
        return error_response(
            ["body"],
            f"The {what} took longer than {s.request_timeout_s:g} s ({where}; srifty serve --request-timeout-s) "
            f"and was abandoned. Narrow the request (max_instances, max_types, regions, allow) or retry after "
            f"{retry} s.",
            "timeout",
            status=503,
            headers={"Retry-After": str(retry)},
        )


__all__ = [
    "MAX_BODY_BYTES",
    "Guard",
    "HeavyWork",
    "SafeJSONResponse",
    "ServiceSettings",
    "error_response",
    "release_memory",
    "server_config",
]
