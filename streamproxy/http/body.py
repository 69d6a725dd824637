"""A response's body: the one code that writes to a client's socket.

A `Body` per response that writes a body of its own (a stream, served or relayed; the early 200 of a
slow JSON answer) owns:
- framing: `write` goes through aiohttp (with an `SSEResponse`'s held head); `direct` writes go to the
  transport, chunk-framed here (`SIZE_LINES`); `finish` is aiohttp's `write_eof(tail)`, one write.
- the heartbeat: one loop timer per body (`written_at` moves with every write) that writes `keepalive`
  after `heartbeat` s of silence, whatever the handler awaits: the one keep-alive mechanism of serve
  and the gateway. Not direct yet (headers not out, HTTP/1.0), a task writes it and `begun()` waits
  for it; no beat while over PUSH_BUFFER_LIMIT unsent bytes.
- flow control: a push sink takes a piece only while the transport holds at most PUSH_BUFFER_LIMIT
  bytes and is not closing, else refuses until `write` has caught up.
- the stall bound: `write`/`finish` wait for aiohttp's drain only when they could block, at most
  `stall` s, else `WriteStalled`.
`StreamBody.push` (serve) and `RelayBody.relay` (the gateway) are the sinks, inlined. `answer_unread` is
the 408 aiohttp never sees. tests/unit/test_one_writer.py fails if anything else writes to a transport.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from email.utils import formatdate
from http import HTTPStatus
from time import perf_counter
from typing import TYPE_CHECKING, Any, Protocol

from aiohttp import hdrs, web

from engine_adapter.base import Delta, OutputStream
from streamproxy.apis.anthropic.stream import PING
from streamproxy.core import sse
from streamproxy.core.stream import StreamEncoder
from streamproxy.errors import APIError
from streamproxy.http.metrics import INTER_TOKEN_LATENCY, SSE_HEARTBEATS

if TYPE_CHECKING:
    from streamproxy.http.context import RequestContext

# What a keepalive is: each stream encoder names its own as `encoder.keepalive`
# (these two), a slow JSON answer sends newlines (JSON allows leading whitespace).
SSE_COMMENT = sse.KEEPALIVE
ANTHROPIC_PING = PING
NEWLINE = b"\n"

SSE_HEADERS = {
    "Content-Type": "text/event-stream",
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",
    "Connection": "keep-alive",
}
# A write this small into an empty transport buffer cannot reach the
# high-water mark, so it cannot block: no timer for it.
_UNBOUNDED_WRITE = 16 * 1024
# A sink takes a piece while the transport holds at most this many unsent bytes (the
# kernel's socket buffer is full beyond it): above, the client is behind.
PUSH_BUFFER_LIMIT = 8 * 1024
# HTTP/1.1 chunk size lines of the usual sizes, made once.
SIZE_LINES_N = 2048
SIZE_LINES = [b"%x\r\n" % n for n in range(SIZE_LINES_N)]


def chunk_frame(data: bytes) -> bytes:
    """`data` as one HTTP/1.1 chunk (non-empty `data`: an empty chunk would end the body)."""
    size = len(data)
    return b"".join((SIZE_LINES[size], data, b"\r\n")) if size < SIZE_LINES_N else b"%x\r\n%b\r\n" % (size, data)


class WriteStalled(Exception):
    """The client stopped reading for longer than the write-stall timeout."""


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
    StreamResponse, whose headers go out in `prepare()`."""
    if request.version >= (1, 1):
        response = SSEResponse(headers=SSE_HEADERS)
        response.enable_chunked_encoding()
        return response
    return web.StreamResponse(headers=SSE_HEADERS)


def can_write_direct(response: web.StreamResponse, transport: Any) -> bool:
    """Frames may go straight to the transport: the response is prepared and its headers are out
    (aiohttp sends a StreamResponse's in `prepare()`; an `SSEResponse`'s with its first `write`,
    which the caller has made), its body is chunked (the `Transfer-Encoding` it sent says so: an
    HTTP/1.0 client gets a close-delimited body instead) and not compressed."""
    if transport is None or transport.is_closing() or not response.prepared or response.compression:
        return False
    return response.headers.get(hdrs.TRANSFER_ENCODING, "").lower() == "chunked"


class _Counter(Protocol):
    def inc(self, amount: float = 1) -> None: ...


class Body:
    """One response's body (see the module's docstring). `close()` on every way out of the
    handler (`finish` does it first): no heartbeat may follow the response's end."""

    __slots__ = ("request", "response", "transport", "stall", "keepalive", "heartbeat", "counter", "sent", "direct",
                 "written_at", "_timer", "_beating", "_error")

    def __init__(self, request: web.BaseRequest, response: web.StreamResponse, keepalive: bytes, *,
                 heartbeat: float | None, stall: float, counter: _Counter = SSE_HEARTBEATS) -> None:
        self.request = request
        self.response = response
        self.transport: Any = request.transport
        self.stall = stall
        self.keepalive = keepalive
        self.heartbeat = heartbeat if heartbeat is not None and heartbeat > 0 else None  # None: none (or closed)
        self.counter = counter
        self.sent = False  # the status line and headers are out
        self.direct = False  # frames may go straight to the transport (once `sent`: `can_write_direct`)
        self.written_at = perf_counter()  # the last write of any kind: the heartbeat is due `heartbeat` s after it
        self._timer: asyncio.TimerHandle | None = None
        self._beating: asyncio.Task[None] | None = None  # a heartbeat aiohttp writes (not direct)
        self._error: BaseException | None = None  # what that heartbeat met: raised by the next write
        if self.heartbeat is not None:
            self._timer = asyncio.get_running_loop().call_later(self.heartbeat, self._tick)

    # -- what the handler does --------------------------------------------------------

    async def open(self) -> None:
        """The response prepared: a StreamResponse's headers go out now, an SSEResponse's with the first write."""
        if self._beating is not None or self._error is not None:
            await self.begun()
        await self._open()

    async def write(self, data: bytes) -> None:
        """`data` as the body's next bytes (the held headers with them, or alone if `data` is empty)."""
        if self._beating is not None or self._error is not None:
            await self.begun()
        if not data and self.sent:
            return
        transport = self.transport
        stall = self.stall
        if stall > 0 and transport is not None and (transport.get_write_buffer_size() > 0 or len(data) > _UNBOUNDED_WRITE):
            try:
                async with asyncio.timeout(stall):
                    await self.response.write(data)
            except TimeoutError:
                raise WriteStalled from None
        else:
            await self.response.write(data)
        self.written_at = perf_counter()
        if not self.sent:
            self._opened()

    def writable(self) -> bool:
        """A sink may write straight to the transport now: direct, not closing, not behind (a slow reader)."""
        transport = self.transport
        return self.direct and transport.get_write_buffer_size() <= PUSH_BUFFER_LIMIT and not transport.is_closing()

    async def begun(self) -> bool:
        """After a heartbeat being written (the headers with the first one), its failure raised: whether the
        response has begun, so that its status is out and an error can only go in-band."""
        beating = self._beating
        if beating is not None:
            await asyncio.wait((beating,))  # not cancelled with the caller: `close` does that
        if self._error is not None:
            raise self._error
        return self.response.prepared

    async def finish(self, tail: bytes = b"") -> None:
        """`tail` (the last frames) and the terminating chunk in one write (`write_eof`), bounded by the
        stall timeout when it could block; no heartbeat after it."""
        if self._beating is not None or self._error is not None:
            await self.begun()
        self.close()
        transport = self.transport
        if self.stall <= 0 or (transport is not None and transport.get_write_buffer_size() == 0 and len(tail) <= _UNBOUNDED_WRITE):
            await self.response.write_eof(tail)  # cannot block: no timer
            return
        try:
            async with asyncio.timeout(self.stall):
                await self.response.write_eof(tail)
        except TimeoutError:
            raise WriteStalled from None

    def close(self) -> None:
        """No more heartbeats."""
        self.heartbeat = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        beating, self._beating = self._beating, None
        if beating is not None:
            beating.cancel()

    # -- inside -----------------------------------------------------------------------

    async def _open(self) -> None:
        response = self.response
        if not response.prepared:
            await response.prepare(self.request)
        if not self.sent and not isinstance(response, SSEResponse):
            self._opened()
            self.written_at = perf_counter()

    def _opened(self) -> None:
        self.sent = True
        self.direct = can_write_direct(self.response, self.transport)

    def _tick(self) -> None:
        self._timer = None
        interval = self.heartbeat
        if interval is None:
            return
        now = perf_counter()
        wait = self.written_at + interval - now
        if wait <= 0.0:
            wait = interval
            transport = self.transport
            if transport is None or transport.is_closing():
                return  # the client is gone: the handler hears of it
            if transport.get_write_buffer_size() <= PUSH_BUFFER_LIMIT:
                if not self.direct:
                    self._beating = asyncio.ensure_future(self._beat())  # it re-arms
                    return
                transport.write(chunk_frame(self.keepalive))
                self.written_at = now
                self.counter.inc()
        self._timer = asyncio.get_running_loop().call_later(wait, self._tick)

    async def _beat(self) -> None:
        """A heartbeat aiohttp writes (the headers not out yet, or not chunked), in a task of its own."""
        try:
            await self._open()
            try:
                async with asyncio.timeout(self.stall if self.stall > 0 else None):
                    await self.response.write(self.keepalive)  # the held headers with it
            except TimeoutError:
                raise WriteStalled from None
            self.written_at = perf_counter()
            if not self.sent:
                self._opened()
            self.counter.inc()
        except Exception as exc:  # the client gone, or not reading: the handler's next write raises it
            self._error = exc
            return
        finally:
            self._beating = None
        if self.heartbeat is not None:
            self._timer = asyncio.get_running_loop().call_later(self.heartbeat, self._tick)


class StreamBody(Body):
    """serve's stream: `push` is the sink the engine's step calls while `pump_sse` has it armed.

    It encodes the step and hands one chunked-encoding frame to the transport, synchronously,
    and refuses (False: the writer pulls instead) while the transport holds more than
    `PUSH_BUFFER_LIMIT` unsent bytes or is closing. The bytes handed over are a fresh object,
    never touched again. (A bound method, not `__call__`: calling an instance goes through a
    slower slot, once per chunk.) `wrote` is a pulled write's bookkeeping: the time to first
    token, the inter-token latency."""

    __slots__ = ("out", "encoder", "record", "last_text_at", "pushed")

    out: OutputStream  # set by pump_sse (a queued stream has none yet), before `push` is armed

    def __init__(self, request: web.BaseRequest, response: web.StreamResponse, encoder: StreamEncoder, *,
                 heartbeat: float | None, stall: float, record: RequestContext | None = None) -> None:
        super().__init__(request, response, encoder.keepalive, heartbeat=heartbeat, stall=stall)
        self.encoder = encoder
        self.record = record
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
            now = self.written_at = perf_counter()
            tokens = deltas[0].num_tokens if len(deltas) == 1 else sum(d.num_tokens for d in deltas)
            if tokens > 0:
                last = self.last_text_at
                if last is None:
                    if self.record is not None:
                        self.record.first_token(now)
                else:
                    INTER_TOKEN_LATENCY.observe((now - last) / tokens)
                self.last_text_at = now
        return True

    def wrote(self, deltas: list[Delta]) -> None:
        """`deltas`' bytes went out through `write`: time to first token, inter-token latency."""
        now = self.written_at
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


class Ended(Protocol):
    complete: bool


class Source(Protocol):
    """What `RelayBody.follow` relays: the gateway's `exchange.Exchange`."""

    def stream(self, sink: Callable[[bytes], bool]) -> None: ...

    async def wait(self) -> None: ...

    def resume(self) -> None: ...


class RelayBody(Body):
    """The gateway's stream: `relay` is the sink of the replica connection's body pieces (`follow`).

    `feed` turns a piece into whole events (`SSERelay.feed`). While the client keeps up they go
    straight to the transport; else they are held and the sink says False (the connection pauses
    reading from the replica). The replica's last read (its answer complete) is held too: it ends
    the response with the terminating chunk. `on_first` gets the time the first events went out."""

    __slots__ = ("feed", "ended", "held", "on_first")

    feed: Callable[[bytes], bytes]
    ended: Ended  # its `complete`, read per piece (an attribute, not a property)

    def __init__(self, request: web.BaseRequest, response: web.StreamResponse, keepalive: bytes, *,
                 heartbeat: float | None, stall: float) -> None:
        super().__init__(request, response, keepalive, heartbeat=heartbeat, stall=stall)
        self.held: list[bytes] = []
        self.on_first: Callable[[float], None] | None = None

    def relay(self, data: bytes) -> bool:
        out = self.feed(data)
        if not out:
            return True
        transport = self.transport
        if (self.direct and not self.held and not self.ended.complete
                and transport.get_write_buffer_size() <= PUSH_BUFFER_LIMIT and not transport.is_closing()):
            size = len(out)  # chunk_frame, inlined (once per read) as StreamBody.push does
            transport.write(b"".join((SIZE_LINES[size], out, b"\r\n")) if size < SIZE_LINES_N else chunk_frame(out))
            now = self.written_at = perf_counter()
            on_first = self.on_first
            if on_first is not None:
                self.on_first = None
                on_first(now)
            return True
        self.held.append(out)
        return False

    async def follow(self, source: Source, ended: Ended) -> bytes:
        """Relay `source`'s pieces until its answer is complete (`ended`): what the sink held (the client
        behind) is written here, bounded, and reading resumes. The last read, held, is returned: it goes
        out with the terminating chunk (`finish`)."""
        self.ended = ended
        source.stream(self.relay)
        held = self.held
        while True:
            await source.wait()
            if held:
                data = b"".join(held)
                held.clear()
                if ended.complete:
                    return data
                await self.write(data)
                self.wrote()
            if ended.complete:
                return b""
            source.resume()

    def wrote(self) -> None:
        """Events went out through `write` (or are about to, with the end): the first ones' time."""
        on_first = self.on_first
        if on_first is not None:
            self.on_first = None
            on_first(perf_counter())


def answer_unread(transport: Any, err: APIError) -> None:
    """The whole response to a request that was never read (aiohttp has no request to answer):
    HTTP/1.0 (its version is unknown), the OpenAI error body, `Connection: close`."""
    body = err.to_json()
    head = [
        f"HTTP/1.0 {err.status} {HTTPStatus(err.status).phrase}",
        "Content-Type: application/json",
        f"Content-Length: {len(body)}",
        f"Date: {formatdate(usegmt=True)}",
        *(f"{name}: {value}" for name, value in err.headers().items()),
        "Connection: close",
    ]
    transport.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body)
