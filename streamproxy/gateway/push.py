"""Relaying a replica's stream from aiohttp's own data callback: no task wake-up per event.

aiohttp's client parses the replica's response in `data_received` and hands
each body piece to the response's `StreamReader.feed_data`; a reader task
would then be woken and resumed through every coroutine frame of the
handler, per read. `Push` takes the pieces in that very call instead: the
reader's class is swapped for `_PushReader` (same slots, nothing added),
whose `feed_data` gives the bytes to `SSERelay.feed` and writes the whole
events to the client's transport as one chunk, as `serve`'s push path does.
The handler sleeps on one future until the stream ends (`feed_eof`), fails
(`set_exception`: a broken connection, the client session's read timeout),
or the client falls behind: then the piece goes into the reader as usual,
`Push` lets go, and the handler pulls the rest with its bounded writes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from aiohttp.streams import StreamReader

from streamproxy.gateway.relay import SSERelay
from streamproxy.http.writer import chunk_frame, writable

# The reader of each stream being pushed (StreamReader has slots and no __weakref__).
_PUSHED: dict[int, Push] = {}


class _PushReader(StreamReader):
    __slots__ = ()

    def feed_data(self, data: bytes, size: int = 0) -> bool:
        push = _PUSHED.get(id(self))
        if push is None or not push.take(data):
            return StreamReader.feed_data(self, data, size)
        return False

    def feed_eof(self) -> None:
        StreamReader.feed_eof(self)
        push = _PUSHED.get(id(self))
        if push is not None:
            push.wake()

    def set_exception(self, *args: Any, **kwargs: Any) -> None:
        StreamReader.set_exception(self, *args, **kwargs)
        push = _PUSHED.get(id(self))
        if push is not None:
            push.wake()


class Push:
    """One stream's push state: armed until the end, a failure, or a slow client."""

    __slots__ = ("reader", "relay", "transport", "on_write", "armed", "woken")

    def __init__(self, reader: StreamReader, relay: SSERelay, transport: Any, on_write: Callable[[], None]) -> None:
        self.reader = reader
        self.relay = relay
        self.transport = transport
        self.on_write = on_write  # called after each write (heartbeat deadline, first-event time)
        self.armed = False
        self.woken: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def start(self) -> bool:
        """Arm, after relaying what the reader already holds; False when it cannot push."""
        reader = self.reader
        if type(reader) is not StreamReader or reader.exception() is not None or reader.is_eof() or not writable(self.transport):
            return False
        held = reader.read_nowait(-1)
        if held:
            out = self.relay.feed(held)
            if out:
                self.transport.write(chunk_frame(out))
                self.on_write()
        reader.__class__ = _PushReader
        _PUSHED[id(reader)] = self
        self.armed = True
        return True

    def take(self, data: bytes) -> bool:
        """Relay `data` now; False (and let go) when the client cannot take it."""
        transport = self.transport
        if not writable(transport):
            self.let_go()
            return False
        out = self.relay.feed(data)
        if out:
            transport.write(b"%x\r\n%b\r\n" % (len(out), out))  # chunk_frame, inlined: once per event
            self.on_write()
        return True

    def wake(self) -> None:
        if not self.woken.done():
            self.woken.set_result(None)

    def let_go(self) -> None:
        """Back to a plain reader: the handler pulls from here on."""
        if self.armed:
            self.armed = False
            _PUSHED.pop(id(self.reader), None)
            self.reader.__class__ = StreamReader
        self.wake()
