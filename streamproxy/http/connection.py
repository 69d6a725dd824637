"""One client connection: aiohttp's handler with nginx's client timeouts, and the connection cap.

`Connections` is a `web.Server` whose `Protocol` (a `web.RequestHandler`) overrides only public methods;
each connection's state is its `Clock`, one phase at a time:
  fresh/header  nothing, or part of the headers in: `client_header_timeout` from the accept (or the first
                byte on a kept-alive connection), then a close, or a 408 (`body.answer_unread`) once a
                byte is in. aiohttp's keep-alive timer is stopped meanwhile (`keep_alive(True)`).
  body          `client_body_timeout` between two socket reads (a read only stores the time; the timer
                re-arms itself, and waits while the transport is paused); firing makes the body read
                raise `RequestTimeout`: a 408 from the route, or only a close once a response byte is out.
  busy / linger no timer of ours; idle: aiohttp's `keepalive_timeout`, its close counted here.
A timer acts one loop turn later (`call_soon`) and is void if re-armed meanwhile (`_epoch`).

Not public API, pinned by tests/production/test_dispatch.py: on Python 3.11 `HandlerLoop.create_task`
hands the coroutine back so aiohttp awaits the handler in the connection's own task (3.12+: eager tasks).
Past `max_connections` (default: half the soft RLIMIT_NOFILE) a connection is closed unread; closes of
our making are counted in `streamproxy_connections_closed_total`.
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
from aiohttp.abc import AbstractStreamWriter
from aiohttp.http_exceptions import LineTooLong
from aiohttp.streams import StreamReader

from streamproxy.config import Settings
from streamproxy.errors import APIError, HeaderTooLarge, InternalError, InvalidRequest, RequestTimeout
from streamproxy.http import accesslog
from streamproxy.http.body import answer_unread
from streamproxy.http.metrics import (
    CLOSED_BODY_TIMEOUT,
    CLOSED_HEADER_TIMEOUT,
    CLOSED_KEEPALIVE_TIMEOUT,
    CLOSED_OVER_LIMIT,
    OPEN_CONNECTIONS,
    RESPONSES,
)

log = logging.getLogger("streamproxy.server")

# Phases of a connection (CLOSING: a 408 is out, nothing more is read; GONE: closed, or refused).
FRESH, HEADER, BODY, BUSY, LINGER, IDLE, CLOSING, GONE = range(8)

Handler = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]
RequestFactory = Callable[[Any, StreamReader, web.RequestHandler, AbstractStreamWriter, "asyncio.Task[None]"], web.BaseRequest]


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
    text = str(message or exc or "")
    if isinstance(exc, LineTooLong):
        return HeaderTooLarge("the request line or a header field is longer than the server accepts (--max-header-bytes)")
    if "too many headers" in text.lower():
        return HeaderTooLarge("the request has more header fields than the server accepts")
    if status >= 500:
        return InternalError("the server failed to handle this request")
    return InvalidRequest("malformed HTTP request", code="bad_request")




# Python 3.12+ has eager tasks, and aiohttp starts each handler's task eagerly.
INLINE_HANDLERS = sys.version_info < (3, 12)


class HandlerLoop:
    """The event loop as one connection's `RequestHandler` sees it, except that after `inline()`
    (the connection's task exists) `create_task` hands the coroutine back: aiohttp's `start()` then
    awaits the request's handler in the connection's own task instead of a new one, and the
    handler runs in the loop turn that wakes it, not the turn after. Nothing here uses context
    variables, the one thing aiohttp's separate task is for; cancelling the connection's task (the
    client gone) reaches the handler the same way. Everything else is the loop's (the methods the
    connection calls most are the loop's own bound methods, not looked up per call)."""

    __slots__ = ("_loop", "_inline", "time", "create_future", "call_at", "call_later", "call_soon")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._inline = False
        self.time = loop.time
        self.create_future = loop.create_future
        self.call_at = loop.call_at
        self.call_later = loop.call_later
        self.call_soon = loop.call_soon

    def inline(self) -> None:
        self._inline = True

    def create_task(self, coro: Coroutine[Any, Any, Any], **kwargs: Any) -> Any:
        return coro if self._inline else self._loop.create_task(coro, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loop, name)


class Clock:
    """One connection's phase and its one timer (see the module's docstring)."""

    __slots__ = ("_protocol", "_limits", "_loop", "_phase", "_timer", "_epoch", "_body", "_writer", "_last_read", "_idle_until")

    def __init__(self, protocol: Protocol, limits: Limits, loop: asyncio.AbstractEventLoop) -> None:
        self._protocol: Protocol | None = protocol
        self._limits = limits
        self._loop = loop
        self._phase = FRESH
        self._timer: asyncio.TimerHandle | None = None
        self._epoch = 0  # bumped by every arm and disarm: a due expiry of an older one does nothing
        self._body: StreamReader | None = None
        self._writer: AbstractStreamWriter | None = None
        self._last_read = 0.0
        self._idle_until = 0.0  # idle from the last response: aiohttp closes it at this time

    # -- what the connection tells it -------------------------------------------------

    def made(self) -> None:
        self._arm(self._limits.header_timeout)

    def refused(self) -> None:
        self._phase = GONE
        self._protocol = None

    def gone(self) -> bool:
        return self._phase == GONE

    def receiving(self, data: bytes) -> bool:
        """Bytes from the socket, before aiohttp parses them; False: drop them."""
        phase = self._phase
        if phase >= CLOSING:
            return False
        if data and (phase == FRESH or phase == IDLE):  # the first bytes of a request
            if phase == IDLE:
                protocol = self._protocol
                if protocol is not None:
                    protocol.keep_alive(True)  # aiohttp's idle timer stops: the header timeout now
                self._arm(self._limits.header_timeout)  # a kept-alive connection: from the first byte
            self._phase = HEADER
        return True

    def received(self) -> None:
        """aiohttp has taken the bytes: a body read, or the end of a body nobody read."""
        phase = self._phase
        if phase == BODY:
            body = self._body
            if body is None or body.is_eof():
                self._phase = BUSY
                self._body = self._writer = None
                self._disarm()
            else:
                self._last_read = self._loop.time()
        elif phase == LINGER:
            body = self._body
            if body is None or body.is_eof():
                self._idle()

    def started(self, body: StreamReader, writer: AbstractStreamWriter) -> None:
        """A request's headers are in and its handler starts."""
        if self._phase >= CLOSING:
            return
        timeout = self._limits.body_timeout
        if timeout > 0 and not body.is_eof():
            self._phase = BODY
            self._body, self._writer = body, writer
            self._last_read = self._loop.time()
            self._arm(timeout)
        else:
            self._phase = BUSY
            self._disarm()

    def keeps_alive(self) -> bool:
        """The response may keep the connection (not after a 408, nor with keep-alive off)."""
        return self._phase != CLOSING and self._limits.keepalive_timeout > 0

    def ended(self, body: StreamReader) -> None:
        """The response is out."""
        self._writer = None
        if self._phase == GONE:
            return
        if self._phase == CLOSING:
            self._body = None
            if self._protocol is not None:
                self._protocol.force_close()  # after the 408: the rest of the request is not read
        elif body.is_eof():
            self._idle()
        else:
            self._phase = LINGER
            self._body = body
            self._disarm()

    def lost(self) -> None:
        if self._phase == IDLE and self._limits.keepalive_timeout > 0 and self._loop.time() >= self._idle_until:
            CLOSED_KEEPALIVE_TIMEOUT.inc()  # idle that long: aiohttp's keep-alive timer closed it
        self._disarm()
        self._phase = GONE
        self._protocol = None
        self._body = self._writer = None

    # -- the timer --------------------------------------------------------------------

    def _idle(self) -> None:
        self._phase = IDLE
        self._body = None
        if self._timer is not None:
            self._disarm()
        self._idle_until = self._loop.time() + self._limits.keepalive_timeout

    def _arm(self, delay: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._epoch += 1
        live = delay > 0 and self._protocol is not None and self._protocol.transport is not None
        self._timer = self._loop.call_later(delay, self._due, self._epoch) if live else None

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
            self._epoch += 1

    def _due(self, epoch: int) -> None:
        # One loop turn later: a request parsed in this turn is started (`started`) first.
        self._timer = None
        self._loop.call_soon(self._expire, epoch)

    def _expire(self, epoch: int) -> None:
        protocol = self._protocol
        if epoch != self._epoch or protocol is None or protocol.transport is None:
            return
        phase = self._phase
        if phase == FRESH:
            CLOSED_HEADER_TIMEOUT.inc()
            self._phase = CLOSING
            protocol.force_close()
        elif phase == HEADER:
            self._header_timeout(protocol)
        elif phase == BODY:
            self._body_due(protocol)

    def _header_timeout(self, protocol: Protocol) -> None:
        CLOSED_HEADER_TIMEOUT.inc()
        self._phase = CLOSING
        err = RequestTimeout(
            f"the request headers did not arrive within {self._limits.header_timeout:g} s (--client-header-timeout)"
        )
        transport = protocol.transport
        assert transport is not None
        peer = transport.get_extra_info("peername")
        remote = peer[0] if isinstance(peer, (tuple, list)) and peer else None
        log.debug("rejected a request from %s: %s", remote, err.message)
        answer_unread(transport, err)
        RESPONSES.labels("unparsed", str(err.status), err.code or "").inc()
        accesslog.unread("-", "-", remote, err.status, err.code)  # its request line never arrived
        protocol.force_close()  # the answer is flushed first

    def _body_due(self, protocol: Protocol) -> None:
        body = self._body
        timeout = self._limits.body_timeout
        if body is None or body.is_eof():
            self._phase = BUSY
            return
        now = self._loop.time()
        transport = protocol.transport
        if transport is not None and not transport.is_reading():
            self._last_read = now  # aiohttp paused reading: the client cannot send, its clock starts again
        due = self._last_read + timeout
        if now < due:
            self._arm(due - now)
            return
        CLOSED_BODY_TIMEOUT.inc()
        writer = self._writer
        if writer is None or writer.output_size > 0:
            protocol.force_close()  # a response has begun: closing is the only word left
            return
        self._phase = CLOSING
        body.set_exception(
            RequestTimeout(f"the request body stalled: no bytes for {timeout:g} s (--client-body-timeout)")
        )


class Protocol(web.RequestHandler):
    """aiohttp's connection handler, with the client timeouts (`Clock`) and a JSON answer to unparseable requests."""

    __slots__ = ("clock", "server", "handler_loop")

    def __init__(self, server: Connections, **kwargs: Any) -> None:
        self.handler_loop = HandlerLoop(server.event_loop) if INLINE_HANDLERS else None
        super().__init__(server, loop=self.handler_loop or server.event_loop, **kwargs)  # type: ignore[arg-type]
        self.server = server
        self.clock = Clock(self, server.limits, server.event_loop)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if self.server.full():
            CLOSED_OVER_LIMIT.inc()
            self.clock.refused()
            transport.close()  # unread; aiohttp never sees it
            return
        super().connection_made(transport)
        self.keep_alive(True)  # not aiohttp's keep-alive timer until a response is out: the header timeout
        if self.handler_loop is not None:
            self.handler_loop.inline()  # start()'s task exists: the handlers run in it
        self.clock.made()

    def connection_lost(self, exc: BaseException | None) -> None:
        clock = self.clock
        if not clock.gone():  # a refused connection: aiohttp never saw it
            clock.lost()
            super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        clock = self.clock
        if clock.receiving(data):
            super().data_received(data)
            clock.received()

    async def finish_response(
        self, request: web.BaseRequest, resp: web.StreamResponse, start_time: float | None
    ) -> tuple[web.StreamResponse, bool]:
        clock = self.clock
        if not clock.keeps_alive():
            resp.force_close()  # says `Connection: close` unless the handler has sent its headers already
        try:
            return await super().finish_response(request, resp, start_time)
        finally:
            clock.ended(request.content)

    def handle_error(
        self, request: Any, status: int = 500, exc: BaseException | None = None, message: str | None = None
    ) -> web.StreamResponse:
        if status == 500 or request.writer.output_size > 0:
            return super().handle_error(request, status, exc, message)
        err = _parse_error(status, exc, message)
        log.debug("rejected a request from %s: %s", request.remote, exc)
        RESPONSES.labels("unparsed", str(err.status), err.code or "").inc()
        accesslog.unread(request.method, request.path, request.remote, err.status, err.code)
        resp = web.Response(status=err.status, body=err.to_json(), content_type="application/json", headers=err.headers())
        resp.force_close()
        return resp


async def _not_set_up(request: web.BaseRequest) -> web.StreamResponse:
    raise RuntimeError("Connections.serve() was not called")


class Connections(web.Server):
    """aiohttp's low-level server making `Protocol`s: it counts its connections and refuses those
    past the cap. `serve` gives it the handler and request factory of the app's own server."""

    def __init__(self, limits: Limits, *, handler_cancellation: bool = False, **handler_args: Any) -> None:
        loop = asyncio.get_running_loop()
        handler_args["keepalive_timeout"] = limits.keepalive_timeout  # aiohttp's: the one idle timer
        super().__init__(
            _not_set_up, request_factory=self.make_request, handler_cancellation=handler_cancellation, loop=loop,
            **handler_args,
        )
        self.limits = limits
        self.open_connections = 0
        self.event_loop = loop
        self.handler_args = handler_args
        self.app_request_factory: RequestFactory | None = None

    def serve(self, handler: Handler, request_factory: RequestFactory) -> None:
        """Answer with `handler`, making requests with `request_factory` (an app's: `web.AppRunner.server`'s)."""
        self.request_handler = handler
        self.app_request_factory = request_factory

    def make_request(
        self, message: Any, payload: StreamReader, protocol: web.RequestHandler, writer: AbstractStreamWriter,
        task: asyncio.Task[None],
    ) -> web.BaseRequest:
        """aiohttp's request factory, called once a request's headers are parsed (or it could not be)."""
        factory = self.app_request_factory
        if factory is None:
            raise RuntimeError("Connections.serve() was not called")
        request = factory(message, payload, protocol, writer, task)
        if isinstance(protocol, Protocol):
            protocol.clock.started(payload, writer)
        return request

    def __call__(self) -> Protocol:
        return Protocol(self, **self.handler_args)

    def full(self) -> bool:
        cap = self.limits.max_connections
        return cap > 0 and self.open_connections >= cap

    def connection_made(self, handler: web.RequestHandler, transport: asyncio.Transport) -> None:
        super().connection_made(handler, transport)
        self.open_connections += 1
        OPEN_CONNECTIONS.inc()

    def connection_lost(self, handler: web.RequestHandler, exc: BaseException | None = None) -> None:
        super().connection_lost(handler, exc)
        self.open_connections -= 1
        OPEN_CONNECTIONS.dec()
