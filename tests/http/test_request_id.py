"""X-Request-Id: echoed or generated on every response; it names the engine request and the response id."""

from __future__ import annotations

import asyncio

import pytest

from engine_adapter.fake import FakeScript
from tests.support import USER_HI, sse, wait_until

REQUESTS = [
    ("POST", "/v1/chat/completions", {"messages": USER_HI}, 200),
    ("POST", "/v1/chat/completions", {"messages": USER_HI, "stream": True}, 200),
    ("POST", "/v1/completions", {"prompt": "hi"}, 200),
    ("GET", "/v1/models", None, 200),
    ("GET", "/v1/models/fake", None, 200),
    ("GET", "/health", None, 200),
    ("GET", "/version", None, 200),
    ("GET", "/v1/models/other", None, 404),
    ("GET", "/nowhere", None, 404),
    ("GET", "/v1/chat/completions", None, 405),
    ("POST", "/v1/chat/completions", {"messages": []}, 400),
    ("POST", "/v1/chat/completions", {"messages": USER_HI, "model": "x"}, 404),
]
IDS = [f"{m}-{p}-{s}" for m, p, _, s in REQUESTS]


@pytest.mark.parametrize(("method", "path", "body", "status"), REQUESTS, ids=IDS)
async def test_request_id_echoed(serve, method, path, body, status):
    client, _ = await serve()
    resp = await client.request(method, path, json=body, headers={"X-Request-Id": "trace-42.a:b_c"})
    await resp.read()
    assert resp.status == status
    assert resp.headers["X-Request-Id"] == "trace-42.a:b_c"


@pytest.mark.parametrize(("method", "path", "body", "status"), REQUESTS, ids=IDS)
async def test_request_id_generated(serve, method, path, body, status):
    client, _ = await serve()
    seen = set()
    for _ in range(2):
        resp = await client.request(method, path, json=body)
        await resp.read()
        assert resp.status == status
        rid = resp.headers.get("X-Request-Id")
        assert rid and rid.strip() == rid
        seen.add(rid)
    assert len(seen) == 2, "each request gets its own id"


async def test_request_id_on_413(serve):
    client, _ = await serve(max_body_bytes=100)
    resp = await client.post(
        "/v1/chat/completions", data=b"{" + b" " * 200 + b"}", headers={"X-Request-Id": "big-1", "Content-Type": "application/json"}
    )
    assert resp.status == 413
    assert resp.headers["X-Request-Id"] == "big-1"


async def test_unsafe_request_id_is_replaced(serve):
    client, _ = await serve()
    for bad in ["has space", "x" * 200, "quote\"x", "new\\line"]:
        resp = await client.get("/v1/models", headers={"X-Request-Id": bad})
        assert resp.status == 200
        rid = resp.headers["X-Request-Id"]
        assert rid and rid != bad


async def test_request_id_is_engine_id_and_response_id(serve):
    client, engine = await serve()
    resp = await client.post("/v1/chat/completions", json={"messages": USER_HI}, headers={"X-Request-Id": "abc-123"})
    data = await resp.json()
    assert engine.submitted[-1][0] == "abc-123"
    assert data["id"] == "chatcmpl-abc-123"

    resp = await client.post("/v1/chat/completions", json={"messages": USER_HI, "stream": True}, headers={"X-Request-Id": "abc-124"})
    payloads = sse.payloads(await resp.read())
    assert engine.submitted[-1][0] == "abc-124"
    assert {p["id"] for p in payloads} == {"chatcmpl-abc-124"}

    resp = await client.post("/v1/completions", json={"prompt": "hi"}, headers={"X-Request-Id": "abc-125"})
    assert (await resp.json())["id"] == "cmpl-abc-125"
    assert engine.submitted[-1][0] == "abc-125"


async def test_generated_request_id_is_engine_id_and_response_id(serve):
    client, engine = await serve()
    resp = await client.post("/v1/chat/completions", json={"messages": USER_HI})
    data = await resp.json()
    rid = resp.headers["X-Request-Id"]
    assert engine.submitted[-1][0] == rid
    assert data["id"] == "chatcmpl-" + rid

    resp = await client.post("/v1/chat/completions", json={"messages": USER_HI, "stream": True})
    rid = resp.headers["X-Request-Id"]
    payloads = sse.payloads(await resp.read())
    assert engine.submitted[-1][0] == rid
    assert {p["id"] for p in payloads} == {"chatcmpl-" + rid}


@pytest.mark.parametrize("stream", [False, True])
async def test_concurrent_requests_with_same_request_id_both_finish(serve, stream):
    client, engine = await serve(FakeScript(text=" w", token_delay=0.02))

    async def one() -> tuple[int, bytes]:
        resp = await client.post(
            "/v1/chat/completions",
            json={"messages": USER_HI, "max_tokens": 5, "stream": stream},
            headers={"X-Request-Id": "dup-1"},
        )
        return resp.status, await resp.read()

    results = await asyncio.wait_for(asyncio.gather(one(), one()), timeout=10.0)  # neither may hang
    # Either both are served, or a duplicate is refused with a client error; neither may hang.
    for status, body in results:
        assert status == 200 or 400 <= status < 500, (status, body)
    assert [status for status, _ in results] == [200, 200]
    assert sorted(rid for rid, _, _ in engine.submitted[-2:]) == ["dup-1", "dup-1-2"]
    assert await wait_until(lambda: engine.num_running == 0, timeout=5.0)
