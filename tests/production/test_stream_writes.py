"""What a streamed answer costs serve's socket: the status line and headers leave in one write
with the first frame (the role chunk), as they did before the public-API server (1d2915d), and
the last frames with the terminating chunk. Seen on the server's side of the connection: its
transport (the public `transport` of the connection's handler, found in the runner's
`web.Server.connections`) wrapped in one that records each write; the bytes written are the bytes
the client read."""

from __future__ import annotations

import json

from engine_adapter.fake import FakeScript
from tests.support.served import recorded_answer


async def test_the_headers_leave_with_the_first_frame_and_the_last_frames_with_the_end(server):
    s = await server(FakeScript(tokens=["Hel", "lo"]))
    body = json.dumps({"model": "fake", "stream": True, "messages": [{"role": "user", "content": "hi"}]}).encode()
    request = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    writes, got = await recorded_answer(lambda: s.runner.server.connections, s.port, request)
    assert b"".join(writes) == got
    head, _, first = writes[0].partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK\r\n") and b'"role":"assistant"' in first and first.endswith(b"\n\n\r\n")
    assert writes[-1].endswith(b"data: [DONE]\n\n\r\n0\r\n\r\n") and b"data: [DONE]" not in b"".join(writes[:-1])
