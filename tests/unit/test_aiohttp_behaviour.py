"""What the product relies on in aiohttp: its public API only, and the behaviour of that API,
named one by one, so that an aiohttp upgrade that changes one fails here with its name, not
somewhere else with a puzzle (or, worse, passes: a push path quietly off).

`test_no_private_aiohttp_names_in_the_product` keeps streamproxy/ off aiohttp's private
insides (no `_name` imported from aiohttp, no `x._name` that is one of aiohttp's private
attributes, no `self._name` in a class built on one of aiohttp's). pyproject.toml admits
aiohttp's 3.14 patch releases, which this file checks. Who relies on what:

- http/server.py `Runner`: a `web.ServerRunner` over `connection.Connections`; the app's
  start-up through a `web.AppRunner` whose server's public `request_handler` and
  `request_factory` it serves with; aiohttp's sites make each connection's protocol by calling
  `runner.server` (`web.Server.__call__`); `BaseRunner.cleanup` calls `shutdown()` (the app's
  on_shutdown) once, before waiting for the busy connections.
- http/connection.py `Connections`, `Protocol`: `web.RequestHandler(manager, loop=..., **kwargs)`
  takes the manager's `request_handler` and `request_factory`, calls the factory once per request
  when its headers are parsed (message, payload, protocol, writer, task), calls
  `finish_response(request, resp, start_time)` once per answered request and honours the
  response's `force_close()`, and answers what it cannot parse with `handle_error(request, status,
  exc, message)`; reading paused by aiohttp shows as `transport.is_reading()` False;
  `StreamReader.set_exception` ends a pending body read with that error; the writer's
  `output_size` is 0 until a response byte is out; `keepalive_timeout` closes a connection idle
  that long after its last response, and `keep_alive(True)` stops that timer (also the one it
  starts at the accept).
- http/body.py: `prepare()` sends a StreamResponse's headers, `Transfer-Encoding: chunked` among
  them on HTTP/1.1; frames written to `request.transport` between `prepare()` and `write_eof()` are
  the body; a `web.Response` (`SSEResponse`, made chunked by `enable_chunked_encoding()`) holds its
  headers until its first `write()` and sends them with that chunk in one transport write.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import re
from pathlib import Path
from typing import Any, cast

import aiohttp
import prometheus_client
import pytest
from aiohttp import web

from streamproxy.config import Settings
from streamproxy.http.body import SSE_HEADERS, can_write_direct, sse_response
from streamproxy.http.connection import Connections, Protocol
from streamproxy.http.server import Runner, make_runner
from tests.support import wait_until
from tests.support.served import WriteRecorder, serve_app

VERSION = aiohttp.__version__
PRODUCT = Path(__file__).resolve().parents[2] / "streamproxy"


def params(func: Any) -> list[str]:
    return list(inspect.signature(func).parameters)


# -- no private names ------------------------------------------------------------------------


def _private_names(package: Any) -> set[str]:
    """Every `_name` (not `__dunder__`) aiohttp's own source defines or reads on an object."""
    names: set[str] = set()
    for path in Path(package.__file__).parent.glob("*.py"):
        text = path.read_text()
        names.update(re.findall(r"\.(_[A-Za-z]\w*)", text))
        names.update(re.findall(r"^\s*(?:class|def|async def)\s+(_[A-Za-z]\w*)", text, re.M))
        names.update(re.findall(r"^\s*(_[A-Za-z]\w*)\s*[:=]", text, re.M))
        names.update(re.findall(r"[\"'](_[A-Za-z]\w*)[\"']", text))  # __slots__ entries
    return {n for n in names if not n.endswith("__")}


def _bound_names(tree: ast.Module, package: str) -> set[str]:
    """Names the module binds to `package` at its top (`web` for `from aiohttp import web`, ...)."""
    bound = {package}
    body = list(tree.body)
    for node in body:
        if isinstance(node, ast.If):
            body += node.body + node.orelse  # `if TYPE_CHECKING:`
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(package):
            bound.update(alias.asname or alias.name for alias in node.names)
        elif isinstance(node, ast.Import):
            bound.update(alias.asname or alias.name for alias in node.names if alias.name.startswith(package))
    return bound


def _self_private(cls: ast.ClassDef) -> list[ast.Attribute]:
    return [n for n in ast.walk(cls) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "self"
            and n.attr.startswith("_") and not n.attr.endswith("__")]


def _private_uses(package: Any) -> list[str]:
    """Where streamproxy/ imports one of `package`'s private names, reads or sets `x._name` where `_name`
    is one of its private attributes, or uses `self._x` in a class built on one of its classes."""
    name = package.__name__
    private = _private_names(package)
    found: list[str] = []
    for path in sorted(PRODUCT.rglob("*.py")):
        text = path.read_text()
        touched = private.intersection(re.findall(r"\.(_[A-Za-z]\w*)", text)) or private.intersection(re.findall(r"[\"'](_[A-Za-z]\w*)[\"']", text))
        if name not in text and not touched:
            continue
        tree = ast.parse(text, str(path))
        where = path.relative_to(PRODUCT.parent)
        bound = _bound_names(tree, name)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(name):
                found += [f"{where}:{node.lineno}: imports {node.module}.{a.name}" for a in node.names if a.name.startswith("_")]
            elif isinstance(node, ast.ClassDef) and any(ast.unparse(b).split(".")[0] in bound for b in node.bases):
                # Built on one of its classes: every `self._x` in it is an attribute of its object.
                found += [f"{where}:{a.lineno}: {node.name} uses self.{a.attr}" for a in _self_private(node)]
            elif isinstance(node, ast.Attribute) and node.attr in private:
                if not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                    found.append(f"{where}:{node.lineno}: {ast.unparse(node)} ({node.attr} is a private name of {name}'s)")
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "setattr", "hasattr")
                    and len(node.args) > 1 and isinstance(node.args[1], ast.Constant) and node.args[1].value in private):
                found.append(f"{where}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_private_aiohttp_names_in_the_product() -> None:
    found = _private_uses(aiohttp)
    assert found == [], f"aiohttp {VERSION}: the product reaches into aiohttp's private insides:\n" + "\n".join(found)


def test_no_private_prometheus_client_names_in_the_product() -> None:
    """The same rule for prometheus_client (metrics.py's FileHistogram makes its file-backed values
    with the public `values.ValueClass`, as prometheus_client's Histogram does)."""
    found = _private_uses(prometheus_client)
    assert found == [], "the product reaches into prometheus_client's private insides:\n" + "\n".join(found)


# -- http/server.py and http/connection.py ---------------------------------------------------


def test_the_public_signatures_connection_py_overrides_or_calls() -> None:
    handler = web.RequestHandler
    expected = {
        "connection_made": ["self", "transport"],
        "connection_lost": ["self", "exc"],
        "data_received": ["self", "data"],
        "finish_response": ["self", "request", "resp", "start_time"],
        "handle_error": ["self", "request", "status", "exc", "message"],
        "force_close": ["self"],
        "keep_alive": ["self", "val"],
    }
    for name, names in expected.items():
        assert params(getattr(handler, name)) == names, f"aiohttp {VERSION}: RequestHandler.{name}{inspect.signature(getattr(handler, name))}"
    assert inspect.iscoroutinefunction(handler.finish_response), f"aiohttp {VERSION}: RequestHandler.finish_response is no longer async"
    init = inspect.signature(handler.__init__).parameters
    assert list(init)[:2] == ["self", "manager"] and init["loop"].kind is inspect.Parameter.KEYWORD_ONLY, (
        f"aiohttp {VERSION}: RequestHandler.__init__{inspect.signature(handler.__init__)}"
    )
    for kwarg in ("keepalive_timeout", "access_log", "max_line_size", "max_field_size", "max_headers"):
        assert kwarg in init, f"aiohttp {VERSION}: RequestHandler takes no {kwarg}"
    server = inspect.signature(web.Server.__init__).parameters
    for kwarg in ("handler", "request_factory", "handler_cancellation", "loop"):
        assert kwarg in server, f"aiohttp {VERSION}: web.Server takes no {kwarg}"
    assert params(web.Server.connection_made) == ["self", "handler", "transport"], f"aiohttp {VERSION}: Server.connection_made"
    assert params(web.Server.connection_lost) == ["self", "handler", "exc"], f"aiohttp {VERSION}: Server.connection_lost"
    assert params(web.ServerRunner.__init__)[:2] == ["self", "web_server"], f"aiohttp {VERSION}: ServerRunner.__init__"


async def test_the_app_is_served_through_our_connections_and_request_factory() -> None:
    """The runner's server is ours; aiohttp's site calls it for each connection's protocol; the
    handler made with it takes our request factory (`started`: the phase is busy while the handler
    runs) and the app's handler; the writer handed to the factory is the request's, and its
    `output_size` is 0 until the response starts; after the response the connection is idle."""
    seen: dict[str, Any] = {}

    async def handler(request: web.Request) -> web.StreamResponse:
        protocol = request.protocol
        seen.setdefault("protocols", []).append(protocol)
        seen["app"] = request.app is app
        seen["before"] = request.writer.output_size
        response = web.StreamResponse(headers={"Content-Length": "2"})
        await response.prepare(request)
        seen["after"] = request.writer.output_size
        await response.write(b"ok")
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_get("/", handler)
    runner, port = await serve_app(app)
    assert isinstance(runner, web.ServerRunner) and isinstance(runner.server, Connections)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        for _ in range(2):
            writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            assert head.startswith(b"HTTP/1.1 200 "), head
            assert await asyncio.wait_for(reader.readexactly(2), 10) == b"ok"
        assert len(runner.server.connections) == 1 and runner.server.open_connections == 1
        writer.close()
    finally:
        await runner.cleanup()
    first, second = seen["protocols"]
    assert first is second and isinstance(first, Protocol), f"aiohttp {VERSION}: the site no longer calls runner.server for its protocol"
    assert seen["app"] is True, f"aiohttp {VERSION}: AppRunner.server.request_factory no longer makes the app's requests"
    assert (seen["before"], seen["after"] > 0) == (0, True), f"aiohttp {VERSION}: the writer's output_size: {seen}"


async def test_the_runner_runs_the_apps_shutdown_once_before_its_cleanup() -> None:
    calls: list[str] = []

    async def on_shutdown(app: web.Application) -> None:
        calls.append("shutdown")

    async def on_cleanup(app: web.Application) -> None:
        calls.append("cleanup")

    app = web.Application()
    app.on_shutdown.append(on_shutdown)
    app.on_cleanup.append(on_cleanup)
    runner = make_runner(app, Settings())
    assert isinstance(runner, Runner)
    await runner.setup()
    await runner.cleanup()
    assert calls == ["shutdown", "cleanup"], f"aiohttp {VERSION}: ServerRunner.cleanup: {calls}"


async def test_reading_paused_by_aiohttp_shows_in_the_transport_and_set_exception_ends_a_body_read() -> None:
    """connection.py's body clock restarts while `transport.is_reading()` is False (aiohttp paused
    reading: an unread body over its buffer), and ends a stalled body with `set_exception`."""
    seen: dict[str, Any] = {}

    async def handler(request: web.Request) -> web.StreamResponse:
        transport = request.transport
        assert transport is not None
        seen["paused"] = await wait_until(lambda: not transport.is_reading(), 10)
        request.content.set_exception(TimeoutError("stalled"))
        try:
            while await request.content.read(65536):
                pass
        except TimeoutError as exc:
            seen["raised"] = str(exc)
        return web.Response(text="done", headers={"Connection": "close"})

    app = web.Application()
    app.router.add_post("/", handler)
    runner, port = await serve_app(app, Settings(client_body_timeout=0))
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % (8 << 20))
        writer.write(b"x" * (1 << 20))  # more than aiohttp buffers before it pauses reading; the rest never comes
        await wait_until(lambda: "raised" in seen, 20)
        writer.close()
    finally:
        await runner.cleanup()
    assert seen.get("paused") is True, f"aiohttp {VERSION}: reading was not paused (transport.is_reading()) under an unread body"
    assert seen.get("raised") == "stalled", f"aiohttp {VERSION}: StreamReader.set_exception did not end the body read: {seen}"


async def test_keepalive_timeout_closes_an_idle_connection_and_keep_alive_true_stops_it() -> None:
    """connection.py leaves the time between requests to aiohttp's `keepalive_timeout` (from the end
    of a response) and stops that timer with `keep_alive(True)` where the header timeout applies: at
    the accept (a fresh connection that says nothing gets the header timeout, here the longer one)."""

    async def handler(request: web.Request) -> web.StreamResponse:
        return web.Response(text="ok")

    idle, header = 0.2, 1.0
    app = web.Application()
    app.router.add_get("/", handler)
    runner, port = await serve_app(app, Settings(keepalive_timeout=idle, client_header_timeout=header))
    loop = asyncio.get_running_loop()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        fresh_reader, fresh_writer = await asyncio.open_connection("127.0.0.1", port)
        fresh_from = loop.time()
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)).startswith(b"HTTP/1.1 200 ")
        assert await asyncio.wait_for(reader.readexactly(2), 10) == b"ok"
        idle_from = loop.time()
        assert await asyncio.wait_for(reader.read(), 10) == b""
        idle_for = loop.time() - idle_from
        assert await asyncio.wait_for(fresh_reader.read(), 10) == b""
        fresh_for = loop.time() - fresh_from
        writer.close()
        fresh_writer.close()
    finally:
        await runner.cleanup()
    assert idle - 0.01 <= idle_for < header, f"aiohttp {VERSION}: an idle connection closed after {idle_for:.2f} s, not keepalive_timeout's {idle}"
    assert fresh_for >= header - 0.01, f"aiohttp {VERSION}: keep_alive(True) did not stop the accept's keep-alive timer ({fresh_for:.2f} s)"


# -- http/body.py: public API, behaviour it relies on ------------------------------------------


async def _serve_one(handler: Any, request: bytes) -> bytes:
    app = web.Application()
    app.router.add_get("/", handler)
    runner, port = await serve_app(app)
    try:
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


async def test_a_responses_headers_wait_for_its_first_write_and_leave_with_it() -> None:
    """`writer.SSEResponse` relies on a `web.Response` holding its status line and headers after
    `prepare()` until its first `write()`, which sends them with that chunk in one transport
    write, and on `enable_chunked_encoding()` making it a chunked stream (the same headers a
    StreamResponse sends). Were the headers to leave in `prepare()`, a stream would cost a write
    more; were they to stay after the first write, the frames written straight to the transport
    would go out before them."""
    seen: dict[str, Any] = {}

    async def handler(request: web.Request) -> web.StreamResponse:
        recorder = WriteRecorder(request.protocol.transport)
        request.protocol.transport = cast(asyncio.Transport, recorder)
        response = sse_response(request)
        writer = await response.prepare(request)
        assert writer is not None
        seen["after prepare"] = (writer.output_size, list(recorder.writes))
        await response.write(b"data: x\n\n")
        seen["direct"] = can_write_direct(response, request.transport)
        assert request.transport is not None
        request.transport.write(b"5\r\nhello\r\n")
        await response.write_eof(b"bye")
        seen["writes"] = recorder.writes
        return response

    got = await _serve_one(handler, b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    head, _, body = got.partition(b"\r\n\r\n")
    assert seen["after prepare"] == (0, []), f"aiohttp {VERSION}: a Response sent its headers in prepare(): {seen}"
    assert seen["writes"] == [head + b"\r\n\r\n9\r\ndata: x\n\n\r\n", b"5\r\nhello\r\n", b"3\r\nbye\r\n0\r\n\r\n"], (
        f"aiohttp {VERSION}: a Response's headers did not leave with its first write: {seen['writes']}")
    assert seen["direct"] is True
    lines = head.lower().split(b"\r\n")
    assert lines[0] == b"http/1.1 200 ok" and b"transfer-encoding: chunked" in lines and not any(x.startswith(b"content-length") for x in lines)
    assert body == b"9\r\ndata: x\n\n\r\n5\r\nhello\r\n3\r\nbye\r\n0\r\n\r\n"


@pytest.mark.parametrize("version", ["1.1", "1.0"])
async def test_a_streams_response_sends_the_headers_a_stream_response_sends(version: str) -> None:
    """`sse_response` changes when the headers leave, not what they say: the same bytes as a
    StreamResponse with the SSE headers (the Date aside), on HTTP/1.1 and on HTTP/1.0 (a
    StreamResponse there: no chunks, the body ends with the connection)."""

    async def plain(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers=SSE_HEADERS)
        await response.prepare(request)
        await response.write(b"data: x\n\n")
        await response.write_eof()
        return response

    async def held(request: web.Request) -> web.StreamResponse:
        response = sse_response(request)
        await response.prepare(request)
        await response.write(b"data: x\n\n")
        await response.write_eof()
        return response

    request = f"GET / HTTP/{version}\r\nHost: x\r\nConnection: close\r\n\r\n".encode()
    got = [re.sub(rb"\r\nDate: [^\r]*", b"", await _serve_one(h, request)) for h in (plain, held)]
    assert got[0] == got[1], got
    assert got[0].endswith(b"\r\n\r\n9\r\ndata: x\n\n\r\n0\r\n\r\n" if version == "1.1" else b"\r\n\r\ndata: x\n\n")


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
