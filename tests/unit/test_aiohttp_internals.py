"""What the product borrows from aiohttp's private insides, named one by one, so that an
aiohttp upgrade that removes or changes one fails here with its name, not somewhere else
with a puzzle (or, worse, passes: `writer.can_write_direct` reads the payload writer's
fields with defaults, so a renamed field would quietly turn serve's push path off).

pyproject.toml pins aiohttp to the range this file and the suite have passed on. Who uses
what:

- http/connection.py (`Protocol`, `ConnectionServer`): overrides `RequestHandler`'s
  `_handle_request` and `_process_keepalive` (and relies on aiohttp arming its idle timer
  only while `_keepalive_handle` is None), reads and sets its `_manager`, `_force_close`,
  `_waiter`, `_messages`, `_current_request`, `_reading_paused`, `_buffer_paused` and
  `_loop`, queues `_ErrInfo(status, exc, message)` entries, and on Python 3.11 swaps
  `_loop` so that `start()`'s `loop.create_task(...)` hands the handler back
  (`_HandlerInline`); it subclasses `Server` by `__class__` and uses its `_loop`, `_kwargs`,
  `__call__`, `connection_made(handler, transport)` and `connection_lost(handler, exc)`.
- http/server.py (`Runner`): overrides `AppRunner._make_server`.
- http/writer.py: `StreamResponse._send_headers_immediately` (SSEResponse: headers wait for
  the first write), and `StreamResponse._payload_writer`, whose `chunked`, `length`,
  `_compress`, `_on_chunk_sent`, `_headers_written`, `_eof` and `send_headers()` say whether
  frames may go straight to the transport.
"""

from __future__ import annotations

import asyncio
import inspect
import sys
from collections import deque
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.base_protocol import BaseProtocol
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_server import Server

from streamproxy.config import Settings
from streamproxy.http.server import make_runner
from streamproxy.http.writer import can_write_direct

VERSION = aiohttp.__version__


def slots(cls: type) -> set[str]:
    """Every name in the `__slots__` of `cls` and its bases."""
    names: set[str] = set()
    for klass in cls.__mro__:
        declared = klass.__dict__.get("__slots__", ())
        names.update((declared,) if isinstance(declared, str) else declared)
    return names


def params(func: Any) -> list[str]:
    return list(inspect.signature(func).parameters)


def method(cls: type, name: str) -> Any:
    found = getattr(cls, name, None)
    assert callable(found), f"aiohttp {VERSION}: {cls.__name__}.{name} is gone (used by streamproxy/http/)"
    return found


# -- http/connection.py: RequestHandler ------------------------------------------------------


@pytest.mark.parametrize("name, expected", [
    ("_handle_request", ["self", "request", "start_time", "request_handler"]),
    ("_process_keepalive", ["self"]),
    ("finish_response", ["self", "request", "resp", "start_time"]),
    ("handle_error", ["self", "request", "status", "exc", "message"]),
    ("data_received", ["self", "data"]),
    ("connection_made", ["self", "transport"]),
    ("connection_lost", ["self", "exc"]),
    ("force_close", ["self"]),
    ("start", ["self"]),
])
def test_request_handler_methods_connection_py_overrides_or_calls(name: str, expected: list[str]) -> None:
    found = method(RequestHandler, name)
    assert params(found) == expected, (
        f"aiohttp {VERSION}: RequestHandler.{name}{inspect.signature(found)} is not the {expected} "
        "that http/connection.py overrides or calls"
    )


def test_handle_request_is_a_coroutine_and_start_is_too() -> None:
    for name in ("_handle_request", "finish_response", "start"):
        assert inspect.iscoroutinefunction(getattr(RequestHandler, name)), f"aiohttp {VERSION}: RequestHandler.{name} is no longer async"


def test_request_handler_init_takes_the_manager_and_loop() -> None:
    sig = inspect.signature(RequestHandler.__init__)
    assert list(sig.parameters)[:2] == ["self", "manager"], f"aiohttp {VERSION}: RequestHandler.__init__{sig}"
    assert sig.parameters["loop"].kind is inspect.Parameter.KEYWORD_ONLY, f"aiohttp {VERSION}: RequestHandler.__init__{sig}: no keyword `loop`"


@pytest.mark.parametrize("name", [
    "_manager", "_force_close", "_waiter", "_messages", "_current_request", "_loop", "_keepalive_handle",
])
def test_request_handler_fields_connection_py_reads_or_sets(name: str) -> None:
    assert name in slots(RequestHandler), f"aiohttp {VERSION}: RequestHandler.{name} is gone (http/connection.py reads or sets it)"


@pytest.mark.parametrize("name", ["_reading_paused", "_buffer_paused"])
def test_base_protocol_flow_control_fields(name: str) -> None:
    # connection.py `_body_due`: a client that cannot send (reading paused) gets its body timeout restarted.
    assert name in slots(BaseProtocol), f"aiohttp {VERSION}: BaseProtocol.{name} is gone (http/connection.py `_body_due` reads it)"


def test_err_info_is_what_the_header_timeout_queues() -> None:
    from aiohttp.streams import EMPTY_PAYLOAD
    from aiohttp.web_protocol import _ErrInfo

    err = ValueError("x")
    info = _ErrInfo(status=408, exc=err, message="late")
    assert (info.status, info.exc, info.message) == (408, err, "late"), f"aiohttp {VERSION}: _ErrInfo(status, exc, message) changed"
    # start() takes `(message, payload)` pairs from `_messages`: a deque it pops from the left.
    source = inspect.getsource(RequestHandler)
    assert "self._messages: deque" in source or "self._messages = deque" in source, (
        f"aiohttp {VERSION}: RequestHandler._messages is no longer a deque of (message, payload)"
    )
    assert isinstance(deque([(info, EMPTY_PAYLOAD)]).popleft()[0], _ErrInfo)


def test_the_idle_timer_is_armed_only_while_keepalive_handle_is_none() -> None:
    """connection.py's `_process_keepalive` does nothing and leaves the spent handle set: aiohttp
    must then arm no other (its own timer would close a connection mid-headers)."""
    source = inspect.getsource(RequestHandler.start)
    assert "if self._keepalive_handle is None:" in source and "self._process_keepalive" in source, (
        f"aiohttp {VERSION}: RequestHandler.start no longer arms the idle timer only when _keepalive_handle is None "
        "(http/connection.py `_process_keepalive`)"
    )


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="3.12+: aiohttp starts handlers eagerly; _HandlerInline is 3.11 only")
def test_start_creates_the_handlers_task_through_its_loop_attribute() -> None:
    """`_HandlerInline` replaces `_loop` after `connection_made`: `start()` must read `self._loop`
    when it runs and start each request's handler with `loop.create_task(...)` on it."""
    source = inspect.getsource(RequestHandler.start)
    assert "loop = self._loop" in source and "loop.create_task(coro)" in source, (
        f"aiohttp {VERSION}: RequestHandler.start no longer starts the handler with self._loop.create_task "
        "(http/connection.py `_HandlerInline`)"
    )


# -- http/connection.py: Server; http/server.py: AppRunner ------------------------------------


def test_server_fields_and_hooks_connection_server_uses() -> None:
    assert params(method(Server, "connection_made")) == ["self", "handler", "transport"], f"aiohttp {VERSION}: Server.connection_made"
    assert params(method(Server, "connection_lost")) == ["self", "handler", "exc"], f"aiohttp {VERSION}: Server.connection_lost"
    assert params(method(Server, "__call__")) == ["self"], f"aiohttp {VERSION}: Server.__call__"
    source = inspect.getsource(Server.__init__)
    for field in ("self._loop =", "self._kwargs ="):
        assert field in source, f"aiohttp {VERSION}: Server.{field.split('.')[1].split(' ')[0]} is gone (ConnectionServer.__call__ reads it)"


def test_app_runner_make_server_is_the_hook_runner_overrides() -> None:
    found = method(web.AppRunner, "_make_server")
    assert inspect.iscoroutinefunction(found) and params(found) == ["self"], (
        f"aiohttp {VERSION}: AppRunner._make_server{inspect.signature(found)} (http/server.py Runner overrides it)"
    )


async def test_our_server_really_builds_our_connection_handler() -> None:
    """The two hooks end to end: the runner's server is a ConnectionServer whose handlers are ours."""
    from streamproxy.http.connection import ConnectionServer, Protocol

    runner = make_runner(web.Application(), Settings())
    await runner.setup()
    try:
        server = runner.server
        assert isinstance(server, ConnectionServer), f"aiohttp {VERSION}: AppRunner._make_server is no longer called by setup()"
        assert isinstance(server(), Protocol)
    finally:
        await runner.cleanup()


# -- http/writer.py: public API, behaviour it relies on ----------------------------------------


async def _serve_one(handler: Any, request: bytes) -> bytes:
    app = web.Application()
    app.router.add_get("/", handler)
    runner = make_runner(app, Settings())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        port = runner.addresses[0][1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(request)
        got = await asyncio.wait_for(reader.read(), 10)
        writer.close()
    finally:
        await runner.cleanup()
    return got


async def test_prepare_sends_the_headers_and_a_chunked_body_takes_frames_written_to_the_transport() -> None:
    """`can_write_direct` relies on aiohttp sending a StreamResponse's headers in `prepare()`
    (documented) and saying `Transfer-Encoding: chunked` in the headers it sent: then frames
    written straight to `request.transport` sit between the headers and `write_eof`'s last chunk.
    Were either to change, serve's push path and the gateway's direct writes would corrupt the body."""
    seen: dict[str, Any] = {}

    async def handler(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        assert request.transport is not None
        seen["direct"] = can_write_direct(response, request.transport)
        request.transport.write(b"5\r\nhello\r\n")
        await response.write_eof()
        return response

    got = await _serve_one(handler, b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    head, _, body = got.partition(b"\r\n\r\n")
    assert seen["direct"] is True, f"aiohttp {VERSION}: can_write_direct says False for a plain chunked response (the push path is off)"
    assert b"transfer-encoding: chunked" in head.lower(), f"aiohttp {VERSION}: {head!r}"
    assert body == b"5\r\nhello\r\n0\r\n\r\n", f"aiohttp {VERSION}: the headers did not leave in prepare(): {got!r}"


async def test_an_http10_or_compressed_response_is_not_written_to_directly() -> None:
    seen: list[bool] = []

    async def handler(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        if request.query.get("gzip"):
            response.enable_compression()
        await response.prepare(request)
        seen.append(can_write_direct(response, request.transport))
        await response.write(b"data: x\n\n")
        await response.write_eof()
        return response

    got = await _serve_one(handler, b"GET / HTTP/1.0\r\nHost: x\r\n\r\n")
    assert got.endswith(b"\r\n\r\ndata: x\n\n"), got  # HTTP/1.0: close-delimited, no chunks
    await _serve_one(handler, b"GET /?gzip=1 HTTP/1.1\r\nHost: x\r\nAccept-Encoding: gzip\r\nConnection: close\r\n\r\n")
    assert seen == [False, False]
