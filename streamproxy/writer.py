"""The only code that writes a generation to the socket.

`pump_sse` owns the StreamResponse of a streaming request: headers go out
before anything is asked of the engine's output, then one write per engine
step (everything pending is taken at once, so a slow socket coalesces steps
instead of queueing them). While nothing arrives, a deadline on the wait
(not a task) sends an SSE keepalive comment every `heartbeat` seconds. A
write that cannot drain within `stall_timeout` ends the stream.

`collect` drives a non-streaming request to its end and hands the finished
accumulator back; `respond_nonstream` turns that into a JSON response, or,
when the answer takes long, sends the 200 early and keeps the connection
alive with newlines (JSON allows leading whitespace) until the body is ready.

Neither aborts the engine request: the route does that in a `finally`, so
every way out (end, error, disconnect, cancellation) is covered once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from aiohttp import web

from engine_adapter.base import EngineFailure, OutputStream

from . import sse
from .errors import APIError, EngineError, GenerationTimeout
from .stream import StreamEncoder

log = logging.getLogger("streamproxy.writer")

SSE_HEADERS = {
    "Content-Type": "text/event-stream",
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",
    "Connection": "keep-alive",
}


class StreamOutcome:
    __slots__ = ("finished", "error", "heartbeats")

    def __init__(self) -> None:
        self.finished = False
        self.error: APIError | None = None
        self.heartbeats = 0


class WriteStalled(Exception):
    """The client stopped reading for longer than the write-stall timeout."""


def engine_error(exc: BaseException) -> APIError:
    if isinstance(exc, APIError):
        return exc
    return EngineError(f"generation failed: {exc}" if isinstance(exc, EngineFailure) else "generation failed")


async def _write(response: web.StreamResponse, transport: asyncio.BaseTransport | None, data: bytes, stall: float) -> None:
    # Only a write behind an unflushed buffer can block; bound just those.
    if transport is not None and transport.get_write_buffer_size() > 0:  # type: ignore[attr-defined]
        try:
            async with asyncio.timeout(stall):
                await response.write(data)
        except TimeoutError:
            raise WriteStalled from None
    else:
        await response.write(data)


async def wait_with_heartbeat(response: web.StreamResponse, waitable: Any, heartbeat: float) -> int:
    """Await `waitable` (cancel-safe), sending a keepalive comment per silent `heartbeat`."""
    beats = 0
    fut = asyncio.ensure_future(waitable)
    try:
        while True:
            try:
                async with asyncio.timeout(heartbeat if heartbeat > 0 else None):
                    await asyncio.shield(fut)
                return beats
            except TimeoutError:
                beats += 1
                await response.write(sse.KEEPALIVE)
    finally:
        if not fut.done():
            fut.cancel()


async def pump_sse(
    request: web.Request,
    response: web.StreamResponse,
    out: OutputStream,
    encoder: StreamEncoder,
    *,
    heartbeat: float,
    stall_timeout: float,
    on_first_token: Callable[[], Any] | None = None,
) -> StreamOutcome:
    """Write the stream until the engine is done; the response is already prepared."""
    outcome = StreamOutcome()
    transport = request.transport
    encoder.prompt_tokens = out.prompt_tokens
    first = encoder.start()
    if first:
        await _write(response, transport, first, stall_timeout)
    try:
        while True:
            deltas = out.get_nowait()
            if deltas is None:
                if heartbeat > 0:
                    try:
                        async with asyncio.timeout(heartbeat):
                            deltas = await out.get()
                    except TimeoutError:
                        outcome.heartbeats += 1
                        await _write(response, transport, sse.KEEPALIVE, stall_timeout)
                        continue
                else:
                    deltas = await out.get()
            if on_first_token is not None:
                on_first_token()
                on_first_token = None
            encoder.prompt_tokens = out.prompt_tokens
            data = encoder.step(deltas)
            if data:
                await _write(response, transport, data, stall_timeout)
    except StopAsyncIteration:
        encoder.prompt_tokens = out.prompt_tokens
        encoder.cached_tokens = out.cached_tokens
        outcome.finished = True
        await _write(response, transport, encoder.finish(), stall_timeout)
    except (EngineFailure, APIError) as exc:
        outcome.error = engine_error(exc)
        await _write(response, transport, encoder.error(outcome.error), stall_timeout)
    return outcome


async def collect(out: OutputStream, sink: Any) -> None:
    """Feed every step into `sink.step(deltas)` until the engine is done."""
    try:
        while True:
            deltas = out.get_nowait()
            if deltas is None:
                deltas = await out.get()
            sink.step(deltas)
    except StopAsyncIteration:
        sink.prompt_tokens = out.prompt_tokens
        sink.cached_tokens = out.cached_tokens
    except EngineFailure as exc:
        raise engine_error(exc) from exc


async def respond_nonstream(
    request: web.Request,
    work: asyncio.Future[bytes],
    *,
    keepalive_after: float,
    keepalive_interval: float,
    request_timeout: float,
    headers: dict[str, str],
) -> web.StreamResponse:
    """Answer with the JSON `work` resolves to; keep the connection alive if it is slow.

    `work` raising an APIError before `keepalive_after` becomes an ordinary
    error response (the middleware renders it); after the early 200 it is
    written into the body as `{"error": ...}`.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + request_timeout
    try:
        async with asyncio.timeout(min(keepalive_after, request_timeout)):
            body = await asyncio.shield(work)
    except TimeoutError:
        pass
    else:
        return web.Response(body=body, content_type="application/json", headers=headers)
    if loop.time() >= deadline:
        work.cancel()
        raise GenerationTimeout(f"generation did not finish within {request_timeout:g} seconds")
    response = web.StreamResponse(status=200, headers={**headers, "Content-Type": "application/json"})
    await response.prepare(request)
    while True:
        wait = min(keepalive_interval, deadline - loop.time())
        try:
            async with asyncio.timeout(max(wait, 0)):
                body = await asyncio.shield(work)
            break
        except TimeoutError:
            if loop.time() >= deadline:
                work.cancel()
                body = GenerationTimeout(f"generation did not finish within {request_timeout:g} seconds").to_json()
                break
            await response.write(b"\n")
        except APIError as exc:
            body = exc.to_json()
            break
    await response.write(body)
    await response.write_eof()
    return response
