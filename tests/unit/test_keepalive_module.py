"""The one keep-alive mechanism serve and the gateway share (streamproxy/http/body.py `Body`'s
heartbeat) and the body's chunk framing: the bytes each kind of response sends, a beat only
after a silent interval (measured from the last write of any kind), none while the transport
is behind or after the body is closed, and a beat aiohttp writes (the headers not out yet) whose
failure the handler sees. What clients see of them in a real server is production/test_keepalive.py,
production/test_nonstream.py and gateway/test_edge.py."""

from __future__ import annotations

import asyncio
from time import perf_counter
from types import SimpleNamespace
from typing import Any, cast

import pytest
from aiohttp import web

from streamproxy.apis.anthropic.spec import ANTHROPIC
from streamproxy.apis.anthropic.stream import AnthropicEncoder
from streamproxy.apis.spec import OPENAI
from streamproxy.core.stream import ChatStreamEncoder
from streamproxy.http.body import ANTHROPIC_PING, NEWLINE, PUSH_BUFFER_LIMIT, SIZE_LINES_N, SSE_COMMENT, Body, chunk_frame

BEAT = 0.05  # the heartbeat of these tests; waits are several of them, counts have room for a busy machine


class Count:
    def __init__(self) -> None:
        self.n = 0.0

    def inc(self, amount: float = 1) -> None:
        self.n += amount


class Transport:
    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.buffered = 0
        self.closing = False

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def get_write_buffer_size(self) -> int:
        return self.buffered

    def is_closing(self) -> bool:
        return self.closing


class Response:
    """What a Body asks of an aiohttp response that is not direct (headers held, or HTTP/1.0)."""

    def __init__(self, transport: Transport, fail: BaseException | None = None) -> None:
        self.transport = transport
        self.prepared = False
        self.fail = fail
        self.compression = False
        self.headers: dict[str, str] = {}

    async def prepare(self, request: Any) -> None:
        await asyncio.sleep(0)
        self.prepared = True

    async def write(self, data: bytes) -> None:
        if self.fail is not None:
            raise self.fail
        self.transport.write(b"HEAD|" + data)


def _body(transport: Transport, response: Any = None, frame: bytes = SSE_COMMENT, counter: Count | None = None) -> Body:
    request = cast(web.BaseRequest, SimpleNamespace(transport=transport))
    return Body(request, cast(web.StreamResponse, response or Response(transport)), frame, heartbeat=BEAT, stall=1.0, counter=counter or Count())


def _direct(body: Body) -> Body:
    body.sent = body.direct = True  # as after the headers went out on a chunked response
    return body


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


async def test_a_silent_body_beats_once_per_interval_straight_to_the_transport() -> None:
    transport, count = Transport(), Count()
    body = _direct(_body(transport, frame=ANTHROPIC_PING, counter=count))
    try:
        await asyncio.sleep(BEAT * 5.5)
    finally:
        body.close()
    assert set(transport.written) == {chunk_frame(ANTHROPIC_PING)}
    assert 2 <= len(transport.written) <= 5 and count.n == len(transport.written)


async def test_writes_move_the_deadline_and_a_body_that_keeps_writing_never_beats() -> None:
    transport = Transport()
    body = _direct(_body(transport))
    try:
        for _ in range(12):  # a write every half interval, pushed (as a sink does: it sets written_at)
            await asyncio.sleep(BEAT / 2)
            body.written_at = perf_counter()
        assert transport.written == []
        await asyncio.sleep(BEAT * 2.5)  # then silence: beats
        assert transport.written
    finally:
        body.close()


async def test_no_beat_while_the_transport_is_behind_nor_after_close() -> None:
    transport = Transport()
    transport.buffered = PUSH_BUFFER_LIMIT + 1  # its unsent bytes are the connection's traffic
    body = _direct(_body(transport))
    await asyncio.sleep(BEAT * 3)
    assert transport.written == []
    transport.buffered = 0
    await asyncio.sleep(BEAT * 2.5)
    assert transport.written
    body.close()
    sent = len(transport.written)
    await asyncio.sleep(BEAT * 3)
    assert len(transport.written) == sent


async def test_before_the_headers_a_beat_is_aiohttps_write_with_the_headers_and_then_direct() -> None:
    transport = Transport()
    response = Response(transport)
    body = _body(transport, response)
    try:
        await asyncio.sleep(BEAT * 1.5)
        assert await body.begun() is True  # the beat sent the headers: an error now goes in-band
        assert transport.written == [b"HEAD|" + SSE_COMMENT] and body.sent
    finally:
        body.close()


async def test_a_failed_beat_is_raised_to_the_handler() -> None:
    transport = Transport()
    body = _body(transport, Response(transport, fail=ConnectionResetError("gone")))
    try:
        await asyncio.sleep(BEAT * 1.5)
        with pytest.raises(ConnectionResetError):
            await body.begun()
        with pytest.raises(ConnectionResetError):
            await body.write(b"data: x\n\n")
    finally:
        body.close()
    await asyncio.sleep(BEAT * 2)
    assert transport.written == []  # no beat after it failed


async def test_no_heartbeat_no_timer() -> None:
    transport = Transport()
    request = cast(web.BaseRequest, SimpleNamespace(transport=transport))
    for off in (0.0, -1.0, None):
        body = _direct(Body(request, cast(web.StreamResponse, Response(transport)), SSE_COMMENT, heartbeat=off, stall=1.0))
        assert body.heartbeat is None
    await asyncio.sleep(BEAT * 2)
    assert transport.written == []
