"""What a streamed answer costs serve's socket: the status line and headers leave in one write
with the first frame (the role chunk), as they did before the public-API server (1d2915d), and
the last frames with the terminating chunk. Seen on the server's side of the connection: its
transport (the public `transport` of the connection's handler, found in the runner's
`web.Server.connections`) wrapped in one that records each write; the bytes written are the bytes
the client read."""

from __future__ import annotations

import asyncio
import json

from engine_adapter.fake import FakeScript
from tests.support import wait_until
from tests.support.served import WriteRecorder


async def test_the_headers_leave_with_the_first_frame_and_the_last_frames_with_the_end(server):
    s = await server(FakeScript(tokens=["Hel", "lo"]))
    reader, writer = await asyncio.open_connection("127.0.0.1", s.port)
    try:
        assert await wait_until(lambda: len(s.runner.server.connections) == 1, timeout=10.0)
        (connection,) = s.runner.server.connections
        recorder = connection.transport = WriteRecorder(connection.transport)
        body = json.dumps({"model": "fake", "stream": True, "messages": [{"role": "user", "content": "hi"}]}).encode()
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        got = b""
        while not got.endswith(b"\r\n0\r\n\r\n"):
            more = await asyncio.wait_for(reader.read(65536), 10)
            assert more, got
            got += more
    finally:
        writer.close()
    writes = recorder.writes
    assert b"".join(writes) == got
    head, _, first = writes[0].partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK\r\n") and b'"role":"assistant"' in first and first.endswith(b"\n\n\r\n")
    assert writes[-1].endswith(b"data: [DONE]\n\n\r\n0\r\n\r\n") and b"data: [DONE]" not in b"".join(writes[:-1])
