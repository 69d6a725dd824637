"""A request's handler runs in its connection's task (http/connection.py `HandlerLoop`).

aiohttp on Python 3.11 starts each request's handler in a new task: one more
turn of the event loop between a request's bytes and its handler, and under
load a turn waits behind every other connection's I/O. We hand aiohttp the
coroutine back instead; these tests pin that the handler runs in the
connection's own task, and that what the separate task was good for still
holds: a client that leaves cancels the handler, and the next request on a
kept-alive connection is served.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import pytest
from aiohttp import web

from tests.support.served import serve_app

pytestmark = pytest.mark.skipif(sys.version_info >= (3, 12), reason="3.12+: aiohttp starts handlers eagerly itself")


async def _serve(handler: Any) -> tuple[web.BaseRunner, int]:
    """`handler` at GET / on our server (its connection handler), on a free port."""
    app = web.Application()
    app.router.add_get("/", handler)
    return await serve_app(app)


async def test_handler_runs_in_the_connections_task_for_each_request_on_the_connection():
    seen: list[tuple[bool, int]] = []

    async def handler(request: web.Request) -> web.Response:
        task = asyncio.current_task()
        seen.append((task is request.task, id(task)))
        return web.Response(text="ok")

    runner, port = await _serve(handler)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        for _ in range(2):
            writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            head = await reader.readuntil(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200 "), head
            assert await reader.readexactly(2) == b"ok"
        writer.close()
    finally:
        await runner.cleanup()
    assert [inline for inline, _ in seen] == [True, True]
    assert seen[0][1] == seen[1][1]  # one task per connection, not per request


async def test_a_client_that_leaves_cancels_its_handler():
    started, cancelled = asyncio.Event(), asyncio.Event()

    async def handler(request: web.Request) -> web.StreamResponse:
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return web.Response(text="late")

    runner, port = await _serve(handler)
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        async with asyncio.timeout(5):
            await started.wait()
        writer.close()
        async with asyncio.timeout(5):
            await cancelled.wait()
    finally:
        await runner.cleanup()
