"""One client connection: aiohttp's handler with nginx's client timeouts, and the connection cap.

`Connections` is a `web.Server` whose `Protocol` (a `web.RequestHandler`) overrides only public methods;
each connection's state is its `Clock` (client_clock.py: the phases and their one timer), told here
when bytes arrive, a request starts and ends, the connection is made and lost.

Not public API, pinned by tests/production/test_dispatch.py: on Python 3.11 `HandlerLoop.create_task`
hands the coroutine back so aiohttp awaits the handler in the connection's own task (3.12+: eager tasks).
Past `max_connections` (default: half the soft RLIMIT_NOFILE) a connection is closed unread; closes of
our making are counted in `streamproxy_connections_closed_total`.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from aiohttp import web
from aiohttp.abc import AbstractStreamWriter
from aiohttp.http_exceptions import LineTooLong
from aiohttp.streams import StreamReader

from streamproxy.errors import APIError, HeaderTooLarge, InternalError, InvalidRequest
from streamproxy.http import accesslog
from streamproxy.http.client_clock import Clock, Limits
from streamproxy.http.metrics import (
    CLOSED_OVER_LIMIT,
    OPEN_CONNECTIONS,
    RESPONSES,
)

log = logging.getLogger("streamproxy.server")

Handler = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]
RequestFactory = Callable[[Any, StreamReader, web.RequestHandler, AbstractStreamWriter, "asyncio.Task[None]"], web.BaseRequest]


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
