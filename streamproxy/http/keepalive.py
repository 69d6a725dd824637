"""Keepalives, for serve and the gateway: when one is due and what bytes go out.

A response that waits (for a first token, a generation slot, a replica, a slow
non-streaming answer) must not fall silent for longer than its interval, or
a proxy or client drops it. What goes out is the response's `frame`: an SSE
comment (`SSE_COMMENT`), Anthropic's `ping` event on its routes
(`ANTHROPIC_PING`; each stream encoder names its own as `encoder.keepalive`),
or a newline before a slow JSON body (`NEWLINE`: JSON allows leading
whitespace). `Keepalive` is one response's policy: its frame, its interval
(None: never) and the counter it is counted in; `due_in(last, now)` is the
deadline arithmetic and `beat()` the frame, counted. Whoever writes keeps the
time of its last write itself (an attribute set on every write; the serve push
path sets it per token, so it must stay a plain store, not a call here).

Three ways to wait, one per shape of waiter:

- `wait(fut, alive, send)`: await a future, `send`ing a beat per silent interval
  (a queued stream, a slow non-streaming answer, a replica not answering yet);
- a deadline inside a writer's own loop (`writer.pump_sse`): `due_in` bounds the
  wait for the next step, no timer at all;
- `Ticker`: one loop timer per stream that writes the chunk-framed beat straight
  to the transport when the stream was silent for an interval (the gateway's
  relay, whose events are written from the replica connection's data callback).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from streamproxy.apis.anthropic.stream import PING
from streamproxy.core import sse
from streamproxy.http.chunked import chunk_frame

SSE_COMMENT = sse.KEEPALIVE
ANTHROPIC_PING = PING  # the one definition is the Anthropic stream encoder's `keepalive`
NEWLINE = b"\n"


class _Counter(Protocol):
    def inc(self, amount: float = 1) -> None: ...


class Keepalive:
    """One response's keepalive: `frame` every `interval` seconds of silence (<= 0: never), counted in `counter`."""

    __slots__ = ("frame", "interval", "counter", "sent")

    def __init__(self, frame: bytes, interval: float | None, counter: _Counter) -> None:
        self.frame = frame
        self.interval = interval if interval is not None and interval > 0 else None
        self.counter = counter
        self.sent = 0

    def due_in(self, last: float, now: float) -> float | None:
        """Seconds until a beat is due after a write at `last` (<= 0: due now); None: never."""
        if self.interval is None:
            return None
        return self.interval - (now - last)

    def due(self, last: float, now: float) -> bool:
        """A beat is due now, after a write at `last`."""
        return self.interval is not None and now - last >= self.interval

    def beat(self) -> bytes:
        """The frame to send now, counted."""
        self.sent += 1
        self.counter.inc()
        return self.frame


async def wait(fut: asyncio.Future[Any], alive: Keepalive, send: Callable[[bytes], Awaitable[None]]) -> None:
    """Until `fut` is done, sending `alive.beat()` through `send` per silent interval.

    `fut`'s result or exception is the caller's to take (`fut.result()`); an error of
    `send` (the client gone) is raised. `fut` is never cancelled here: its owner does that."""
    while not fut.done():
        try:
            async with asyncio.timeout(alive.interval):
                await asyncio.wait((fut,))
        except TimeoutError:
            await send(alive.beat())


class Ticker:
    """A beat after `interval` seconds without a write, from one loop timer per stream.

    The timer fires once per interval and writes `alive.chunk` straight to the transport
    only if the stream was silent that long and the transport can take it (`writable`);
    the writer just sets `last` (the loop's clock) after each of its own writes."""

    __slots__ = ("transport", "alive", "chunk", "loop", "last", "_writable", "_handle")

    def __init__(self, transport: Any, alive: Keepalive, loop: asyncio.AbstractEventLoop, writable: Callable[[Any], bool]) -> None:
        assert alive.interval is not None
        self.transport = transport
        self.alive = alive
        self.chunk = chunk_frame(alive.frame)  # made once: the same frame every time
        self.loop = loop
        self._writable = writable
        self.last = loop.time()
        self._handle: asyncio.TimerHandle | None = loop.call_at(self.last + alive.interval, self._fire)

    def _fire(self) -> None:
        now = self.loop.time()
        interval = self.alive.interval
        assert interval is not None
        due = self.last + interval
        if now >= due and self.transport is not None and self._writable(self.transport):
            self.alive.beat()
            self.transport.write(self.chunk)
            self.last, due = now, now + interval
        self._handle = self.loop.call_at(max(due, now + 0.001), self._fire)

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
