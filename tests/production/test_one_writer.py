"""Every byte of a served stream goes through its body (streamproxy/http/body.py), at run time.

The server's transport of one connection is wrapped in one that records, for each write, the
source files on the call stack; on that kept-alive connection go a pushed stream with a long
time to first token and silent gaps (heartbeats from the body's timer, frames from the engine's
step), a stream of the Anthropic API (its ping), a queued stream (heartbeats while waiting for a
slot), and a slow non-streaming answer (newlines, then the JSON); on another server's, the same
stream pulled (`--no-stream-push`). Each write must have come through body.py, whether the body
wrote it straight to the transport or handed it to aiohttp. (tests/unit/test_one_writer.py checks
the source; tests/gateway/test_one_writer.py the gateway's relay.)
"""

from __future__ import annotations

import asyncio
import json

from engine_adapter.fake import FakeScript
from tests.production.raw_http import chat_body, http_request
from tests.support import USER_HI, wait_until
from tests.support.served import StackRecorder, through


async def _exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: bytes) -> bytes:
    """One request on the connection, its chunked answer read to the terminating chunk."""
    writer.write(request)
    got = b""
    while not got.endswith(b"\r\n0\r\n\r\n"):
        more = await asyncio.wait_for(reader.read(65536), 20)
        assert more, got
        got += more
    return got


async def _recorded(srv, requests: list[bytes]) -> tuple[StackRecorder, list[bytes]]:
    reader, writer = await asyncio.open_connection("127.0.0.1", srv.port)
    try:
        assert await wait_until(lambda: len(srv.runner.server.connections) >= 1, timeout=10.0)
        (connection,) = srv.runner.server.connections
        recorder = connection.transport = StackRecorder(connection.transport)
        answers = [await _exchange(reader, writer, request) for request in requests]
    finally:
        writer.close()
    return recorder, answers


STREAM = chat_body(stream=True, max_tokens=4)
SCRIPT = FakeScript(text=" slow", ttft=0.3, token_delay=0.15)


async def test_a_pushed_stream_its_heartbeats_and_a_slow_json_answer_all_come_through_the_body(server):
    srv = await server(SCRIPT, sse_heartbeat=0.05, nonstream_keepalive_after=0.1, nonstream_keepalive_interval=0.05)
    messages = json.dumps({"model": "fake", "max_tokens": 3, "messages": USER_HI, "stream": True}).encode()
    recorder, (stream, anthropic, slow_json) = await _recorded(srv, [
        http_request("POST", "/v1/chat/completions", STREAM),
        http_request("POST", "/v1/messages", messages),
        http_request("POST", "/v1/chat/completions", chat_body(max_tokens=3)),
    ])
    assert stream.count(b": keepalive\n\n") >= 3 and b"data: [DONE]" in stream
    assert b"event: ping" in anthropic and b"event: message_stop" in anthropic
    assert b"\r\n1\r\n\n\r\n" in slow_json and b'"choices"' in slow_json
    through("streamproxy/http/body.py", recorder)


async def test_a_pulled_stream_comes_through_the_body(server):
    srv = await server(SCRIPT, sse_heartbeat=0.05, stream_push=False)
    recorder, (stream,) = await _recorded(srv, [http_request("POST", "/v1/chat/completions", STREAM)])
    assert stream.count(b": keepalive\n\n") >= 3 and b"data: [DONE]" in stream
    through("streamproxy/http/body.py", recorder)


async def test_a_queued_streams_heartbeats_come_through_the_body(server):
    srv = await server(FakeScript(text=" x", token_delay=0.1), sse_heartbeat=0.05, max_concurrent_requests=1, max_queued_requests=1)
    busy_reader, busy_writer = await asyncio.open_connection("127.0.0.1", srv.port)
    busy_writer.write(http_request("POST", "/v1/chat/completions", chat_body(stream=True, max_tokens=5)))
    try:
        assert await wait_until(lambda: srv.state.admission.active == 1, timeout=10.0)
        reader, writer = await asyncio.open_connection("127.0.0.1", srv.port)
        try:
            assert await wait_until(lambda: len(srv.runner.server.connections) == 2, timeout=10.0)
            mine = writer.get_extra_info("sockname")
            (connection,) = [c for c in srv.runner.server.connections if c.transport.get_extra_info("peername") == mine]
            recorder = connection.transport = StackRecorder(connection.transport)
            queued = await _exchange(reader, writer, http_request("POST", "/v1/chat/completions", chat_body(stream=True, max_tokens=2)))
        finally:
            writer.close()
    finally:
        busy_writer.close()
    head, _, body = queued.partition(b"\r\n\r\n")
    assert body.startswith(b"d\r\n: keepalive\n\n\r\n") and b"data: [DONE]" in body  # beats first: it waited for the slot
    through("streamproxy/http/body.py", recorder)
