"""`serve`'s edge contract for relayed traffic: SSE heartbeats while the replica is silent
(before and after its answer), the stream headers, `X-Request-Id` kept or made and sent
upstream, the non-stream keepalive with late errors in each route's shape,
`generation_timeout` at `request_timeout`, and 413 from `Content-Length` alone."""

from __future__ import annotations

import asyncio
import json
import re

import aiohttp
import pytest

from engine_adapter.fake import FakeScript
from tests.gateway.gateway_support import (
    DEPLOYMENT,
    SERVED,
    SSE_HEAD,
    chat,
    chunked,
    error_body,
    post,
    raw_request,
    renamed,
)
from tests.production.raw_http import read_head
from tests.support import sse, wait_until

SILENT = FakeScript(text=" word", ttft=30.0, token_delay=0.05)  # no token for far longer than any test waits
PING = b'event: ping\ndata: {"type":"ping"}\n\n'
MESSAGES = {"model": DEPLOYMENT, "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
CHUNK = b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"Qwen/Qwen3-8B","choices":[{"index":0,"delta":{"content":"x"},"finish_reason":"stop"}]}\n\n'


async def read_frame(resp: aiohttp.ClientResponse) -> bytes:
    return await asyncio.wait_for(resp.content.readuntil(b"\n\n"), 10)


def held_answer(release: asyncio.Event, head: bytes, body: bytes):
    """A stub replica that reads the request and answers only once `release` is set."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await release.wait()
        writer.write(head + body)
        await writer.drain()
        await reader.read()  # until the gateway closes the connection

    return handler


async def test_stream_headers_and_heartbeats_while_the_replica_is_silent(replica, gateway, session):
    r = await replica(SILENT)
    gw = await gateway(r, sse_heartbeat=0.05)
    async with session.post(gw.url("/v1/chat/completions"), json=chat(stream=True)) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"] == "text/event-stream"
        assert resp.headers["Cache-Control"] == "no-cache"
        assert resp.headers["X-Accel-Buffering"] == "no"
        role = await read_frame(resp)  # the replica's first event (it answers at once, then generates nothing)
        assert b'"role":"assistant"' in role and b'"model":"support-bot"' in role
        assert [await read_frame(resp) for _ in range(3)] == [sse.KEEPALIVE_FRAME + b"\n\n"] * 3


OPENAI_STREAM = CHUNK + b"data: [DONE]\n\n"
ANTHROPIC_STREAM = (
    b'event: message_start\ndata: {"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant",'
    b'"model":"Qwen/Qwen3-8B","content":[],"stop_reason":null,"usage":{"input_tokens":3,"output_tokens":0}}}\n\n'
    b'event: message_stop\ndata: {"type":"message_stop"}\n\n'
)


@pytest.mark.parametrize(
    ("path", "body", "beat", "stream"),
    [
        ("/v1/chat/completions", chat(stream=True), b": keepalive\n\n", OPENAI_STREAM),
        ("/v1/messages", {**MESSAGES, "stream": True}, PING, ANTHROPIC_STREAM),
    ],
    ids=["openai", "anthropic"],
)
async def test_heartbeats_before_the_replica_answers_then_its_stream(stub, gateway, session, path, body, beat, stream):
    release = asyncio.Event()
    upstream = await stub(held_answer(release, SSE_HEAD, chunked(stream) + b"0\r\n\r\n"))
    gw = await gateway(upstream.base, sse_heartbeat=0.05)
    async with session.post(gw.url(path), json=body) as resp:
        # The headers went out after one heartbeat interval without an answer, then beats.
        assert resp.status == 200 and resp.headers["X-Accel-Buffering"] == "no"
        beats = [await asyncio.wait_for(resp.content.readexactly(len(beat)), 10) for _ in range(2)]
        assert beats == [beat, beat]
        release.set()
        rest = await asyncio.wait_for(resp.read(), 10)
    # More beats may have gone out before the answer came; then the replica's stream, renamed.
    tail = renamed(stream)
    assert tail != stream and rest.endswith(tail) and rest[: -len(tail)] == beat * (len(rest[: -len(tail)]) // len(beat))


async def test_request_id_is_kept_and_sent_upstream(replica, gateway, session):
    r = await replica()
    gw = await gateway(r)
    status, headers, _ = await post(session, gw.url("/v1/chat/completions"), chat(stream=True), **{"X-Request-Id": "client-id-1"})
    assert status == 200 and headers["X-Request-Id"] == "client-id-1"
    assert [(s.request_id, s.headers["X-Request-ID"]) for s in r.inference()] == [("client-id-1", "client-id-1")]
    assert [rid for rid, _, _ in r.engine.submitted] == ["client-id-1"]


async def test_request_id_is_made_when_missing_and_sent_upstream(replica, gateway, session):
    r = await replica()
    gw = await gateway(r)
    status, headers, _ = await post(session, gw.url("/v1/chat/completions"), chat())
    made = headers["X-Request-Id"]
    assert status == 200 and re.fullmatch(r"[0-9a-f]{32}", made)
    assert [s.request_id for s in r.inference()] == [made]
    assert [rid for rid, _, _ in r.engine.submitted] == [made]


async def test_nonstream_keepalive_newlines_then_the_replicas_json(stub, gateway, session):
    release = asyncio.Event()
    answer = b'{"id":"chatcmpl-1","object":"chat.completion","model":"Qwen/Qwen3-8B","choices":[]}'
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(answer)
    upstream = await stub(held_answer(release, head, answer))
    gw = await gateway(upstream.base, nonstream_keepalive_after=0.05, nonstream_keepalive_interval=0.05)
    async with session.post(gw.url("/v1/chat/completions"), json=chat()) as resp:
        assert resp.status == 200 and resp.headers["Content-Type"].startswith("application/json")
        assert await asyncio.wait_for(resp.content.readexactly(1), 10) == b"\n"
        release.set()
        body = await asyncio.wait_for(resp.read(), 10)
    assert body.lstrip(b"\n") == renamed(answer)
    assert json.loads(body)["model"] == DEPLOYMENT  # JSON allows the leading whitespace


async def test_a_replica_error_after_the_early_200_is_the_body_in_each_routes_shape(replica, gateway, session):
    # The replica fails its request a second in, well after the gateway's early 200.
    r = await replica(FakeScript(text=" word", ttft=1.0, fail_after=0))
    gw = await gateway(r, nonstream_keepalive_after=0.05, nonstream_keepalive_interval=0.05)

    async def one(base: str, model: str, path: str, body: dict) -> tuple[int, bytes]:
        status, _, got = await post(session, base + path, {**body, "model": model})
        return status, got

    # Through the gateway, and straight to the replica (all at once: one second, not four).
    (openai_status, openai_body), (anthropic_status, anthropic_body), (direct_openai_status, direct_openai), (_, direct_anthropic) = (
        await asyncio.gather(*(one(base, model, path, body) for base, model in ((gw.base, DEPLOYMENT), (r.base, SERVED))
                               for path, body in (("/v1/chat/completions", chat()), ("/v1/messages", MESSAGES))))
    )
    assert openai_status == anthropic_status == 200
    assert openai_body.startswith(b"\n") and anthropic_body.startswith(b"\n")
    assert direct_openai_status == 500
    # After the newlines: the replica's own error body, in the route's shape.
    assert openai_body.lstrip(b"\n") == direct_openai
    assert json.loads(direct_openai)["error"]["code"] == "engine_error"
    assert anthropic_body.lstrip(b"\n") == direct_anthropic
    assert json.loads(direct_anthropic)["type"] == "error" and json.loads(direct_anthropic)["error"]["type"] == "api_error"


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/messages"], ids=["openai", "anthropic"])
async def test_the_gateways_own_error_after_the_early_200_is_in_the_routes_shape(stub, gateway, session, path):
    release = asyncio.Event()

    async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await release.wait()  # then the connection closes without an answer

    upstream = await stub(hang_up)
    gw = await gateway(upstream.base, nonstream_keepalive_after=0.05, nonstream_keepalive_interval=0.05)
    body = chat() if path.endswith("completions") else MESSAGES
    async with session.post(gw.url(path), json=body) as resp:
        assert resp.status == 200
        assert await asyncio.wait_for(resp.content.readexactly(1), 10) == b"\n"
        release.set()
        got = json.loads(await asyncio.wait_for(resp.read(), 10))
    message = f"no replica of deployment `{DEPLOYMENT}` can take the request now; retry shortly"
    if path.endswith("completions"):
        assert got == error_body(message, "service_unavailable", "upstream_unavailable")
    else:
        assert got == {"type": "error", "error": {"type": "overloaded_error", "message": message}}


async def test_generation_timeout_at_request_timeout(replica, gateway, session):
    r = await replica(SILENT)
    gw = await gateway(r, request_timeout=0.2)
    status, headers, got = await post(session, gw.url("/v1/chat/completions"), chat(), **{"X-Request-Id": "slow-1"})
    assert status == 504
    assert json.loads(got) == error_body("the request did not finish within 0.2 seconds", "timeout_error", "generation_timeout")
    assert headers["x-should-retry"] == "false"
    # The replica's request was closed, so it aborted the generation.
    assert await wait_until(lambda: r.engine.num_running == 0 and "slow-1" in r.engine.aborted, 10.0), r.engine.aborted


async def test_generation_timeout_after_the_early_200_is_in_the_body(replica, gateway, session):
    r = await replica(SILENT)
    gw = await gateway(r, request_timeout=0.3, nonstream_keepalive_after=0.05, nonstream_keepalive_interval=0.05)
    status, _, got = await post(session, gw.url("/v1/chat/completions"), chat())
    assert status == 200 and got.startswith(b"\n")
    assert json.loads(got) == error_body("the request did not finish within 0.3 seconds", "timeout_error", "generation_timeout")


async def test_body_over_the_cap_is_413_before_the_body_is_sent(replica, gateway):
    r = await replica()
    gw = await gateway(r, max_body_bytes=1000)
    reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
    try:
        # Only the head, declaring ten megabytes: the answer must come without a byte of the body.
        writer.write(raw_request("POST", "/v1/chat/completions", headers={"Content-Type": "application/json", "Content-Length": "10000000"}))
        await writer.drain()
        status, headers = await asyncio.wait_for(read_head(reader), 10)
        body = await asyncio.wait_for(reader.readexactly(int(headers["content-length"])), 10)
    finally:
        writer.close()
    assert status == 413
    assert json.loads(body) == error_body(
        "the request body is larger than the limit of 1000 bytes", "invalid_request_error", "request_too_large"
    )
    assert r.inference() == []
