"""Limits and overload: body and header caps, n and max_tokens, 429 at once,
503 while loading, 503 after the engine died (in-flight streams get an error event),
a storm of engine errors that leaves nothing behind (baseline.py)."""

from __future__ import annotations

import asyncio
import json
import time

import aiohttp

from engine_adapter.fake import FakeScript
from tests.production.baseline import Baseline
from tests.production.raw_http import chat_body, http_request, read_head
from tests.support import USER_HI, sse, wait_until
from tests.support.fake import hold_start


def _err(raw: bytes) -> dict:
    data = json.loads(raw)
    assert list(data) == ["error"] and set(data["error"]) == {"message", "type", "param", "code"}, data
    return data["error"]


async def test_body_over_cap_is_413(server, session):
    srv = await server(max_body_bytes=2000)
    async with session.post(
        srv.url("/v1/chat/completions"), json={"messages": [{"role": "user", "content": "x" * 5000}]}
    ) as resp:
        assert resp.status == 413
        err = _err(await resp.read())
    assert err["code"] == "request_too_large" and "2000" in err["message"]
    assert srv.engine.submitted == []


async def _raw(port: int, data: bytes, *, closes: bool = False) -> tuple[int, dict[str, str], bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        await writer.drain()
        status, headers = await read_head(reader)
        body = await reader.readexactly(int(headers["content-length"]))
        if closes:
            assert await asyncio.wait_for(reader.read(), 2.0) == b""  # the server closed the connection
        return status, headers, body
    finally:
        writer.close()


async def test_header_too_large_is_431_with_openai_body(server, access_log):
    srv = await server(max_header_bytes=1024)
    big = http_request("POST", "/v1/chat/completions", chat_body(), {"X-Big": "y" * 2000})
    status, headers, body = await _raw(srv.port, big, closes=True)
    assert status == 431
    assert headers["content-type"].startswith("application/json")
    assert b"yyy" not in body  # the offending bytes are not echoed
    err = _err(body)
    assert err["code"] == "request_header_too_large" and err["type"] == "invalid_request_error"
    assert srv.engine.submitted == []
    assert any('"status":431' in line for line in access_log)
    # A long request line (URL) is capped the same way.
    status, _, body = await _raw(srv.port, http_request("GET", "/v1/models?" + "q" * 2000))
    assert status == 431 and _err(body)["code"] == "request_header_too_large"
    # Just under the cap is fine.
    ok = http_request("POST", "/v1/chat/completions", chat_body(), {"X-Big": "y" * 900})
    status, _, body = await _raw(srv.port, ok)
    assert status == 200 and json.loads(body)["choices"][0]["message"]["content"] == "Hello world"


async def test_too_many_headers_is_431(server):
    srv = await server()  # vLLM's default: 256 (--h11-max-header-count / --max-header-count)
    status, _, _ = await _raw(srv.port, http_request("GET", "/v1/models", b"", {f"X-H{i}": "v" for i in range(200)}))
    assert status == 200
    status, _, body = await _raw(srv.port, http_request("GET", "/v1/models", b"", {f"X-H{i}": "v" for i in range(300)}))
    assert status == 431 and _err(body)["code"] == "request_header_too_large"
    srv = await server(max_header_count=20)
    status, _, body = await _raw(srv.port, http_request("GET", "/v1/models", b"", {f"X-H{i}": "v" for i in range(30)}))
    assert status == 431 and _err(body)["code"] == "request_header_too_large"


async def test_malformed_http_is_400_with_openai_body(server):
    srv = await server()
    status, _, body = await _raw(srv.port, b"GET /v1/models HTTP/1.1\r\nHost 127.0.0.1\r\n\r\n")
    assert status == 400 and _err(body)["type"] == "invalid_request_error"


async def test_n_is_capped(server, session):
    srv = await server(max_n=4)
    async with session.post(srv.url("/v1/chat/completions"), json={"messages": USER_HI, "n": 5}) as resp:
        assert resp.status == 400
        err = _err(await resp.read())
    assert err["param"] == "n"
    async with session.post(srv.url("/v1/chat/completions"), json={"messages": USER_HI, "n": 4}) as resp:
        assert resp.status == 200 and len((await resp.json())["choices"]) == 4


async def test_max_tokens_is_capped_by_the_context(server, session):
    srv = await server(max_model_len=100)
    prompt_len = len("<|user|>hi\n<|assistant|>")
    async with session.post(
        srv.url("/v1/chat/completions"), json={"messages": USER_HI, "max_tokens": 100 - prompt_len + 1}
    ) as resp:
        assert resp.status == 400
        err = _err(await resp.read())
    assert err["code"] == "context_length_exceeded"
    assert srv.engine.submitted == []


async def test_over_capacity_is_429_at_once_never_5xx(server, session):
    srv = await server(FakeScript(text=" x", token_delay=0.05), max_concurrent_requests=2, max_queued_requests=3)
    url = srv.url("/v1/completions")

    async def one(i: int) -> tuple[int, str | None, float, float, bytes]:
        async with session.post(url, json={"prompt": "hi", "max_tokens": 15, "stream": i % 2 == 0}) as resp:
            answered = time.monotonic()
            raw = await resp.read()
            return resp.status, resp.headers.get("Retry-After"), answered, time.monotonic(), raw

    results = await asyncio.gather(*(one(i) for i in range(40)))
    statuses = [r[0] for r in results]
    assert set(statuses) <= {200, 429}, statuses
    rejected = [r for r in results if r[0] == 429]
    assert len(rejected) >= 40 - 5 - 5  # at most 2 running + 3 waiting at any moment, a few finish meanwhile
    first_done = min(done for status, _, _, done, _ in results if status == 200)
    for _status, retry_after, answered, _, raw in rejected:
        assert retry_after is not None and int(retry_after) >= 1
        assert answered < first_done  # answered at once, not after waiting for a slot
        err = _err(raw)
        assert err["type"] == "rate_limit_error" and err["code"] == "too_many_requests"
    assert srv.state.admission.rejected == len(rejected)
    assert srv.state.admission.active == 0 and srv.state.admission.queued == 0


async def test_queue_zero_means_nobody_waits(server, session):
    srv = await server(FakeScript(text=" x", token_delay=0.05), max_concurrent_requests=1, max_queued_requests=0)
    holder = asyncio.ensure_future(session.post(srv.url("/v1/completions"), json={"prompt": "hi", "max_tokens": 10}))
    assert await wait_until(lambda: srv.engine.num_running == 1, 5.0)
    async with session.post(srv.url("/v1/completions"), json={"prompt": "hi", "max_tokens": 1}) as resp:
        assert resp.status == 429 and resp.headers["Retry-After"] == "1"
    assert (await holder).status == 200


async def test_engine_loading_is_503_with_retry_after(server, session, monkeypatch):
    release = hold_start(monkeypatch)
    srv = await server(wait_ready=False)
    async with session.get(srv.url("/health")) as resp:
        assert resp.status == 503 and (await resp.json())["status"] == "loading"
    for route, body in (("/v1/chat/completions", {"messages": USER_HI}), ("/v1/completions", {"prompt": "hi", "stream": True})):
        async with session.post(srv.url(route), json=body) as resp:
            assert resp.status == 503
            assert int(resp.headers["Retry-After"]) > 0
            err = _err(await resp.read())
        assert err["code"] == "engine_loading" and err["type"] == "service_unavailable"
    assert srv.engine.state == "loading"
    release.set()
    assert await wait_until(lambda: srv.engine.state == "ready", 10.0)
    async with session.post(srv.url("/v1/chat/completions"), json={"messages": USER_HI}) as resp:
        assert resp.status == 200


async def test_engine_death_error_event_in_flight_then_503(server, session):
    srv = await server(FakeScript(text=" x", token_delay=0.03))
    url = srv.url("/v1/chat/completions")

    mid_stream = 0

    async def stream() -> bytes:
        nonlocal mid_stream
        async with session.post(url, json={"messages": USER_HI, "stream": True, "max_tokens": 1000}) as resp:
            assert resp.status == 200
            body = b""
            while b'"content":" x"' not in body:
                body += await resp.content.readuntil(b"\n\n")
            mid_stream += 1
            return body + await resp.read()

    async def nonstream() -> tuple[int, bytes]:
        async with session.post(url, json={"messages": USER_HI, "max_tokens": 1000}) as resp:
            return resp.status, await resp.read()

    streams = [asyncio.ensure_future(stream()) for _ in range(5)]
    plain = asyncio.ensure_future(nonstream())
    assert await wait_until(lambda: srv.engine.num_running == 6 and mid_stream == 5, 10.0)
    srv.engine.kill()
    for body in await asyncio.gather(*streams):
        assert sse.verdict(body) == "error"
        assert b'"content":" x"' in body  # it was mid-stream
    status, raw = await plain
    assert status == 500 and _err(raw)["code"] == "engine_error"
    # New requests: 503 engine_dead with Retry-After; /health says so.
    for request in ({"messages": USER_HI}, {"messages": USER_HI, "stream": True}):
        async with session.post(url, json=request) as resp:
            assert resp.status == 503 and int(resp.headers["Retry-After"]) > 0
            err = _err(await resp.read())
        assert err["code"] == "engine_dead"
    async with session.get(srv.url("/health")) as resp:
        assert resp.status == 503


async def test_storm_of_engine_errors_leaves_nothing_behind(server):
    """300 requests at once, every other one failing in the engine after 3 tokens, streaming
    and not: each gets its own answer, and the server is back at its baseline after."""
    srv = await server(FakeScript(text=" x", token_delay=0.01, fail_after=3, fail_on="FAIL"))
    before = Baseline.take()
    verdicts: list[tuple[bool, bool, int, str]] = []
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60)) as session:

        async def one(i: int) -> None:
            fail, stream = i % 2 == 0, i % 3 != 0
            body = {"messages": [{"role": "user", "content": "please FAIL" if fail else "hi"}], "stream": stream, "max_tokens": 20}
            async with session.post(srv.url("/v1/chat/completions"), json=body) as resp:
                raw = await resp.read()
            verdicts.append((fail, stream, resp.status, sse.verdict(raw) if stream else _err(raw)["code"] if fail else "done"))

        await asyncio.gather(*(one(i) for i in range(300)))
    assert len(verdicts) == 300
    for fail, stream, status, verdict in verdicts:
        assert status == (500 if fail and not stream else 200), (fail, stream, status)
        assert verdict == (("error" if stream else "engine_error") if fail else "done"), (fail, stream, verdict)
    await before.back(srv)


async def test_a_batch_takes_one_slot_per_prompt(server, session):
    srv = await server(FakeScript(text=" x", token_delay=0.05), max_concurrent_requests=3, max_queued_requests=0)
    url = srv.url("/v1/completions")
    # More prompts than the server ever runs at once: a 400 that says so (it could never be admitted).
    async with session.post(url, json={"prompt": ["a", "b", "c", "d"], "max_tokens": 1}) as resp:
        err = _err(await resp.read())
        assert resp.status == 400 and err["param"] == "prompt" and "at most 3" in err["message"], err
    holder = asyncio.ensure_future(session.post(url, json={"prompt": ["a", "b"], "max_tokens": 10}))
    assert await wait_until(lambda: srv.state.admission.active == 2 and srv.engine.num_running == 2, 5.0)
    # Two of three slots taken by the batch: a second batch of two does not fit, a single prompt does.
    async with session.post(url, json={"prompt": ["a", "b"], "max_tokens": 1}) as resp:
        assert resp.status == 429, await resp.read()
    async with session.post(url, json={"prompt": "a", "max_tokens": 1}) as resp:
        assert resp.status == 200
    assert (await holder).status == 200
    assert await wait_until(lambda: srv.state.admission.active == 0 and srv.state.admission.queued == 0, 5.0)


async def test_a_queued_batch_waits_for_all_its_slots(server, session):
    srv = await server(FakeScript(text=" x", token_delay=0.05), max_concurrent_requests=2, max_queued_requests=2)
    url = srv.url("/v1/completions")
    holder = asyncio.ensure_future(session.post(url, json={"prompt": "a", "max_tokens": 10}))
    assert await wait_until(lambda: srv.engine.num_running == 1, 5.0)
    batch = asyncio.ensure_future(session.post(url, json={"prompt": ["a", "b"], "max_tokens": 1}))
    assert await wait_until(lambda: srv.state.admission.queued == 2, 5.0)
    assert srv.engine.num_running == 1  # one slot was free, but the batch needs two: nothing of it runs yet
    assert (await holder).status == 200
    resp = await batch
    assert resp.status == 200 and [c["index"] for c in (await resp.json())["choices"]] == [0, 1]
    assert srv.state.admission.active == 0 and srv.state.admission.queued == 0
