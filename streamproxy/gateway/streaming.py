"""Relaying a stream: headers once a replica answered, whole events, heartbeats, in-band errors.

Nothing is sent before a replica answered 200 (failover stays possible) unless
that takes longer than a heartbeat interval (`_Warmer`). Then `SSERelay` passes
whole events. The response is `writer.sse_response`'s, whose status line and
headers wait for its first write: they leave in one write with the events that
came with the replica's head (`Exchange.take`), or alone when none did. After
that, events are written to the client from the replica connection's own data
callback while the client keeps up (`_Sink`, given to `wire.Exchange.stream`:
no task wake-up per event); when the client falls behind, reading from the
replica pauses and the handler writes what is held, bounded by the stall
timeout, then resumes. The replica's last read (its stream complete) is held,
not written: it goes out with the terminating chunk in one write
(`writer.finish_response`), as a broken stream's error event does (the
chunks are the same as when each was written on its own). So a
stream costs the client's socket one write per replica read, no more. The
gateway's heartbeat fills the replica's silences (`keepalive.Ticker`: one
timer per stream; the frames are `http/chunked.py`'s); a replica that breaks
off ends the client's stream with an in-band `upstream_unavailable` event.
"""

from __future__ import annotations

import asyncio
from time import perf_counter
from typing import Any

from aiohttp import web

from streamproxy.errors import APIError, ServiceUnavailable
from streamproxy.gateway.call import BROKEN, Attempt, Call
from streamproxy.gateway.relay import SSERelay
from streamproxy.gateway.upstream import UpstreamError
from streamproxy.gateway.wire import Exchange, UpstreamClosed
from streamproxy.http import keepalive as keepalives
from streamproxy.http.chunked import SIZE_LINES, SIZE_LINES_N, chunk_frame
from streamproxy.http.keepalive import Keepalive, Ticker
from streamproxy.http.metrics import SSE_HEARTBEATS
from streamproxy.http.writer import (
    PUSH_BUFFER_LIMIT,
    WriteStalled,
    can_write_direct,
    client_gone,
    finish_response,
    sse_response,
    writable,
    write,
)

# -- streaming ----------------------------------------------------------------------


async def stream(request: web.Request, call: Call) -> web.StreamResponse:
    settings = call.state.settings
    api = call.route.api
    heartbeat = settings.sse_heartbeat if settings.sse_heartbeat > 0 else None
    stall = settings.write_stall_timeout
    response = sse_response(request)
    transport = request.transport
    loop = asyncio.get_running_loop()  # once per request: each call costs a getpid() system call
    alive = Keepalive(api.keepalive, heartbeat, SSE_HEARTBEATS)
    warm = _Warmer(request, response, transport, alive, stall, loop) if heartbeat else None
    relay_ = SSERelay(api, served=call.pool.deployment.upstream_model, public=call.public_model, strip_usage=call.strip_usage)
    attempt: Attempt | None = None
    outcome: int | None = None
    try:
        async with call.state.inflight.lifetime():
            try:
                attempt = await call.open()
            except APIError as exc:
                if warm is not None:
                    await warm.stop()
                if not response.prepared:
                    raise  # a status of its own: nothing was sent yet
                await _end_with(response, transport, relay_, exc, stall)
                return response
            if warm is not None:
                await warm.stop()
            upstream = attempt.exchange
            outcome = upstream.status
            if upstream.status != 200:
                refused = UpstreamError(upstream.status, call.renamed(await _error_body(upstream)), upstream.headers.get("retry-after"))
                if not response.prepared:
                    raise refused
                await _end_with(response, transport, relay_, refused, stall)
                return response
            if not response.prepared:
                await response.prepare(request)  # the headers wait for the first write
            ended, tail = await _pump(call, attempt, relay_, response, transport, alive, stall, loop)
            if not ended:
                outcome = BROKEN
        await finish_response(response, tail, stall, transport)
    except (WriteStalled, ConnectionResetError) as exc:
        client_gone(request, exc, call.ctx)
    except TimeoutError:  # the drain deadline (the Lifetime)
        if not response.prepared:
            raise ServiceUnavailable("the gateway is shutting down; retry on another instance", code="server_shutting_down") from None
        await _end_with(response, transport, relay_, ServiceUnavailable("the gateway is shutting down", code="server_shutting_down"), stall)
    finally:
        if warm is not None:
            warm.cancel()
        if attempt is not None:
            call.done(attempt, outcome)
    return response


class _Warmer:
    """While no replica has answered: after one interval the headers go out with a heartbeat,
    then a heartbeat per interval (`keepalive.wait` on a future only `stop` ends), from a task
    of its own that only a slow answer ever starts. Before that nothing is sent, so failover
    stays possible and an error keeps its own status."""

    __slots__ = ("request", "response", "transport", "alive", "stall", "_handle", "_task")

    def __init__(self, request: web.Request, response: web.StreamResponse, transport: Any, alive: Keepalive, stall: float,
                 loop: asyncio.AbstractEventLoop) -> None:
        assert alive.interval is not None
        self.request, self.response, self.transport = request, response, transport
        self.alive, self.stall = alive, stall
        self._task: asyncio.Task[None] | None = None
        self._handle: asyncio.TimerHandle | None = loop.call_later(alive.interval, self._start)

    def _start(self) -> None:
        self._handle = None
        self._task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        await self.response.prepare(self.request)
        await self._send(self.alive.beat())
        await keepalives.wait(asyncio.get_running_loop().create_future(), self.alive, self._send)

    async def _send(self, frame: bytes) -> None:
        await write(self.response, self.transport, frame, self.stall)

    async def stop(self) -> None:
        """No more heartbeats; a failure while the headers went out (the client gone) is raised."""
        task = self._task
        self.cancel()
        if task is not None:
            await asyncio.wait([task])
            error = None if task.cancelled() else task.exception()
            if error is not None:
                raise error

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        if self._task is not None:
            self._task.cancel()
            self._task = None


async def _pump(call: Call, attempt: Attempt, relay_: SSERelay, response: web.StreamResponse, transport: Any, alive: Keepalive,
                stall: float, loop: asyncio.AbstractEventLoop) -> tuple[bool, bytes]:
    """Relay until the replica's stream ends: (False, ...) when it broke off; and the bytes
    the response ends with (`finish_response`): the last events, or after a break the error event.

    What came with the replica's head is written first, with the headers (one write). Then,
    while the client keeps up, `_Sink` writes each read's whole events from the replica
    connection's data callback. When it cannot (the client is behind, or the response is
    not plain chunked), reading from the replica pauses, and this loop writes what is held
    with a bounded write and resumes. The heartbeat is one timer per stream (`keepalive.Ticker`);
    a replica silent past the read timeout is `wire`'s."""
    call.usage = relay_.usage
    exchange = attempt.exchange
    sink = _Sink(relay_, exchange, call, attempt, loop)
    beat: Ticker | None = None
    tail = b""
    try:
        came = exchange.take()
        tail = relay_.feed(came) if came else b""
        if not exchange.complete:  # (complete: the whole answer came at once; it is all the tail)
            await write(response, transport, tail, stall)  # the headers, with the first events if they came
            if tail:
                sink.wrote()
            if can_write_direct(response, transport):
                sink.transport = transport
                if alive.interval is not None:
                    beat = sink.beat = Ticker(transport, alive, loop, writable)
            tail = b""  # written: should `_follow` raise, the break's handler has nothing left to send
            tail = await _follow(exchange, sink, response, transport, alive, stall,
                                 alive.interval if beat is None else None)  # no direct writes: a timer around each wait
        if tail:
            sink.wrote()
        if relay_.done:
            return True, tail
        raise _Broken("the replica ended the stream before its end")
    except (_Broken, UpstreamClosed) as exc:
        reason = str(exc) if isinstance(exc, _Broken) else f"the replica's stream broke off: {exc}"
        error = ServiceUnavailable(f"{reason}; the answer is incomplete", code="upstream_unavailable")
        call.ctx.fail(error.code)
        if tail:  # the events that came before the break, in their own chunk as they came
            await write(response, transport, tail, stall)
            sink.wrote()
        return False, relay_.error(error)
    finally:
        if beat is not None:
            beat.stop()
        if not relay_.usage.billed:
            relay_.counted()


async def _follow(exchange: Exchange, sink: _Sink, response: web.StreamResponse, transport: Any, alive: Keepalive,
                  stall: float, slow_beat: float | None) -> bytes:
    """Until the replica's answer is complete: what the sink held (the client behind) is written,
    bounded, and reading resumes; with `slow_beat`, a heartbeat per silent interval. The replica's
    last read, held, is returned: it goes out with the terminating chunk."""
    exchange.stream(sink)
    while True:
        if slow_beat is None:
            await exchange.wait()
        else:
            try:
                async with asyncio.timeout(slow_beat):
                    await exchange.wait()
            except TimeoutError:
                await write(response, transport, alive.beat(), stall)
                continue
        if sink.held:
            held = b"".join(sink.held)
            sink.held.clear()
            if exchange.complete:
                return held
            await write(response, transport, held, stall)
            sink.wrote()
        if exchange.complete:
            return b""
        exchange.resume()


class _Sink:
    """The replica's body pieces, from its connection's data callback: whole events out, written
    straight to the client's transport while it keeps up (`transport` set: the headers are out);
    else held (and False: pause reading). The last read (the replica's answer complete) is held
    too: it ends the response with the terminating chunk. After each write: the heartbeat's
    deadline, and the first event's times."""

    __slots__ = ("relay", "transport", "parser", "held", "beat", "loop", "first", "call", "attempt")

    def __init__(self, relay: SSERelay, exchange: Exchange, call: Call, attempt: Attempt, loop: asyncio.AbstractEventLoop) -> None:
        self.relay, self.call, self.attempt = relay, call, attempt
        self.transport: Any = None
        self.beat: Ticker | None = None
        self.parser = exchange.parser  # its `complete`, read per piece
        self.held: list[bytes] = []
        self.loop = loop
        self.first = True

    def __call__(self, data: bytes) -> bool:
        out = self.relay.feed(data)
        if not out:
            return True
        transport = self.transport
        if (transport is not None and not self.held and not self.parser.complete
                and transport.get_write_buffer_size() <= PUSH_BUFFER_LIMIT and not transport.is_closing()):
            size = len(out)  # chunk_frame, inlined (once per read) as the writer's push does
            transport.write(b"".join((SIZE_LINES[size], out, b"\r\n")) if size < SIZE_LINES_N else chunk_frame(out))
            if self.beat is not None:
                self.beat.last = self.loop.time()
            if self.first:
                self.wrote()
            return True
        self.held.append(out)
        return False

    def wrote(self) -> None:
        if self.beat is not None:
            self.beat.last = self.loop.time()
        if self.first:
            self.first = False
            now = perf_counter()
            self.call.ctx.first_token(now)
            self.call.pool.series.ttft.observe(now - self.attempt.sent_at)


async def _error_body(exchange: Any) -> bytes:
    try:
        return await exchange.read()
    except UpstreamClosed:
        return b""


class _Broken(Exception):
    pass


async def _end_with(response: web.StreamResponse, transport: Any, relay_: SSERelay, exc: APIError, stall: float) -> None:
    await finish_response(response, relay_.error(exc), stall, transport)
