"""The engine fails mid-generation: in-band error + clean end for streams, an OpenAI error otherwise."""

from __future__ import annotations

import json

from engine_adapter.fake import FakeScript
from streamproxy.http.state import SYSTEM_FINGERPRINT
from tests.http.http_support import assert_openai_error, normalize_created
from tests.support import USER_HI, sse

FAILING = FakeScript(text="Hello! This is a fake streamed answer. ", fail_after=3, token_delay=0.005)
ERROR_EVENT = (
    b'data: {"error":{"message":"generation failed: injected failure after 3 tokens",'
    b'"type":"internal_error","param":null,"code":"engine_error"}}'
)


async def test_stream_failure_is_in_band_then_done(serve):
    client, engine = await serve(FAILING)
    resp = await client.post(
        "/v1/chat/completions", json={"messages": USER_HI, "stream": True}, headers={"X-Request-Id": "f-1"}
    )
    assert resp.status == 200
    raw, _ = normalize_created(await resp.read())
    assert b"Traceback" not in raw
    head = b'data: {"id":"chatcmpl-f-1","object":"chat.completion.chunk","created":0,"model":"fake","system_fingerprint":"' + SYSTEM_FINGERPRINT.encode() + b'",'
    expected = [
        head + b'"choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}',
        head + b'"choices":[{"index":0,"delta":{"content":"Hello!"},"logprobs":null,"finish_reason":null}]}',
        head + b'"choices":[{"index":0,"delta":{"content":" This"},"logprobs":null,"finish_reason":null}]}',
        head + b'"choices":[{"index":0,"delta":{"content":" is"},"logprobs":null,"finish_reason":null}]}',
        ERROR_EVENT,
        b"data: [DONE]",
    ]
    assert sse.frames(raw) == expected
    err = json.loads(ERROR_EVENT[6:])
    assert set(err["error"]) == {"message", "type", "param", "code"}
    assert engine.num_running == 0


async def test_stream_failure_with_include_usage_has_no_usage_chunk_but_done(serve):
    client, _ = await serve(FAILING)
    resp = await client.post(
        "/v1/chat/completions",
        json={"messages": USER_HI, "stream": True, "stream_options": {"include_usage": True}},
    )
    frames = sse.frames(await resp.read())
    assert frames[-2] == ERROR_EVENT
    assert frames[-1] == b"data: [DONE]"
    assert sum(b'"content":' in f and b'"role"' not in f for f in frames) == 3


async def test_completions_stream_failure(serve):
    client, _ = await serve(FAILING)
    resp = await client.post("/v1/completions", json={"prompt": "hi", "stream": True, "max_tokens": 50})
    assert resp.status == 200
    frames = sse.frames(await resp.read())
    assert [json.loads(f[6:])["choices"][0]["text"] for f in frames[:3]] == ["Hello!", " This", " is"]
    assert frames[3:] == [ERROR_EVENT, b"data: [DONE]"]


async def test_nonstream_failure_is_openai_500(serve):
    client, engine = await serve(FAILING)
    resp = await client.post("/v1/chat/completions", json={"messages": USER_HI}, headers={"X-Request-Id": "f-2"})
    raw = await resp.read()
    assert_openai_error(
        resp.status, resp.headers, raw, expect_status=500, type="internal_error", param=None, code="engine_error"
    )
    assert raw == ERROR_EVENT[6:]
    assert resp.headers["X-Request-Id"] == "f-2"
    assert engine.num_running == 0


async def test_engine_dead_is_503(serve):
    client, engine = await serve()
    engine.kill()
    resp = await client.post("/v1/chat/completions", json={"messages": USER_HI})
    assert_openai_error(resp.status, resp.headers, await resp.read(), expect_status=503, type="service_unavailable")
    assert resp.headers.get("Retry-After")
    resp = await client.get("/health")
    assert resp.status == 503


# The engine's refusal of a request after it was accepted (vLLM 0.33's `EngineCoreOutput.error`, e.g. a
# grammar the engine core cannot compile: validation_error) and a failure it asks to retry (a paused
# engine: engine_paused), as vLLM's error handler answers them: 400 and 503, in-band once streaming.
async def test_an_engine_refusal_after_acceptance_is_a_400(serve):
    client, engine = await serve(FakeScript(fail_after=0, fail_as="rejected"))
    resp = await client.post("/v1/chat/completions", json={"messages": USER_HI})
    raw = await resp.read()
    assert_openai_error(resp.status, resp.headers, raw, expect_status=400, type="invalid_request_error", param=None, code=None)
    assert json.loads(raw)["error"]["message"] == "injected failure after 0 tokens"
    resp = await client.post("/v1/chat/completions", json={"messages": USER_HI, "stream": True})
    assert resp.status == 200
    frames = sse.frames(await resp.read())
    assert frames[-2:] == [b'data: {"error":{"message":"injected failure after 0 tokens","type":"invalid_request_error",'
                           b'"param":null,"code":null}}', b"data: [DONE]"]
    assert engine.num_running == 0


async def test_an_engine_failure_it_asks_to_retry_is_a_503(serve):
    client, engine = await serve(FakeScript(fail_after=0, fail_as="retryable"))
    resp = await client.post("/v1/chat/completions", json={"messages": USER_HI})
    raw = await resp.read()
    assert_openai_error(resp.status, resp.headers, raw, expect_status=503, type="service_unavailable", param=None, code="engine_paused")
    assert resp.headers["x-should-retry"] == "true"
    assert json.loads(raw)["error"]["message"] == "generation failed: injected failure after 0 tokens"
    resp = await client.post("/v1/completions", json={"prompt": "hi", "stream": True})
    frames = sse.frames(await resp.read())
    assert frames[-2:] == [b'data: {"error":{"message":"generation failed: injected failure after 0 tokens",'
                           b'"type":"service_unavailable","param":null,"code":"engine_paused"}}', b"data: [DONE]"]
    assert engine.num_running == 0
