"""One client connection: aiohttp's handler with nginx's client timeouts, and the connection cap.

A connection is in one phase at a time, bounded by one loop timer:

  fresh   accepted, nothing received: `client_header_timeout` from the accept,
          then a close (there is no request to answer);
  header  part of a request's headers is in: the same timer (from the first
          byte on a kept-alive connection), then a 408 queued the way aiohttp
          queues its answer to an unparseable request (`handle_error`: OpenAI
          error body, access log, metrics), then a close;
  body    the handler runs, the body is not all in: `client_body_timeout`
          between two reads from the socket. A read only stores the time; the
          timer, when due, re-arms at the last read plus the timeout, and
          restarts the client's clock while reading is paused (it could not
          send). When it fires, the handler's body read raises
          `RequestTimeout`: the route answers 408 in its own shape with
          `Connection: close`; once a response byte is out, only a close;
  busy    body complete: no timer and no work per chunk (streams cost nothing);
  idle    between requests: `keepalive_timeout`, then a quiet close.

Phases change where aiohttp's handler already passes: `data_received` and
`_handle_request`. A partial request pipelined behind a complete one counts as
idle until its next bytes. aiohttp's own keep-alive timer is left inert
(`_process_keepalive`): it would close a connection mid-headers without a word.

On Python 3.11 aiohttp starts each request's handler in a task of its own,
one more loop turn after the connection's task wakes; under load a turn waits
behind every other connection's I/O. `_HandlerInline` has the connection's
task await the handler itself (3.12+ does the same with eager tasks).

`ConnectionServer` counts the connections it serves; one accepted past
`max_connections` is closed at once, unread, and the others are served. The
default cap is half the soft RLIMIT_NOFILE (`ulimit -n`), which with the usual
limit is nginx's default worker_connections; the other half is left for the
server's own files and sockets (logs, the engine, the gateway's upstreams).
Closes of the server's own making are counted by reason in
`streamproxy_connections_closed_total`; `streamproxy_open_connections` is the gauge.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import sys
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import LineTooLong
from aiohttp.streams import EMPTY_PAYLOAD, StreamReader
from aiohttp.web_protocol import RequestHandler, _ErrInfo
from aiohttp.web_request import BaseRequest
from aiohttp.web_response import StreamResponse
from aiohttp.web_server import Server

from streamproxy.config import Settings
from streamproxy.errors import APIError, HeaderTooLarge, InternalError, InvalidRequest, RequestTimeout
from streamproxy.http import accesslog
from streamproxy.http.metrics import (
    CLOSED_BODY_TIMEOUT,
    CLOSED_HEADER_TIMEOUT,
    CLOSED_KEEPALIVE_TIMEOUT,
    CLOSED_OVER_LIMIT,
    OPEN_CONNECTIONS,
    RESPONSES,
)

log = logging.getLogger("streamproxy.server")

# Phases of a connection.
FRESH, HEADER, BODY, BUSY, IDLE, CLOSING = range(6)

Handler = Callable[[BaseRequest], Awaitable[StreamResponse]]


@dataclass(frozen=True, slots=True)
class Limits:
    header_timeout: float  # seconds; 0: none
    body_timeout: float  # seconds between two reads; 0: none
    keepalive_timeout: float  # seconds idle; 0: no keep-alive
    max_connections: int  # 0: no cap

    @classmethod
    def from_settings(cls, settings: Settings) -> Limits:
        cap = settings.max_connections
        return cls(
            header_timeout=settings.client_header_timeout,
            body_timeout=settings.client_body_timeout,
            keepalive_timeout=settings.keepalive_timeout,
            max_connections=default_max_connections() if cap is None else cap,
        )


def default_max_connections() -> int:
    """Half the file descriptors this process may open (the soft RLIMIT_NOFILE)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        soft = 1 << 20
    return max(soft // 2, 1)


def _parse_error(status: int, exc: BaseException | None, message: str | None) -> APIError:
    # aiohttp's messages quote the offending bytes (maybe a credential): never echo them.
    if isinstance(exc, APIError):
        return exc  # ours: the header timeout's 408
    text = str(message or exc or "")
    if isinstance(exc, LineTooLong):
        return HeaderTooLarge("the request line or a header field is longer than the server accepts (--max-header-bytes)")
    if "too many headers" in text.lower():
        return HeaderTooLarge("the request has more header fields than the server accepts")
    if status >= 500:
        return InternalError("the server failed to handle this request")
    return InvalidRequest("malformed HTTP request", code="bad_request")


# Python 3.12+ has eager tasks, and aiohttp starts each handler's task eagerly.
_INLINE_HANDLERS = sys.version_info < (3, 12)


class _HandlerInline:
    """The event loop as the connection's handler sees it, except that `create_task` hands the
    coroutine back: aiohttp's `start()` then awaits the request's handler in the connection's
    own task instead of a new one, and the handler runs in the loop turn that wakes it, not the
    turn after (Python 3.11 has no eager tasks). Nothing here uses context variables, the one
    thing aiohttp's separate task is for; cancelling the connection's task (the client gone)
    reaches the handler the same way. Everything else is the loop's."""

    __slots__ = ("_loop",)

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def create_task(self, coro: Coroutine[Any, Any, Any], **kwargs: Any) -> Coroutine[Any, Any, Any]:
        return coro

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loop, name)


class Protocol(RequestHandler):
    """aiohttp's connection handler, with the client timeouts and a JSON answer to unparseable requests."""

    __slots__ = ("_limits", "_phase", "_timer", "_body", "_last_read")

    def __init__(self, manager: ConnectionServer, *, loop: asyncio.AbstractEventLoop, **kwargs: Any) -> None:
        super().__init__(manager, loop=loop, **kwargs)
        self._limits = manager.limits
        self._phase = FRESH
        self._timer: asyncio.TimerHandle | None = None
        self._body: StreamReader | None = None
        self._last_read = 0.0

    # -- the connection ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        server = self._manager
        if isinstance(server, ConnectionServer) and server.full():
            CLOSED_OVER_LIMIT.inc()
            self._manager = None  # connection_lost: nothing to undo
            self._force_close = True  # data_received: nothing to read
            transport.close()
            return
        super().connection_made(transport)
        if _INLINE_HANDLERS:
            self._loop = _HandlerInline(self._loop)  # type: ignore[assignment]  # after start()'s task exists
        self._arm(self._limits.header_timeout)

    def connection_lost(self, exc: BaseException | None) -> None:
        self._disarm()
        self._body = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        phase = self._phase
        if phase == BUSY:
            super().data_received(data)
        elif phase == BODY:
            super().data_received(data)
            body = self._body
            if body is None or body.is_eof():
                self._phase = BUSY
                self._disarm()
            else:
                self._last_read = self._loop.time()
        elif phase == CLOSING:
            return
        elif not data or (phase == IDLE and self._waiter is None):
            # aiohttp re-feeding its own buffer, or the rest of a body nobody read (lingering).
            super().data_received(data)
        else:
            if phase == IDLE:
                self._arm(self._limits.header_timeout)  # a kept-alive connection: from the first byte
            self._phase = HEADER
            super().data_received(data)
            if self._messages:  # the headers are in
                self._phase = BUSY
                self._disarm()

    # -- one request ------------------------------------------------------------------

    async def _handle_request(
        self, request: BaseRequest, start_time: float | None, request_handler: Handler
    ) -> tuple[StreamResponse, bool]:
        limits = self._limits
        if self._phase != CLOSING:
            body = request.content
            if limits.body_timeout > 0 and not body.is_eof():
                self._phase = BODY
                self._body = body
                self._last_read = self._loop.time()
                self._arm(limits.body_timeout)
            else:
                self._phase = BUSY
                self._disarm()
        try:
            return await super()._handle_request(request, start_time, request_handler)
        finally:
            self._body = None
            if self._phase == CLOSING:
                self.force_close()  # after the 408: the rest of the request is not read
            elif self._messages:
                self._phase = BUSY  # the next one is parsed already
                self._disarm()
            else:
                self._phase = IDLE
                self._arm(limits.keepalive_timeout)  # 0: none, the response said `Connection: close`

    def finish_response(
        self, request: BaseRequest, resp: StreamResponse, start_time: float | None
    ) -> Coroutine[Any, Any, tuple[StreamResponse, bool]]:
        # Not a coroutine of its own: aiohttp's, with the response marked first where needed.
        if self._phase == CLOSING or self._limits.keepalive_timeout <= 0:
            resp.force_close()  # says `Connection: close` unless the handler has sent its headers already
        return super().finish_response(request, resp, start_time)

    def handle_error(
        self, request: Any, status: int = 500, exc: BaseException | None = None, message: str | None = None
    ) -> web.StreamResponse:
        if status == 500 or request.writer.output_size > 0:
            return super().handle_error(request, status, exc, message)
        err = _parse_error(status, exc, message)
        log.debug("rejected a request from %s: %s", request.remote, exc)
        RESPONSES.labels("unparsed", str(err.status), err.code or "").inc()
        if accesslog.enabled():
            rec = accesslog.Record(accesslog.new_request_id(), 0.0)
            rec.error_code = err.code
            accesslog.write(accesslog.line(request, rec, err.status, 0.0))
        resp = web.Response(status=err.status, body=err.to_json(), content_type="application/json", headers=err.headers())
        resp.force_close()
        return resp

    # -- the timer --------------------------------------------------------------------

    def _arm(self, delay: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        live = delay > 0 and self.transport is not None and not self._force_close
        self._timer = self._loop.call_later(delay, self._expire) if live else None

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _process_keepalive(self) -> None:
        """aiohttp's idle timer does nothing: `_expire` does its job. The spent handle stays
        set, so aiohttp arms no other."""

    def _expire(self) -> None:
        self._timer = None
        if self.transport is None or self._force_close:
            return
        phase = self._phase
        if phase == FRESH:
            CLOSED_HEADER_TIMEOUT.inc()
            self.force_close()
        elif phase == HEADER:
            self._header_timeout()
        elif phase == BODY:
            self._body_due()
        elif phase == IDLE:
            if self._waiter is not None and not self._waiter.done():
                CLOSED_KEEPALIVE_TIMEOUT.inc()
                self.force_close()
            else:
                self._arm(self._limits.keepalive_timeout)  # still finishing the last request

    def _header_timeout(self) -> None:
        CLOSED_HEADER_TIMEOUT.inc()
        waiter = self._waiter
        if waiter is None or waiter.done():
            self.force_close()
            return
        self._phase = CLOSING
        err = RequestTimeout(
            f"the request headers did not arrive within {self._limits.header_timeout:g} s (--client-header-timeout)"
        )
        self._messages.append((_ErrInfo(status=err.status, exc=err, message=err.message), EMPTY_PAYLOAD))
        waiter.set_result(None)

    def _body_due(self) -> None:
        body = self._body
        timeout = self._limits.body_timeout
        if body is None or body.is_eof():
            self._phase = BUSY
            return
        now = self._loop.time()
        if self._reading_paused or self._buffer_paused:
            self._last_read = now  # the client cannot send: its clock starts again
        due = self._last_read + timeout
        if now < due:
            self._arm(due - now)
            return
        CLOSED_BODY_TIMEOUT.inc()
        request = self._current_request
        if request is None or request.writer.output_size > 0:
            self.force_close()  # a response has begun: closing is the only word left
            return
        self._phase = CLOSING
        body.set_exception(
            RequestTimeout(f"the request body stalled: no bytes for {timeout:g} s (--client-body-timeout)")
        )


class ConnectionServer(Server):
    """aiohttp's server, counting its connections and refusing those past the cap."""

    limits: Limits
    open_connections: int

    @classmethod
    def adopt(cls, server: Server, limits: Limits) -> ConnectionServer:
        """Make the server aiohttp built (`AppRunner._make_server`) one of these."""
        server.__class__ = cls
        assert isinstance(server, ConnectionServer)
        server.limits = limits
        server.open_connections = 0
        return server

    def __call__(self) -> RequestHandler:
        return Protocol(self, loop=self._loop, **self._kwargs)

    def full(self) -> bool:
        cap = self.limits.max_connections
        return cap > 0 and self.open_connections >= cap

    def connection_made(self, handler: RequestHandler, transport: asyncio.Transport) -> None:
        super().connection_made(handler, transport)
        self.open_connections += 1
        OPEN_CONNECTIONS.inc()

    def connection_lost(self, handler: RequestHandler, exc: BaseException | None = None) -> None:
        super().connection_lost(handler, exc)
        self.open_connections -= 1
        OPEN_CONNECTIONS.dec()
