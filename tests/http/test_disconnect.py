"""A client that goes away aborts its engine request: mid-stream, before the first token, non-stream."""

from __future__ import annotations

import asyncio

from engine_adapter.fake import FakeScript
from tests.support import USER_HI, wait_until

SLOW = FakeScript(text=" word", token_delay=0.05)  # one token, repeated


async def test_disconnect_mid_stream_aborts(serve):
    client, engine = await serve(SLOW)
    resp = await client.post(
        "/v1/chat/completions",
        json={"messages": USER_HI, "stream": True, "max_tokens": 1000},
        headers={"X-Request-Id": "gone-1"},
    )
    assert resp.status == 200
    role = await resp.content.readuntil(b"\n\n")
    assert b'"role":"assistant"' in role
    first = await resp.content.readuntil(b"\n\n")
    assert b'"content":" word"' in first
    assert engine.num_running == 1
    resp.close()
    assert await wait_until(lambda: "gone-1" in engine.aborted and engine.num_running == 0, timeout=1.0), (
        engine.aborted,
        engine.num_running,
    )
    assert engine.aborted.count("gone-1") == 1


async def test_disconnect_mid_stream_completions_aborts(serve):
    client, engine = await serve(SLOW)
    resp = await client.post(
        "/v1/completions", json={"prompt": "hi", "stream": True, "max_tokens": 1000}, headers={"X-Request-Id": "gone-2"}
    )
    await resp.content.readuntil(b"\n\n")
    resp.close()
    assert await wait_until(lambda: "gone-2" in engine.aborted and engine.num_running == 0, timeout=1.0)


async def test_disconnect_before_first_token_aborts(serve):
    # ttft 2 s: the abort must come from the disconnect itself, not from a failed
    # write when the first token finally arrives.
    client, engine = await serve(FakeScript(text=" word", ttft=2.0, token_delay=0.05))
    resp = await client.post(
        "/v1/chat/completions",
        json={"messages": USER_HI, "stream": True, "max_tokens": 1000},
        headers={"X-Request-Id": "gone-3"},
    )
    assert resp.status == 200
    assert engine.num_running == 1
    resp.close()
    assert await wait_until(lambda: "gone-3" in engine.aborted and engine.num_running == 0, timeout=1.0), (
        engine.aborted,
        engine.num_running,
    )


async def test_nonstream_cancelled_mid_generation_aborts(serve):
    client, engine = await serve(SLOW)
    task = asyncio.ensure_future(
        client.post("/v1/chat/completions", json={"messages": USER_HI, "max_tokens": 1000}, headers={"X-Request-Id": "gone-4"})
    )
    assert await wait_until(lambda: engine.num_running == 1, timeout=1.0)
    await asyncio.sleep(0.15)  # a few tokens in
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        pass
    assert await wait_until(lambda: "gone-4" in engine.aborted and engine.num_running == 0, timeout=1.0), (
        engine.aborted,
        engine.num_running,
    )


async def test_finished_requests_are_not_aborted(serve):
    client, engine = await serve(FakeScript(tokens=["a", "b"]))
    for stream in (False, True):
        resp = await client.post("/v1/chat/completions", json={"messages": USER_HI, "stream": stream})
        await resp.read()
        assert resp.status == 200
    assert engine.aborted == []
    assert engine.num_running == 0


async def test_server_survives_disconnects(serve):
    client, engine = await serve(SLOW)
    for i in range(3):
        resp = await client.post(
            "/v1/chat/completions", json={"messages": USER_HI, "stream": True, "max_tokens": 1000}, headers={"X-Request-Id": f"r{i}"}
        )
        await resp.content.readuntil(b"\n\n")
        resp.close()
    assert await wait_until(lambda: engine.num_running == 0, timeout=1.0)
    assert sorted(engine.aborted) == ["r0", "r1", "r2"]
    resp = await client.post("/v1/chat/completions", json={"messages": USER_HI, "max_tokens": 2})
    assert resp.status == 200
    assert (await resp.json())["choices"][0]["message"]["content"] == " word word"
