"""The keep-alive mechanism serve and the gateway share (streamproxy/http/keepalive.py) and the
writer's chunk framing (streamproxy/http/chunked.py): the bytes each kind of response sends, the
deadline arithmetic, `wait` (beats until a future is done, its result left to the caller), and
`Ticker` (direct writes only after a silent interval). What clients see of them in a real server
is production/test_keepalive.py, production/test_nonstream.py and gateway/test_edge.py."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import cast

import pytest

from streamproxy.apis.anthropic.spec import ANTHROPIC
from streamproxy.apis.anthropic.stream import AnthropicEncoder
from streamproxy.apis.spec import OPENAI
from streamproxy.core.stream import ChatStreamEncoder
from streamproxy.http import keepalive as keepalives
from streamproxy.http.chunked import SIZE_LINES_N, chunk_frame
from streamproxy.http.keepalive import ANTHROPIC_PING, NEWLINE, SSE_COMMENT, Keepalive, Ticker


class Count:
    def __init__(self) -> None:
        self.n = 0.0

    def inc(self, amount: float = 1) -> None:
        self.n += amount


def test_the_frames_are_the_ones_each_response_sends() -> None:
    assert SSE_COMMENT == b": keepalive\n\n"
    assert ANTHROPIC_PING == b'event: ping\ndata: {"type":"ping"}\n\n'
    assert NEWLINE == b"\n"
    # One definition each: serve's encoders and the gateway's relay send the same bytes.
    assert ChatStreamEncoder.keepalive == OPENAI.keepalive == SSE_COMMENT
    assert AnthropicEncoder.keepalive == ANTHROPIC.keepalive == ANTHROPIC_PING


@pytest.mark.parametrize("size", [0, 1, 15, 16, 255, SIZE_LINES_N - 1, SIZE_LINES_N, 70_000])
def test_chunk_frame_is_http_1_1_chunked_framing(size: int) -> None:
    data = b"x" * size
    assert chunk_frame(data) == f"{size:x}\r\n".encode() + data + b"\r\n"


def test_when_a_beat_is_due() -> None:
    count = Count()
    alive = Keepalive(SSE_COMMENT, 15.0, count)
    assert alive.due_in(100.0, 104.0) == 11.0
    assert not alive.due(100.0, 114.9) and alive.due(100.0, 115.0)
    assert alive.beat() == SSE_COMMENT and alive.beat() == SSE_COMMENT
    assert (alive.sent, count.n) == (2, 2.0)
    for off in (0.0, -1.0, None):
        never = Keepalive(NEWLINE, off, count)
        assert never.interval is None and never.due_in(0.0, 1e9) is None and not never.due(0.0, 1e9)


async def test_wait_beats_until_the_future_is_done_and_leaves_its_error_to_the_caller() -> None:
    fut: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
    sent: list[bytes] = []

    async def send(frame: bytes) -> None:
        sent.append(frame)
        if len(sent) == 3:
            fut.set_exception(ValueError("the work failed"))

    alive = Keepalive(NEWLINE, 0.01, Count())
    await keepalives.wait(fut, alive, send)
    assert sent == [NEWLINE] * 3 and alive.sent == 3
    with pytest.raises(ValueError, match="the work failed"):
        fut.result()


async def test_wait_raises_what_send_raises_and_never_cancels_the_future() -> None:
    fut: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()

    async def send(frame: bytes) -> None:
        raise ConnectionResetError("gone")

    with pytest.raises(ConnectionResetError):
        await keepalives.wait(fut, Keepalive(SSE_COMMENT, 0.01, Count()), send)
    assert not fut.done()
    fut.set_result(b"{}")
    await keepalives.wait(fut, Keepalive(SSE_COMMENT, None, Count()), send)  # done: no beat, no wait


class Transport:
    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.ok = True

    def write(self, data: bytes) -> None:
        self.written.append(data)


class Handle:
    def __init__(self, when: float) -> None:
        self.when = when
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class Clock:
    """The two things a Ticker asks of its loop, `time` and `call_at`, on a clock the test moves."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.timers: list[tuple[Handle, Callable[[], None]]] = []

    def time(self) -> float:
        return self.now

    def call_at(self, when: float, callback: Callable[[], None]) -> Handle:
        handle = Handle(when)
        self.timers.append((handle, callback))
        return handle

    def run_next(self) -> float:
        """Move to the next timer and fire it; its time."""
        handle, callback = self.timers.pop()
        assert not handle.cancelled and not self.timers
        self.now = max(self.now, handle.when)
        callback()
        return handle.when


def test_ticker_writes_the_chunked_beat_only_after_a_silent_interval() -> None:
    clock, transport = Clock(), Transport()
    alive = Keepalive(ANTHROPIC_PING, 15.0, Count())
    ticker = Ticker(transport, alive, cast(asyncio.AbstractEventLoop, clock), lambda t: t.ok)
    assert clock.run_next() == 1015.0
    assert transport.written == [chunk_frame(ANTHROPIC_PING)] and alive.sent == 1
    # The stream wrote at 1020: the next beat is due 15 s after that, not after the last beat.
    clock.now = 1020.0
    ticker.last = clock.now
    assert clock.run_next() == 1030.0 and len(transport.written) == 1
    assert clock.run_next() == 1035.0 and len(transport.written) == 2
    # A transport that cannot take it (a slow reader) gets nothing: the timer looks again soon.
    transport.ok = False
    assert clock.run_next() == 1050.0 and len(transport.written) == 2
    assert clock.run_next() == pytest.approx(1050.001)
    transport.ok = True
    clock.run_next()
    assert len(transport.written) == 3 and alive.sent == 3
    ticker.stop()
    assert clock.timers[0][0].cancelled
