"""Relaying a stream: headers once a replica answered, whole events, heartbeats, in-band errors.

Nothing is sent before a replica answered 200 (failover stays possible) unless
that takes longer than a heartbeat interval (`_Warmer`). Then `SSERelay` passes
whole events: written to the client from the replica connection's own data
callback while the client keeps up (`_Sink`, given to `wire.Exchange.stream`:
no task wake-up per event); when the client falls behind, reading from the
replica pauses and the handler writes what is held, bounded by the stall
timeout, then resumes. The gateway's heartbeat fills the replica's silences
(one timer per stream); a replica that breaks off ends the client's stream
with an in-band `upstream_unavailable` event.
"""

from __future__ import annotations

import asyncio
from time import perf_counter
from typing import Any

from aiohttp import web

from streamproxy.errors import APIError, ServiceUnavailable
from streamproxy.gateway.call import BROKEN, Call, done, open_call
from streamproxy.gateway.relay import Api, SSERelay, error_event, keepalive
from streamproxy.gateway.upstream import Attempt, UpstreamError
from streamproxy.gateway.wire import UpstreamClosed
from streamproxy.http.metrics import SSE_HEARTBEATS
from streamproxy.http.writer import (
    PUSH_BUFFER_LIMIT,
    SSE_HEADERS,
    WriteStalled,
    can_write_direct,
    chunk_frame,
    client_gone,
    writable,
    write,
)

# -- streaming ----------------------------------------------------------------------


async def stream(request: web.Request, call: Call) -> web.StreamResponse:
    settings = call.state.settings
    api = call.route.api
    heartbeat = settings.sse_heartbeat if settings.sse_heartbeat > 0 else None
    stall = settings.write_stall_timeout
    response = web.StreamResponse(headers=SSE_HEADERS)
    transport = request.transport
    loop = asyncio.get_running_loop()  # once per request: each call costs a getpid() system call
    warm = _Warmer(request, response, transport, keepalive(api), heartbeat, stall, loop) if heartbeat else None
    attempt: Attempt | None = None
    outcome: int | None = None
    try:
        async with call.state.inflight.lifetime():
            try:
                attempt = await open_call(call)
            except APIError as exc:
                if warm is not None:
                    await warm.stop()
                if not response.prepared:
                    raise  # a status of its own: nothing was sent yet
                await _end_with(response, transport, api, exc, stall)
                return response
            if warm is not None:
                await warm.stop()
            upstream = attempt.exchange
            outcome = upstream.status
            if upstream.status != 200:
                refused = UpstreamError(upstream.status, call.renamed(await _error_body(upstream)), upstream.headers.get("retry-after"))
                if not response.prepared:
                    raise refused
                await _end_with(response, transport, api, refused, stall)
                return response
            if not response.prepared:
                await response.prepare(request)
            if not await _pump(call, attempt, response, transport, heartbeat, stall, loop):
                outcome = BROKEN
        await response.write_eof()
    except (WriteStalled, ConnectionResetError) as exc:
        client_gone(request, exc, call.rec)
    except TimeoutError:  # the drain deadline (the Lifetime)
        if not response.prepared:
            raise ServiceUnavailable("the gateway is shutting down; retry on another instance", code="server_shutting_down") from None
        await _end_with(response, transport, api, ServiceUnavailable("the gateway is shutting down", code="server_shutting_down"), stall)
    finally:
        if warm is not None:
            warm.cancel()
        if attempt is not None:
            done(call, attempt, outcome)
    return response


class _Warmer:
    """While no replica has answered: after `interval` s the headers go out, then a heartbeat
    every `interval` s, from a task of its own that only a slow answer ever starts. Before
    that nothing is sent, so failover stays possible and an error keeps its own status."""

    __slots__ = ("request", "response", "transport", "frame", "interval", "stall", "_handle", "_task")

    def __init__(self, request: web.Request, response: web.StreamResponse, transport: Any, frame: bytes, interval: float, stall: float,
                 loop: asyncio.AbstractEventLoop) -> None:
        self.request, self.response, self.transport = request, response, transport
        self.frame, self.interval, self.stall = frame, interval, stall
        self._task: asyncio.Task[None] | None = None
        self._handle: asyncio.TimerHandle | None = loop.call_later(interval, self._start)

    def _start(self) -> None:
        self._handle = None
        self._task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        await self.response.prepare(self.request)
        while True:
            await write(self.response, self.transport, self.frame, self.stall)
            await asyncio.sleep(self.interval)

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


async def _pump(call: Call, attempt: Attempt, response: web.StreamResponse, transport: Any, heartbeat: float | None, stall: float,
                loop: asyncio.AbstractEventLoop) -> bool:
    """Relay until the replica's stream ends; False when it broke off (an error event is sent).

    While the client keeps up, `_Sink` writes each read's whole events from the replica
    connection's data callback. When it cannot (the client is behind, or the response is
    not plain chunked), reading from the replica pauses, and this loop writes what is held
    with a bounded write and resumes. The heartbeat is one timer per stream (`_Heartbeat`);
    a replica silent past the read timeout is `wire`'s."""
    api = call.route.api
    relay_ = SSERelay(api, served=call.pool.deployment.upstream_model, public=call.public_model, strip_usage=call.strip_usage)
    call.usage = relay_.usage
    exchange = attempt.exchange
    direct = can_write_direct(response, transport)
    beat = _Heartbeat(transport, keepalive(api), heartbeat, loop) if heartbeat and direct else None
    slow_beat = heartbeat if beat is None else None  # no direct writes: a timer around each wait
    sink = _Sink(relay_, transport if direct else None, call, attempt, beat, loop)
    try:
        exchange.stream(sink)
        while True:
            if slow_beat is None:
                await exchange.wait()
            else:
                try:
                    async with asyncio.timeout(slow_beat):
                        await exchange.wait()
                except TimeoutError:
                    await write(response, transport, keepalive(api), stall)
                    continue
            if sink.held:
                held = b"".join(sink.held)
                sink.held.clear()
                await write(response, transport, held, stall)
                sink.wrote()
            if exchange.complete:
                break
            exchange.resume()
        if relay_.done:
            return True
        raise _Broken("the replica ended the stream before its end")
    except (_Broken, UpstreamClosed) as exc:
        reason = str(exc) if isinstance(exc, _Broken) else f"the replica's stream broke off: {exc}"
        error = ServiceUnavailable(f"{reason}; the answer is incomplete", code="upstream_unavailable")
        call.rec.error_code = error.code
        await write(response, transport, error_event(api, error, relay_.events), stall)
        return False
    finally:
        if beat is not None:
            beat.stop()
        if not relay_.usage.billed:
            relay_.counted()


class _Sink:
    """The replica's body pieces, from its connection's data callback: whole events out, written
    straight to the client's transport while it keeps up; else held (and False: pause reading).
    After each write: the heartbeat's deadline, and the first event's times."""

    __slots__ = ("relay", "transport", "held", "beat", "loop", "first", "call", "attempt")

    def __init__(self, relay: SSERelay, transport: Any, call: Call, attempt: Attempt, beat: _Heartbeat | None,
                 loop: asyncio.AbstractEventLoop) -> None:
        self.relay, self.transport, self.call, self.attempt, self.beat = relay, transport, call, attempt, beat
        self.held: list[bytes] = []
        self.loop = loop
        self.first = True

    def __call__(self, data: bytes) -> bool:
        out = self.relay.feed(data)
        if not out:
            return True
        transport = self.transport
        if transport is not None and not self.held and transport.get_write_buffer_size() <= PUSH_BUFFER_LIMIT and not transport.is_closing():
            transport.write(b"%x\r\n%b\r\n" % (len(out), out))  # chunk_frame, inlined: once per read
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
            self.call.rec.first_token(now)
            self.call.pool.series.ttft.observe(now - self.attempt.sent_at)


async def _error_body(exchange: Any) -> bytes:
    try:
        return await exchange.read()
    except UpstreamClosed:
        return b""


class _Heartbeat:
    """A keepalive frame after `interval` seconds without a write, from one timer per stream.

    The timer fires once per interval and writes only if the stream was silent that
    long and the transport can take it; the relay loop just notes the time of each write."""

    __slots__ = ("transport", "frame", "interval", "loop", "last", "_handle")

    def __init__(self, transport: Any, frame: bytes, interval: float, loop: asyncio.AbstractEventLoop) -> None:
        self.transport = transport
        self.frame = chunk_frame(frame)
        self.interval = interval
        self.loop = loop
        self.last = self.loop.time()
        self._handle: asyncio.TimerHandle | None = self.loop.call_at(self.last + interval, self._fire)

    def _fire(self) -> None:
        now = self.loop.time()
        due = self.last + self.interval
        if now >= due and self.transport is not None and writable(self.transport):
            self.transport.write(self.frame)
            SSE_HEARTBEATS.inc()
            self.last, due = now, now + self.interval
        self._handle = self.loop.call_at(max(due, now + 0.001), self._fire)

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None


class _Broken(Exception):
    pass


async def _end_with(response: web.StreamResponse, transport: Any, api: Api, exc: APIError, stall: float) -> None:
    await write(response, transport, error_event(api, exc), stall)
    await response.write_eof()
