"""Push mode (body.StreamBody.push): engine steps written to the socket from the engine's own step.

What must hold: the bytes on the wire are exactly those of the pull loop
(valid chunked encoding, same SSE frames); a client that stops reading
moves the stream to the pull loop and, once it reads again, back to push;
a sink that raises ends only its own stream, in-band, and the engine's
step loop goes on for everyone else. (Heartbeats of an idle pushed stream
are in tests/production/test_keepalive.py, a disconnect during push in
tests/production/test_client_gone.py.)
"""

from __future__ import annotations

import asyncio
import json
import socket

import pytest

from engine_adapter.fake import FakeScript
from streamproxy.http.body import StreamBody
from tests.http.http_support import normalize_created
from tests.support import USER_HI, sse, wait_until


def _request(path: str, body: dict, rid: str) -> bytes:
    data = json.dumps(body).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\nX-Request-Id: {rid}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + data


def _dechunk(raw: bytes) -> tuple[bytes, list[bytes]]:
    """Strict chunked-encoding parse of a whole response: (headers, chunk payloads)."""
    head, _, rest = raw.partition(b"\r\n\r\n")
    assert b"transfer-encoding: chunked" in head.lower(), head
    chunks: list[bytes] = []
    while True:
        size_line, sep, rest = rest.partition(b"\r\n")
        assert sep, rest[:80]
        size = int(size_line, 16)
        if size == 0:
            assert rest == b"\r\n", rest  # the terminating chunk, no trailers
            return head, chunks
        payload, crlf, rest = rest[:size], rest[size : size + 2], rest[size + 2 :]
        assert len(payload) == size and crlf == b"\r\n"
        chunks.append(payload)


async def _raw(client, body: dict, rid: str, path: str = "/v1/chat/completions") -> bytes:
    reader, w = await asyncio.open_connection(client.server.host, client.server.port)
    w.write(_request(path, body, rid))
    raw = await asyncio.wait_for(reader.read(), 10)
    w.close()
    return raw


STREAM = {"messages": USER_HI, "stream": True, "max_tokens": 12, "stream_options": {"include_usage": True}}


@pytest.mark.parametrize("path,body", [
    ("/v1/chat/completions", STREAM),
    ("/v1/completions", {"prompt": "hi", "stream": True, "max_tokens": 12}),
    ("/v1/chat/completions", {**STREAM, "n": 2, "logprobs": True, "top_logprobs": 2}),
    # A batch (one engine request per prompt, merged): the parts' steps reach the sink from the engine's step too.
    ("/v1/completions", {"prompt": ["hi", "yo"], "echo": True, "logprobs": 1, "stream": True, "max_tokens": 12}),
])
async def test_pushed_stream_is_byte_identical_to_the_pulled_one(serve, pushes, path, body):
    script = FakeScript(text="Hé, ünïcode 🙂 words ", token_delay=0.01)
    pushed_client, _ = await serve(script)
    pulled_client, _ = await serve(script, stream_push=False)
    pulled = await _raw(pulled_client, body, "same-id", path)
    assert pushes == []
    pushed = await _raw(pushed_client, body, "same-id", path)
    assert sum(took for _, took in pushes) >= 12  # every step went through the sink
    head_a, chunks_a = _dechunk(pushed)
    head_b, chunks_b = _dechunk(pulled)
    body_a, _ = normalize_created(b"".join(chunks_a))
    body_b, _ = normalize_created(b"".join(chunks_b))
    assert body_a == body_b
    # One frame per chunk boundary: no chunk splits an SSE event.
    assert all(c.endswith(b"\n\n") for c in chunks_a)
    payloads = sse.payloads(body_a)
    assert payloads and all("choices" in p for p in payloads)


async def test_client_that_stops_reading_moves_to_pull_and_back_to_push(serve, pushes):
    word = " " + "x" * 4095  # one token (the fake splits text into words)
    tokens = 1500  # ~6 MiB, far more than the socket buffers hold
    client, engine = await serve(FakeScript(text=word, token_delay=0.001))
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.setblocking(False)
    loop = asyncio.get_running_loop()
    await loop.sock_connect(s, (client.server.host, client.server.port))
    await loop.sock_sendall(s, _request("/v1/completions", {"prompt": "hi", "stream": True, "max_tokens": tokens}, "slow-1"))
    try:
        # Not reading: the transport buffer fills and the sink refuses.
        assert await wait_until(lambda: any(not took for _, took in pushes), 5.0), pushes[-3:]
        first_refusal = next(i for i, (_, took) in enumerate(pushes) if not took)
        assert any(took for _, took in pushes[:first_refusal])
        # Read everything: the writer catches up, re-arms, and pushes again.
        raw = bytearray()
        while True:
            data = await asyncio.wait_for(loop.sock_recv(s, 1 << 20), 10)
            if not data:
                break
            raw += data
    finally:
        s.close()
    assert any(took for _, took in pushes[first_refusal:]), "never went back to push"
    _, chunks = _dechunk(bytes(raw))
    payloads = sse.payloads(b"".join(chunks))
    text = "".join(p["choices"][0]["text"] for p in payloads if p["choices"])
    assert text == word * tokens  # nothing lost or reordered across the switches
    assert payloads[-1]["choices"][0]["finish_reason"] == "length"
    assert engine.num_running == 0 and engine.aborted == []


async def test_sink_exception_ends_only_that_stream_in_band(serve, monkeypatch):
    original = StreamBody.push

    def flaky(self: StreamBody, deltas):
        if self.record is not None and self.record.request_id == "boom" and self.pushed >= 3:
            raise RuntimeError("injected sink failure")
        return original(self, deltas)

    monkeypatch.setattr(StreamBody, "push", flaky)
    client, engine = await serve(FakeScript(text=" w", token_delay=0.01))

    async def stream(rid: str) -> bytes:
        resp = await client.post(
            "/v1/chat/completions", json={"messages": USER_HI, "stream": True, "max_tokens": 30}, headers={"X-Request-Id": rid}
        )
        assert resp.status == 200
        return await resp.read()

    boom, ok = await asyncio.gather(stream("boom"), stream("ok"))
    frames = sse.frames(boom)
    assert frames[-1] == b"data: [DONE]"
    error = json.loads(frames[-2][len(b"data: ") :])
    assert error["error"]["type"] and "streaming" in error["error"]["message"]
    assert sum(b'"content":" w"' in f for f in frames) == 3
    # The other stream, fed by the same engine steps, is whole.
    payloads = sse.payloads(ok)
    assert "".join(p["choices"][0]["delta"].get("content") or "" for p in payloads) == " w" * 30
    assert payloads[-1]["choices"][0]["finish_reason"] == "length"
    assert await wait_until(lambda: "boom" in engine.aborted and engine.num_running == 0, 5.0)
    # And the engine loop still serves.
    assert "".join(p["choices"][0]["delta"].get("content") or "" for p in sse.payloads(await stream("after"))) == " w" * 30
