"""Every byte of a relayed stream goes through its body (streamproxy/http/body.py), at run time.

The gateway's transport of the client's connection is wrapped in one that records the source
files on the call stack of each write. The replica answers late (the gateway's heartbeat sends
the headers with its first keepalive, then keeps beating), sends events, falls silent (beats in
the relay), and ends; a second request on the same connection gets a replica that breaks off
(the in-band error with the end). Each write must have come through body.py.
(tests/unit/test_one_writer.py checks the source; tests/production/test_one_writer.py serve.)
"""

from __future__ import annotations

import asyncio

from tests.gateway.gateway_support import SSE_HEAD, chunked, raw_request
from tests.support import wait_until
from tests.support.served import StackRecorder, through

E1 = b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"Qwen/Qwen3-8B","choices":[{"index":0,"delta":{"role":"assistant","content":"Hi"},"finish_reason":null}]}\n\n'
E2 = b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"Qwen/Qwen3-8B","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'
DONE = b"data: [DONE]\n\n"
BEAT = 0.05


async def test_a_relayed_stream_its_heartbeats_and_a_break_all_come_through_the_body(stub, gateway):
    calls = 0

    async def replica(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal calls
        calls += 1
        await asyncio.sleep(BEAT * 5)  # before the answer: the headers go out with a heartbeat
        writer.write(SSE_HEAD[:-2] + b"Connection: close\r\n\r\n" + chunked(E1))  # the next request: a new connection
        await writer.drain()
        await asyncio.sleep(BEAT * 5)  # silent mid-stream: heartbeats in the relay
        if calls == 1:
            writer.write(chunked(E2) + chunked(DONE) + b"0\r\n\r\n")
            await writer.drain()

    upstream = await stub(replica)
    gw = await gateway(upstream.base, sse_heartbeat=BEAT)
    body = b'{"model":"support-bot","stream":true,"messages":[{"role":"user","content":"hi"}]}'
    request = raw_request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json", "Content-Length": str(len(body))})
    reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
    answers = []
    try:
        assert await wait_until(lambda: len(gw.runner.server.connections) == 1, timeout=10.0)
        (connection,) = gw.runner.server.connections
        recorder = connection.transport = StackRecorder(connection.transport)
        for _ in range(2):
            writer.write(request)
            got = b""
            while not got.endswith(b"\r\n0\r\n\r\n"):
                more = await asyncio.wait_for(reader.read(65536), 20)
                assert more, got
                got += more
            answers.append(got)
    finally:
        writer.close()
    whole, broken = answers
    head, _, events = whole.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK\r\n") and events.startswith(b"d\r\n: keepalive\n\n\r\n")  # the headers with a beat
    before, _, after = events.partition(b'"content":"Hi"')
    assert before.count(b": keepalive") >= 2 and after.count(b": keepalive") >= 2 and after.endswith(DONE + b"\r\n0\r\n\r\n")
    assert b'"code":"upstream_unavailable"' in broken
    through("streamproxy/http/body.py", recorder)
