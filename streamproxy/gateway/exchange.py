"""One connection to a replica and one request's response on it: `h1`'s parser fed from `data_received`.

A `Connection` (an asyncio protocol; wire.py's `Upstreams` opens and pools them) carries one `Exchange`
at a time. The exchange is fed from `data_received`: `head()`, `take()` (body bytes that came with the
head), then `read()` for a whole body or `stream(sink)`, which hands each piece to `sink` from
`data_received` itself; a sink returning False pauses reading until `resume()`. `wait()` raises
`UpstreamClosed` when the replica broke off, spoke bad HTTP or was silent past the read timeout (one
timer per exchange; `bound_silence` shortens it once a stream began: migration's stall bound).
`finish(reuse=...)` hands a complete keep-alive response's connection back to the pool, else closes it
(how a replica learns to abort).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, cast

from streamproxy.gateway.h1 import ProtocolError, ResponseParser

if TYPE_CHECKING:
    from streamproxy.gateway.wire import Origin


class UpstreamClosed(ConnectionError):
    """The replica's connection failed before its response ended."""

    def __init__(self, message: str, *, stale: bool = False, tls: bool = False, reason: str = "") -> None:
        super().__init__(message)
        self.stale = stale  # a reused connection that failed before any byte came back
        self.tls = tls  # the TLS handshake failed (the message says why)
        self.reason = reason  # with `tls`: why, alone (e.g. "certificate has expired (SSLCertVerificationError)")


class Connection(asyncio.Protocol):
    """One pooled keep-alive connection to a replica: at most one `Exchange` on it at a time."""


    __slots__ = ("origin", "transport", "exchange", "closed", "idle_since")

    def __init__(self, origin: Origin) -> None:
        self.origin = origin
        self.transport: asyncio.Transport | None = None
        self.exchange: Exchange | None = None
        self.closed = False
        self.idle_since = 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop and asyncio set TCP_NODELAY on it already

    def start(self, request: bytes, read_timeout: float | None, reused: bool, head_only: bool) -> Exchange:
        exchange = self.exchange = Exchange(self, read_timeout, reused, head_only)
        transport = self.transport
        if self.closed or transport is None or transport.is_closing():
            # Closed since it was opened or pooled (a replica over its connection cap closes new
            # ones at once): nothing will ever come back on it, so the exchange fails now.
            exchange.lost(None)
            return exchange
        transport.write(request)
        return exchange

    def data_received(self, data: bytes) -> None:
        exchange = self.exchange
        if exchange is None:  # nothing asked: a replica talking out of turn
            self.close()
            return
        exchange.received(data)

    def eof_received(self) -> bool:
        if self.exchange is not None:
            self.exchange.eof()
        return False  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.exchange is not None:
            self.exchange.lost(exc)
        try:
            self.origin.idle.remove(self)
        except ValueError:
            pass

    def released(self, reuse: bool) -> None:
        self.exchange = None
        if reuse and not self.closed and len(self.origin.idle) < self.origin.keepalive:
            assert self.transport is not None
            self.idle_since = self.origin.loop.time()
            self.origin.idle.append(self)
        else:
            self.close()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            if self.transport is not None:
                self.transport.close()

    def pause(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.pause_reading()

    def resume(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.resume_reading()


class Exchange:
    """One request's response on one connection."""

    __slots__ = (
        "conn", "parser", "status", "headers", "sink", "paused", "error", "got_bytes", "reused",
        "_body", "_waiter", "_timeout", "_last_read", "_timer", "_loop",
    )

    def __init__(self, conn: Connection, read_timeout: float | None, reused: bool, head_only: bool) -> None:
        self.conn = conn
        self.parser = ResponseParser(head_only=head_only)
        self.status = 0
        self.headers: dict[str, str] = {}
        self.sink: Callable[[bytes], bool] | None = None
        self.paused = False
        self.error: UpstreamClosed | None = None
        self.got_bytes = False
        self.reused = reused
        self._body: list[bytes] = []
        self._loop = conn.origin.loop
        self._waiter: asyncio.Future[None] | None = None
        self._timeout = read_timeout
        self._last_read = self._loop.time()
        self._timer: asyncio.TimerHandle | None = None
        if read_timeout:
            self._timer = self._loop.call_at(self._last_read + read_timeout, self._check_silence)

    # -- what the caller does ---------------------------------------------------------

    @property
    def complete(self) -> bool:
        return self.parser.complete

    async def head(self) -> None:
        """Until the status line and headers are in; raises UpstreamClosed."""
        while not self.parser.head:
            await self._wait()

    async def read(self) -> bytes:
        """The whole body; raises UpstreamClosed."""
        while not self.parser.complete:
            await self._wait()
        return self.take()

    def take(self) -> bytes:
        """The body bytes that came already (with the head, typically the first events), taken:
        b"" if none. What comes later goes to `stream`'s sink, or to `read`."""
        body = b"".join(self._body)
        self._body.clear()
        return body

    def stream(self, sink: Callable[[bytes], bool]) -> None:
        """From now on body pieces go to `sink` as they arrive (what came already, first)."""
        self.sink = sink
        if self._body:
            held = b"".join(self._body)
            self._body.clear()
            if not sink(held):
                self._pause()

    async def wait(self) -> None:
        """Until the body ended or reading paused (`paused`); raises UpstreamClosed."""
        if not self.parser.complete and not self.paused:
            await self._wait()

    def bound_silence(self, seconds: float) -> None:
        """From now on the longest silence between two reads is at most `seconds` (a stream's idle
        bound once it began: Envoy's `stream_idle_timeout`); a longer read timeout is shortened."""
        if seconds <= 0 or (self._timeout and self._timeout <= seconds) or self.parser.complete or self.error is not None:
            return
        self._timeout = seconds
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self._loop.call_at(self._last_read + seconds, self._check_silence)

    def resume(self) -> None:
        if self.paused and self.error is None:
            self.paused = False
            self._last_read = self._loop.time()
            self.conn.resume()

    def finish(self, *, reuse: bool) -> None:
        """Done with this exchange: the connection back to the pool (a complete response, `reuse`), else closed."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.conn.exchange is self:
            self.conn.released(reuse and self.parser.complete and self.parser.keep_alive and self.error is None)

    # -- what the connection tells it -------------------------------------------------

    def received(self, data: bytes) -> None:
        self.got_bytes = True
        self._last_read = self._loop.time()
        parser = self.parser
        had_head = parser.head
        try:
            body = parser.feed(data)
        except ProtocolError as exc:
            self._fail(UpstreamClosed(f"the replica's response is not valid HTTP/1.1 ({exc})"))
            self.conn.close()
            return
        if body:
            sink = self.sink
            if sink is None:
                self._body.append(body)
            elif not sink(body) and not parser.complete:
                self._pause()
                return
        if parser.complete or not had_head:
            if not had_head and parser.head:
                self.status, self.headers = parser.status, parser.headers
            self._wake()

    def eof(self) -> None:
        try:
            self.parser.feed_eof()
        except ProtocolError as exc:
            self._fail(UpstreamClosed(str(exc), stale=self.reused and not self.got_bytes))
            return
        self._wake()

    def lost(self, exc: Exception | None) -> None:
        if not self.parser.complete:
            reason = f" ({type(exc).__name__}: {exc})" if exc is not None else ""
            self._fail(UpstreamClosed(f"the replica closed the connection before the end of its response{reason}",
                                      stale=self.reused and not self.got_bytes))

    # -- inside -----------------------------------------------------------------------

    async def _wait(self) -> None:
        if self.error is not None:
            raise self.error
        waiter = self._waiter = self._loop.create_future()
        try:
            await waiter
        finally:
            self._waiter = None
        if self.error is not None:
            raise self.error

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _pause(self) -> None:
        self.paused = True
        self.conn.pause()
        self._wake()

    def _fail(self, error: UpstreamClosed) -> None:
        if self.error is None:
            self.error = error
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._wake()

    def _check_silence(self) -> None:
        self._timer = None
        if self.parser.complete:
            return  # answered in full: waiting for its caller to finish it is not silence
        timeout = self._timeout
        assert timeout
        now = self._loop.time()
        due = self._last_read + timeout
        if self.paused or now < due:
            self._timer = self._loop.call_at(max(due, now) if not self.paused else now + timeout, self._check_silence)
            return
        self._fail(UpstreamClosed(f"the replica sent nothing for {timeout:g} s"))
        self.conn.close()

    def __repr__(self) -> str:
        return f"<Exchange {self.status} complete={self.parser.complete} paused={self.paused}>"
