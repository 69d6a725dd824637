"""Non-streaming keepalive (newlines, then the JSON), failures after the early 200
(in each route's own error shape), and the request timeout: readable by
json.loads, httpx and the OpenAI SDK.

This file is the one home of the non-stream keepalive; the SSE keepalive is in
test_keepalive.py, and what clients make of both in tests/compat/test_keepalive.py."""

from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest

from engine_adapter.fake import FakeScript
from tests.support import USER_HI, sse, wait_until

SLOW4 = FakeScript(tokens=["a", "b", "c", "d"], token_delay=0.15)  # ~0.6 s
KEEPALIVE = {"nonstream_keepalive_after": 0.1, "nonstream_keepalive_interval": 0.05}
ROUTES = {
    "/v1/chat/completions": {"messages": USER_HI},
    "/v1/completions": {"prompt": "hi"},
}


def _text(route: str, data: dict) -> str:
    choice = data["choices"][0]
    return choice["message"]["content"] if route == "/v1/chat/completions" else choice["text"]


@pytest.mark.parametrize("route", ROUTES)
async def test_newlines_then_json(server, session, route):
    srv = await server(SLOW4, **KEEPALIVE)
    async with session.post(srv.url(route), json=ROUTES[route]) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("application/json")
        raw = await resp.read()
    body = raw.lstrip(b"\n")
    newlines = len(raw) - len(body)
    assert 3 <= newlines <= 40, raw[:20]  # about 10: one every 0.05 s from 0.1 s on
    assert not body.startswith((b" ", b"\r", b"\t"))
    data = json.loads(raw)  # JSON allows the leading whitespace
    assert _text(route, data) == "abcd"
    assert data["usage"]["completion_tokens"] == 4


@pytest.mark.parametrize("route", ROUTES)
async def test_keepalive_body_readable_by_httpx(server, route):
    srv = await server(SLOW4, **KEEPALIVE)
    async with httpx.AsyncClient(timeout=10) as client:
        resp = await client.post(srv.url(route), json=ROUTES[route])
    assert resp.status_code == 200
    assert resp.content.startswith(b"\n")
    assert _text(route, resp.json()) == "abcd"


async def test_keepalive_body_readable_by_openai_sdk(server):
    srv = await server(SLOW4, **KEEPALIVE)
    client = openai.AsyncOpenAI(base_url=srv.base + "/v1", api_key="unused", max_retries=0)
    completion = await client.completions.create(model="fake", prompt="hi", max_tokens=10)
    assert completion.choices[0].text == "abcd"
    chat = await client.chat.completions.create(model="fake", messages=USER_HI)
    assert chat.choices[0].message.content == "abcd"
    await client.close()


@pytest.mark.parametrize("route", ROUTES)
async def test_failure_after_early_200_is_error_body_without_choices(server, session, route):
    srv = await server(FakeScript(text=" x", fail_after=3, token_delay=0.1), **KEEPALIVE)
    async with session.post(srv.url(route), json=ROUTES[route]) as resp:
        assert resp.status == 200
        raw = await resp.read()
    assert raw.startswith(b"\n")
    data = json.loads(raw)
    assert list(data) == ["error"]
    assert set(data["error"]) == {"message", "type", "param", "code"}
    assert data["error"]["code"] == "engine_error"
    assert srv.engine.num_running == 0


LATE = dict(nonstream_keepalive_after=0.05, nonstream_keepalive_interval=0.03)
ERROR_BODY = (
    b'{"error":{"message":"generation failed: injected failure after 3 tokens",'
    b'"type":"internal_error","param":null,"code":"engine_error"}}'
)


async def test_nonstream_failure_after_keepalive_started(server, session):
    # Past `nonstream_keepalive_after` the 200 is already out: the error goes in the body.
    srv = await server(FakeScript(text=" x", fail_after=3, token_delay=0.05), **LATE)
    async with session.post(srv.url("/v1/chat/completions"), json={"messages": USER_HI}) as resp:
        assert resp.status == 200
        raw = await resp.read()
    assert raw.startswith(b"\n")
    assert raw.lstrip(b"\n") == ERROR_BODY
    assert b"Traceback" not in raw


async def test_nonstream_keepalive_then_body(server, session):
    srv = await server(FakeScript(tokens=["a", "b", "c", "d"], token_delay=0.05), **LATE)
    async with session.post(srv.url("/v1/chat/completions"), json={"messages": USER_HI}) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("application/json")
        raw = await resp.read()
    assert raw.startswith(b"\n")
    data = json.loads(raw)
    assert data["choices"][0]["message"]["content"] == "abcd"


async def test_anthropic_error_after_the_early_200_is_in_anthropics_shape(server, session):
    srv = await server(FakeScript(text=" x", fail_after=3, token_delay=0.05), **LATE)
    async with session.post(srv.url("/v1/messages"), json={"max_tokens": 50, "messages": USER_HI}) as r:
        assert r.status == 200
        raw = await r.read()
    assert raw.startswith(b"\n")
    data = json.loads(raw)
    assert data == {"type": "error", "error": {"type": "api_error", "message": data["error"]["message"]}}
    assert "injected failure" in data["error"]["message"]


async def test_other_routes_keep_the_openai_shape_after_the_early_200(server, session):
    srv = await server(FakeScript(text=" x", fail_after=3, token_delay=0.05), **LATE)
    for path, body in [("/v1/responses", {"input": "hi"}), ("/v1/chat/completions", {"messages": USER_HI})]:
        async with session.post(srv.url(path), json=body) as r:
            data = json.loads(await r.read())
            assert r.status == 200 and list(data) == ["error"] and data["error"]["code"] == "engine_error", (path, data)


async def test_request_timeout_before_early_200_is_504_and_aborts(server, session):
    srv = await server(FakeScript(text=" x", token_delay=0.05), request_timeout=0.3, nonstream_keepalive_after=10)
    async with session.post(
        srv.url("/v1/chat/completions"), json={"messages": USER_HI, "max_tokens": 1000}, headers={"X-Request-Id": "slow-1"}
    ) as resp:
        raw = await resp.read()
        assert resp.status == 504
        assert resp.headers["x-should-retry"] == "false"
    err = json.loads(raw)["error"]
    assert err["code"] == "generation_timeout" and err["type"] == "timeout_error"
    assert "0.3 seconds" in err["message"]
    assert await wait_until(lambda: "slow-1" in srv.engine.aborted and srv.engine.num_running == 0, 5.0)


async def test_request_timeout_after_early_200_is_in_body_and_aborts(server, session):
    srv = await server(FakeScript(text=" x", token_delay=0.05), request_timeout=0.35, **KEEPALIVE)
    async with session.post(
        srv.url("/v1/completions"), json={"prompt": "hi", "max_tokens": 1000}, headers={"X-Request-Id": "slow-2"}
    ) as resp:
        assert resp.status == 200
        raw = await resp.read()
    assert raw.startswith(b"\n")
    data = json.loads(raw)
    assert "choices" not in data and data["error"]["code"] == "generation_timeout"
    assert await wait_until(lambda: "slow-2" in srv.engine.aborted and srv.engine.num_running == 0, 5.0)


async def test_openai_sdk_does_not_retry_a_generation_timeout(server):
    # The SDK retries 408/409/429/5xx by default; x-should-retry: false stops it,
    # so a generation that took the whole timeout is not run three times.
    srv = await server(FakeScript(text=" x", token_delay=0.05), request_timeout=0.2, nonstream_keepalive_after=10)
    client = openai.AsyncOpenAI(base_url=srv.base + "/v1", api_key="unused", max_retries=2)
    with pytest.raises(openai.InternalServerError) as info:
        await client.completions.create(model="fake", prompt="hi", max_tokens=1000)
    await client.close()
    assert info.value.status_code == 504
    assert info.value.code == "generation_timeout"
    assert len(srv.engine.submitted) == 1
    assert await wait_until(lambda: srv.engine.num_running == 0, 5.0)


async def test_queue_wait_is_bounded_by_request_timeout(server, session):
    srv = await server(
        FakeScript(text=" x", token_delay=0.05),
        max_concurrent_requests=1,
        max_queued_requests=2,
        request_timeout=0.3,
        nonstream_keepalive_after=10,
        sse_heartbeat=0.1,
    )
    # A stream (no request timeout) holds the only slot for ~1 s.
    holder = asyncio.ensure_future(
        session.post(srv.url("/v1/completions"), json={"prompt": "hi", "stream": True, "max_tokens": 20})
    )
    assert await wait_until(lambda: srv.engine.num_running == 1, 5.0)
    async with session.post(srv.url("/v1/completions"), json={"prompt": "hi", "max_tokens": 2}) as resp:
        raw = await resp.read()
        assert resp.status == 429 and resp.headers["Retry-After"]
    assert json.loads(raw)["error"]["code"] == "queue_timeout"
    # A queued stream already has its 200: the same bound ends it in-band.
    async with session.post(srv.url("/v1/completions"), json={"prompt": "hi", "stream": True, "max_tokens": 2}) as resp:
        assert resp.status == 200
        body = await resp.read()
    assert sse.verdict(body) == "error"
    assert b'"code":"queue_timeout"' in body and body.startswith(b": keepalive\n\n")
    first = await holder
    assert sse.verdict(await first.read()) == "done"
    assert len(srv.engine.submitted) == 1
    assert srv.state.admission.active == 0 and srv.state.admission.queued == 0
