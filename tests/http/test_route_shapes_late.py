"""The route's own shapes also after the headers: late errors and keepalives while queued.

A non-stream answer that is slow gets its 200 early (then keepalive
newlines); an error after that goes into the body, in the route's error
shape (Anthropic's on /v1/messages, OpenAI's elsewhere). A stream that
waits for an admission slot is kept alive with its encoder's keepalive
(`event: ping` on /v1/messages, an SSE comment elsewhere), as it is once
generating.
"""

from __future__ import annotations

import asyncio
import json

from engine_adapter.fake import FakeScript
from tests.support import USER_HI
from tests.support.api_events import check_anthropic
from tests.support.sse import named_events

LATE = dict(nonstream_keepalive_after=0.05, nonstream_keepalive_interval=0.03)


async def test_anthropic_error_after_the_early_200_is_in_anthropics_shape(serve):
    client, _ = await serve(FakeScript(text=" x", fail_after=3, token_delay=0.05), **LATE)
    r = await client.post("/v1/messages", json={"max_tokens": 50, "messages": USER_HI})
    assert r.status == 200
    raw = await r.read()
    assert raw.startswith(b"\n")
    data = json.loads(raw)
    assert data == {"type": "error", "error": {"type": "api_error", "message": data["error"]["message"]}}
    assert "injected failure" in data["error"]["message"]


async def test_other_routes_keep_the_openai_shape_after_the_early_200(serve):
    client, _ = await serve(FakeScript(text=" x", fail_after=3, token_delay=0.05), **LATE)
    for path, body in [("/v1/responses", {"input": "hi"}), ("/v1/chat/completions", {"messages": USER_HI})]:
        r = await client.post(path, json=body)
        data = json.loads(await r.read())
        assert r.status == 200 and list(data) == ["error"] and data["error"]["code"] == "engine_error", (path, data)


async def test_queued_stream_gets_the_encoders_keepalive(serve):
    client, _ = await serve(
        FakeScript(text=" x", token_delay=0.05), sse_heartbeat=0.05, max_concurrent_requests=1, max_queued_requests=2
    )
    busy = asyncio.ensure_future(client.post("/v1/chat/completions", json={"messages": USER_HI, "max_tokens": 8}))
    await asyncio.sleep(0.05)  # the first request holds the only slot for ~0.4 s
    queued_anthropic = client.post("/v1/messages", json={"max_tokens": 2, "messages": USER_HI, "stream": True})
    queued_chat = client.post("/v1/chat/completions", json={"messages": USER_HI, "max_tokens": 2, "stream": True})
    first, a, c = await asyncio.gather(busy, queued_anthropic, queued_chat)
    assert first.status == 200 and (await first.json())["choices"][0]["finish_reason"] == "length"
    body = await a.read()
    events = named_events(body)
    check_anthropic(events)
    assert events[0][0] == "ping", [e for e, _ in events][:4]  # while queued: before message_start
    assert b": keepalive" not in body
    chat_body = await c.read()
    assert chat_body.startswith(b": keepalive\n\n") and b"event: ping" not in chat_body
