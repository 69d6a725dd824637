"""What a relayed stream costs the client's socket: the status line and headers leave in one
write with the events that came with the replica's head, each later read of the replica is one
write, and the replica's last read leaves with the terminating chunk. Seen on the gateway's side
of the client's connection: its transport (the public `transport` of the connection's handler,
found in the runner's `web.Server.connections`) wrapped in one that records each write; the bytes
written are the bytes the client read."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from tests.gateway.gateway_support import SSE_HEAD, chunked, raw_request, renamed
from tests.support import wait_until
from tests.support.served import WriteRecorder, recorded_answer

E1 = b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"Qwen/Qwen3-8B","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}\n\n'
E2 = b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"Qwen/Qwen3-8B","choices":[{"index":0,"delta":{"content":"Hi"},"finish_reason":null}]}\n\n'
E3 = b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"Qwen/Qwen3-8B","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'
DONE = b"data: [DONE]\n\n"


async def _relay(stub, gateway, pieces: list[bytes], *, close: bool = False) -> tuple[list[bytes], bytes]:
    """The replica writes `pieces` one at a time, each once the gateway has written what the one
    before gave (then, with `close`, closes the connection); the gateway's writes to the client,
    and what the client read."""
    recorder: WriteRecorder | None = None

    def written(n: int) -> Callable[[], bool]:
        return lambda: recorder is not None and len(recorder.writes) >= n

    async def replica(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for i, piece in enumerate(pieces):
            if i:
                assert await wait_until(written(i), timeout=10.0)
            writer.write(piece)
            await writer.drain()
        if not close:
            await reader.read()

    def recording(r: WriteRecorder) -> None:
        nonlocal recorder
        recorder = r

    upstream = await stub(replica)
    gw = await gateway(upstream.base)
    body = b'{"model":"support-bot","stream":true,"messages":[{"role":"user","content":"hi"}]}'
    request = raw_request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json", "Content-Length": str(len(body))})
    return await recorded_answer(lambda: gw.runner.server.connections, gw.port, request, recording)


async def test_the_headers_leave_with_the_first_events_and_the_last_events_with_the_end(stub, gateway):
    writes, got = await _relay(stub, gateway, [
        SSE_HEAD + chunked(E1),
        chunked(E2),
        chunked(E3) + chunked(DONE) + b"0\r\n\r\n",
    ])
    assert b"".join(writes) == got
    head, _, first = writes[0].partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK\r\n") and b"\r\nTransfer-Encoding: chunked\r\n" in head + b"\r\n"
    assert [first, *writes[1:]] == [chunked(renamed(E1)), chunked(renamed(E2)), chunked(renamed(E3) + DONE) + b"0\r\n\r\n"]


async def test_a_whole_answer_in_one_read_is_one_write(stub, gateway):
    writes, got = await _relay(stub, gateway, [SSE_HEAD + chunked(E1) + chunked(E3) + chunked(DONE) + b"0\r\n\r\n"])
    assert writes == [got]
    assert got.partition(b"\r\n\r\n")[2] == chunked(renamed(E1 + E3) + DONE) + b"0\r\n\r\n"


async def test_the_headers_alone_when_no_event_came_with_them(stub, gateway):
    writes, got = await _relay(stub, gateway, [SSE_HEAD, chunked(E1), chunked(E2) + chunked(DONE) + b"0\r\n\r\n"])
    assert b"".join(writes) == got
    assert writes[0].startswith(b"HTTP/1.1 200 OK\r\n") and writes[0].endswith(b"\r\n\r\n")
    assert writes[1:] == [chunked(renamed(E1)), chunked(renamed(E2) + DONE) + b"0\r\n\r\n"]


@pytest.mark.parametrize("cut", ["mid-event", "ended-without-done"])
async def test_a_broken_stream_ends_with_its_error_event_and_the_end_in_one_write(stub, gateway, cut):
    last = chunked(E2)[:-20] if cut == "mid-event" else chunked(E2) + b"0\r\n\r\n"
    writes, got = await _relay(stub, gateway, [SSE_HEAD + chunked(E1), last], close=True)
    assert b"".join(writes) == got
    error = writes[-1]
    assert error.endswith(b"data: [DONE]\n\n\r\n0\r\n\r\n") and b'"code":"upstream_unavailable"' in error
    assert got.count(b"\r\n0\r\n\r\n") == 1
    # The events before the break are their own chunk, as they came (then the error event's).
    relayed = [chunked(renamed(E1))] + ([chunked(renamed(E2))] if cut == "ended-without-done" else [])
    assert [writes[0].partition(b"\r\n\r\n")[2], *writes[1:-1]] == relayed


async def test_an_http10_client_gets_the_stream_close_delimited(stub, gateway):
    """HTTP/1.0 has no chunked encoding: the events as they came, the end of the body a close."""

    async def replica(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(SSE_HEAD + chunked(E1) + chunked(E2) + chunked(DONE) + b"0\r\n\r\n")
        await writer.drain()
        await reader.read()

    upstream = await stub(replica)
    gw = await gateway(upstream.base)
    reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
    try:
        body = b'{"model":"support-bot","stream":true,"messages":[{"role":"user","content":"hi"}]}'
        head = f"POST /v1/chat/completions HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        writer.write(head.encode() + body)
        got = await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()
    status, _, rest = got.partition(b"\r\n")
    assert status == b"HTTP/1.0 200 OK" and b"transfer-encoding" not in rest.lower()
    assert rest.partition(b"\r\n\r\n")[2] == renamed(E1 + E2) + DONE
