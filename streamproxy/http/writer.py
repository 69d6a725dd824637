"""The only code that writes a stream to the socket (and the write primitives `nonstream` shares).

`pump_sse` owns the StreamResponse of a streaming request: headers go out
before anything is asked of the engine's output (in `prepare()`, or with the encoder's
first frame when the response is `sse_response`'s `SSEResponse`), then one write per engine
step (everything pending is taken at once, so a slow socket coalesces steps
instead of queueing them). Heartbeats are a deadline, not a task: the wait
for the next step is bounded by `last write + heartbeat` (`keepalive.Keepalive`,
which also names the bytes: the encoder's keepalive), and when it passes
(or when steps arrive but write nothing, e.g. a filter holding text back) a
keepalive goes out, so the connection is never silent for longer than
`heartbeat` seconds from the moment the headers are out.

Writes are bounded by `stall_timeout` whenever they can block: aiohttp only
waits in `write()` when the transport's buffer is over its high-water mark,
which needs either bytes already queued or one large write; the common case
(an empty buffer, a small chunk) pays for no timer. A stalled write raises
`WriteStalled`. So what a client that stops reading can pin in server memory
is bounded: the transport buffer (aiohttp drains once 64 KiB have been
written since the last drain; the transport pauses above its 64 KiB
high-water mark) plus the engine output produced during `stall_timeout`.

Push (the common path): while nothing is pending and the transport's
buffer is small, the stream is armed with a sink (`_Pump.push`) and the engine's
own step calls it synchronously: encode the step, one `transport.write` of
the chunked-encoding frame (`chunked.py`). aiohttp sent the status line and
headers (in `prepare()`, or an SSEResponse's with the first write), saying
`Transfer-Encoding: chunked` (`can_write_direct` reads that, with the response's
public `prepared` and `compression`: no private aiohttp field); the handler ends
with `write_eof`, so aiohttp writes the last chunk. No task, future, timer or aiohttp call per token; the handler sleeps on
one wait bounded by the heartbeat deadline, so it wakes once per heartbeat
interval, not per token. It falls back to the pull loop above (coalescing,
write-stall bound) when the sink refuses (buffer above `PUSH_BUFFER_LIMIT`: a
slow reader; transport closing) or raises (logged; the stream ends with an
in-band error), and re-arms once it has caught up. Every other exit (end,
engine error, drain and timeout via the Lifetime, disconnect) goes through the
handler exactly as in pull mode, and the sink is disarmed first.

The non-streaming answer is `nonstream.py`'s. Neither aborts the engine request: the route does that in a `finally`, so
every way out (end, error, disconnect, timeout, drain) is covered once.
"""

from __future__ import annotations

import asyncio
import logging
from functools import partial
from time import perf_counter
from typing import TYPE_CHECKING, Any

from aiohttp import hdrs, web

from engine_adapter.base import Delta, EngineFailure, EngineRejected, OutputStream, PushFailed
from streamproxy.core import sse
from streamproxy.core.stream import StreamEncoder
from streamproxy.errors import APIError, EngineError, InternalError, InvalidRequest, ServiceUnavailable
from streamproxy.http import keepalive as keepalives
from streamproxy.http.chunked import SIZE_LINES, SIZE_LINES_N, chunk_frame
from streamproxy.http.keepalive import Keepalive
from streamproxy.http.metrics import INTER_TOKEN_LATENCY, SSE_HEARTBEATS, WRITE_STALLS

if TYPE_CHECKING:
    from streamproxy.http.context import RequestContext

log = logging.getLogger("streamproxy.writer")

SSE_HEADERS = {
    "Content-Type": "text/event-stream",
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",
    "Connection": "keep-alive",
}
# A write this small into an empty transport buffer cannot reach the
# high-water mark, so it cannot block: no timer for it.
_UNBOUNDED_WRITE = 16 * 1024
# Push while the transport holds at most this many unsent bytes (the kernel's
# socket buffer is full beyond it): above, the client is behind and the writer
# pulls, coalescing steps, with its write-stall bound, until it catches up.
PUSH_BUFFER_LIMIT = 8 * 1024


class StreamOutcome:
    __slots__ = ("finished", "error", "heartbeats", "tail")

    def __init__(self) -> None:
        self.finished = False
        self.error: APIError | None = None
        self.heartbeats = 0
        # The stream's last frames (usage, [DONE]): they go out with the
        # terminating chunk in one write (`finish_response`).
        self.tail = b""


class SSEResponse(web.Response):
    """A stream's response whose status line and headers wait for its first write (or its end),
    so they leave in one `transport.write` with the first frames: one system call fewer per stream.
    A `web.Response` holds its headers for its body (aiohttp's behaviour, named in
    tests/unit/test_aiohttp_behaviour.py); `enable_chunked_encoding()` (by `sse_response`) makes
    it a stream. It never has a `body`: `write_eof(data)` takes the last frames as a
    StreamResponse's does, so they go out with the terminating chunk in one write."""

    async def write_eof(self, data: bytes = b"") -> None:
        await web.StreamResponse.write_eof(self, data)


def sse_response(request: web.BaseRequest) -> web.StreamResponse:
    """The response of a stream: an `SSEResponse` (chunked, headers with the first write) on
    HTTP/1.1; on HTTP/1.0, which has no chunked encoding (the body ends with the connection), a
    StreamResponse, whose headers go out in `prepare()`. The caller writes (`write`, or an empty
    one to send the headers alone) before any frame goes straight to the transport (`can_write_direct`)."""
    if request.version >= (1, 1):
        response = SSEResponse(headers=SSE_HEADERS)
        response.enable_chunked_encoding()
        return response
    return web.StreamResponse(headers=SSE_HEADERS)


async def finish_response(response: web.StreamResponse, tail: bytes, stall: float, transport: Any = None) -> None:
    """The last frames and the terminating chunk in one write (`write_eof(tail)`), bounded by
    `stall` when it could block (as `write`; without `transport`, always)."""
    if transport is not None and transport.get_write_buffer_size() == 0 and len(tail) <= _UNBOUNDED_WRITE:
        await response.write_eof(tail)  # cannot block: no timer
        return
    try:
        async with asyncio.timeout(stall):
            await response.write_eof(tail)
    except TimeoutError:
        raise WriteStalled from None


class WriteStalled(Exception):
    """The client stopped reading for longer than the write-stall timeout."""


def engine_error(exc: BaseException) -> APIError:
    """What the client is told of an engine's error for one request (as vLLM's error handler maps
    its exceptions): its refusal of the request a 400, a failure it asks to retry a 503, else a 500."""
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, EngineRejected):
        return InvalidRequest(str(exc), param=exc.param)
    if isinstance(exc, EngineFailure):
        if exc.retryable:
            return ServiceUnavailable(f"generation failed: {exc}", code=exc.code or "engine_unavailable", should_retry=True)
        return EngineError(f"generation failed: {exc}")
    return EngineError("generation failed")


async def write(response: web.StreamResponse, transport: asyncio.Transport | None, data: bytes, stall: float) -> None:
    """`response.write(data)`, bounded by `stall` seconds when it could block."""
    if stall > 0 and transport is not None and (transport.get_write_buffer_size() > 0 or len(data) > _UNBOUNDED_WRITE):
        try:
            async with asyncio.timeout(stall):
                await response.write(data)
        except TimeoutError:
            raise WriteStalled from None
    else:
        await response.write(data)


async def wait_with_heartbeat(
    response: web.StreamResponse,
    transport: asyncio.Transport | None,
    waitable: Any,
    heartbeat: float,
    stall: float,
    keepalive: bytes = sse.KEEPALIVE,
) -> int:
    """Await `waitable` (cancel-safe), sending `keepalive` (the encoder's, e.g. Anthropic's ping) per silent
    `heartbeat`; how many went out."""
    alive = Keepalive(keepalive, heartbeat, SSE_HEARTBEATS)
    fut = asyncio.ensure_future(waitable)
    try:
        await keepalives.wait(fut, alive, partial(write, response, transport, stall=stall))
        fut.result()  # its error, if any, is the caller's
        return alive.sent
    finally:
        if not fut.done():
            fut.cancel()


class _Pump:
    """One stream's write state, shared by the push sink and the pull loop.

    `push` is the sink: called by the producer (`DeltaQueue.put` or vLLM's
    collector hook, in the engine's step) while armed, it encodes the step
    and hands one chunked-encoding frame to the transport, synchronously. It
    refuses (False: the writer pulls instead) when the transport holds more
    than `PUSH_BUFFER_LIMIT` unsent bytes or is closing. The bytes handed over
    are a fresh object, never touched again. (A bound method, not `__call__`:
    calling an instance goes through a slower slot, once per chunk.)
    """

    __slots__ = ("out", "encoder", "transport", "record", "written_at", "last_text_at", "pushed")

    def __init__(self, out: OutputStream, encoder: StreamEncoder, transport: Any, record: RequestContext | None) -> None:
        self.out = out
        self.encoder = encoder
        self.transport = transport
        self.record = record
        self.written_at = perf_counter()  # the last write of any kind (heartbeat deadline)
        self.last_text_at: float | None = None  # the last write that carried tokens
        self.pushed = 0  # steps written by the sink (tests, profiles)

    def push(self, deltas: list[Delta]) -> bool:
        transport = self.transport
        if transport.get_write_buffer_size() > PUSH_BUFFER_LIMIT or transport.is_closing():
            return False
        encoder = self.encoder
        encoder.prompt_tokens = self.out.prompt_tokens
        data = encoder.step(deltas)
        self.pushed += 1
        if data:
            size = len(data)
            # chunk_frame, inlined (once per token): one join, the size line from the table.
            transport.write(b"".join((SIZE_LINES[size], data, b"\r\n")) if size < SIZE_LINES_N else chunk_frame(data))
            if len(deltas) == 1:  # `wrote`, inlined for the common step
                now = self.written_at = perf_counter()
                tokens = deltas[0].num_tokens
                if tokens > 0:
                    last = self.last_text_at
                    if last is None:
                        if self.record is not None:
                            self.record.first_token(now)
                    else:
                        INTER_TOKEN_LATENCY.observe((now - last) / tokens)
                    self.last_text_at = now
            else:
                self.wrote(deltas)
        return True

    def wrote(self, deltas: list[Delta]) -> None:
        """`deltas`' bytes are out: heartbeat deadline, time to first token, inter-token latency."""
        now = self.written_at = perf_counter()
        tokens = deltas[0].num_tokens if len(deltas) == 1 else sum(d.num_tokens for d in deltas)
        if tokens > 0:
            # Edge latency, once per write (not per token); perf_counter
            # because uvloop's loop.time() only has milliseconds.
            last = self.last_text_at
            if last is None:
                if self.record is not None:
                    self.record.first_token(now)
            else:
                INTER_TOKEN_LATENCY.observe((now - last) / tokens)
            self.last_text_at = now


def writable(transport: Any) -> bool:
    """The transport can take a direct write now: not closing, and not behind (a slow reader)."""
    return transport.get_write_buffer_size() <= PUSH_BUFFER_LIMIT and not transport.is_closing()


def can_write_direct(response: web.StreamResponse, transport: Any) -> bool:
    """Frames may go straight to the transport: the response is prepared (aiohttp sends a
    StreamResponse's status line and headers in `prepare()`; an `SSEResponse`'s with its first
    `write`, which the caller has made), its body is chunked (the `Transfer-Encoding` it sent
    says so: an HTTP/1.0 client gets a close-delimited body instead) and not compressed. The
    caller has not ended it (`write_eof`)."""
    if transport is None or transport.is_closing() or not response.prepared or response.compression:
        return False
    return response.headers.get(hdrs.TRANSFER_ENCODING, "").lower() == "chunked"


async def pump_sse(
    request: web.Request,
    response: web.StreamResponse,
    out: OutputStream,
    encoder: StreamEncoder,
    *,
    heartbeat: float,
    stall_timeout: float,
    outcome: StreamOutcome | None = None,
    record: RequestContext | None = None,
    push: bool = True,
) -> StreamOutcome:
    """Write the stream until the engine is done; the response is already prepared.

    `outcome` (made here when not given) is filled in as the stream goes, so
    a caller whose lifetime ends the pump early still knows what happened.
    With `push`, whenever nothing is pending and the socket keeps up, the
    stream is armed with the sink (`_Pump.push`) and this task sleeps until the
    end, a fallback, or the heartbeat deadline; otherwise it pulls.
    """
    if outcome is None:
        outcome = StreamOutcome()
    transport = request.transport
    # The encoder's keepalive: an SSE comment, or its API's own event (Anthropic's `ping`).
    alive = Keepalive(encoder.keepalive, heartbeat, SSE_HEARTBEATS)
    encoder.prompt_tokens = out.prompt_tokens
    first = encoder.start()
    # The headers leave now (an `SSEResponse` holds them for its first write): with the first
    # frame, or alone (an empty write; nothing at all once they are out).
    await write(response, transport, first, stall_timeout)
    del first  # sent: not kept while the stream waits
    pump = _Pump(out, encoder, transport, record)
    # Push only onto a transport that takes our chunked frames as they are.
    push_to = transport if push and can_write_direct(response, transport) else None
    try:
        while True:
            deltas = out.get_nowait()
            if deltas is None:
                if push_to is not None and push_to.get_write_buffer_size() <= PUSH_BUFFER_LIMIT:
                    out.arm(pump.push)
                silent_for = alive.due_in(pump.written_at, perf_counter())
                if silent_for is None:
                    deltas = await out.get()
                else:
                    if silent_for <= 0.0:
                        await _heartbeat(response, transport, alive, stall_timeout, outcome, pump)
                        continue
                    # Woken by output or by the deadline: the top of the loop takes what is
                    # pending, or sees that nothing was written meanwhile (heartbeat).
                    await out.wait(silent_for)
                    continue
            # Pull: the sink is disarmed (or was never armed); everything pending at once.
            encoder.prompt_tokens = out.prompt_tokens
            data = encoder.step(deltas)
            if data:
                await write(response, transport, data, stall_timeout)
                pump.wrote(deltas)
            elif alive.due(pump.written_at, perf_counter()):
                # Steps arrive but write nothing (text held back): still no silence.
                await _heartbeat(response, transport, alive, stall_timeout, outcome, pump)
    except StopAsyncIteration:
        encoder.prompt_tokens = out.prompt_tokens
        encoder.cached_tokens = out.cached_tokens
        outcome.finished = True
        outcome.tail = encoder.finish()
    except (EngineFailure, EngineRejected, APIError) as exc:
        outcome.error = engine_error(exc)
        await write(response, transport, encoder.error(outcome.error), stall_timeout)
    except PushFailed as exc:
        log.error("request %s: writing a step failed", record and record.request_id, exc_info=exc.__cause__)
        outcome.error = InternalError("the server failed while streaming this response")
        await write(response, transport, encoder.error(outcome.error), stall_timeout)
    finally:
        if push_to is not None:
            out.disarm()
    return outcome


async def _heartbeat(
    response: web.StreamResponse, transport: Any, alive: Keepalive, stall: float, outcome: StreamOutcome, pump: _Pump
) -> None:
    outcome.heartbeats += 1
    await write(response, transport, alive.beat(), stall)
    pump.written_at = perf_counter()


def client_gone(request: web.Request, exc: BaseException, record: RequestContext | None) -> None:
    """After the headers: the client stopped reading (drop the connection and what is
    buffered for it) or went away. Either way the route's `finally` aborts the engine."""
    if isinstance(exc, WriteStalled):
        WRITE_STALLS.inc()
        if record is not None:
            record.fail("write_stalled")
        log.info("request %s: the client stopped reading; response ended", record and record.request_id)
        if request.transport is not None:
            request.transport.abort()
    elif record is not None:
        record.gone()
