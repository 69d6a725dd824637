"""Golden SSE bytes for chat and completions, usage chunks, headers before the first token."""

from __future__ import annotations

from engine_adapter.base import DeltaQueue
from engine_adapter.fake import FakeScript
from streamproxy.http.state import SYSTEM_FINGERPRINT
from tests.http.http_support import assert_created_sane, normalize_created
from tests.support import USER_HI, USER_HI_PROMPT_TOKENS, sse

FP = SYSTEM_FINGERPRINT.encode()
DONE = sse.DONE_FRAME + b"\n\n"

CHAT_HEAD = b'data: {"id":"chatcmpl-req-1","object":"chat.completion.chunk","created":0,"model":"fake","system_fingerprint":"' + FP + b'",'
CMPL_HEAD = b'data: {"id":"cmpl-req-1","object":"text_completion","created":0,"model":"fake","system_fingerprint":"' + FP + b'",'

CHAT_GOLDEN = (
    CHAT_HEAD + b'"choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}\n\n'
    + CHAT_HEAD + b'"choices":[{"index":0,"delta":{"content":"Hel"},"logprobs":null,"finish_reason":null}]}\n\n'
    + CHAT_HEAD + b'"choices":[{"index":0,"delta":{"content":"lo"},"logprobs":null,"finish_reason":null}]}\n\n'
    + CHAT_HEAD + b'"choices":[{"index":0,"delta":{"content":" world"},"logprobs":null,"finish_reason":null}]}\n\n'
    + CHAT_HEAD + b'"choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}]}\n\n'
)
CHAT_USAGE = CHAT_HEAD + b'"choices":[],"usage":{"prompt_tokens":24,"completion_tokens":3,"total_tokens":27,"prompt_tokens_details":{"cached_tokens":0}}}\n\n'

CMPL_GOLDEN = (
    CMPL_HEAD + b'"choices":[{"index":0,"text":"Hel","logprobs":null,"finish_reason":null}]}\n\n'
    + CMPL_HEAD + b'"choices":[{"index":0,"text":"lo","logprobs":null,"finish_reason":null}]}\n\n'
    + CMPL_HEAD + b'"choices":[{"index":0,"text":" world","logprobs":null,"finish_reason":null}]}\n\n'
    + CMPL_HEAD + b'"choices":[{"index":0,"text":"","logprobs":null,"finish_reason":"stop"}]}\n\n'
)
CMPL_USAGE = CMPL_HEAD + b'"choices":[],"usage":{"prompt_tokens":2,"completion_tokens":3,"total_tokens":5,"prompt_tokens_details":{"cached_tokens":0}}}\n\n'

# Token delay keeps one engine step per write, so the chunking is deterministic.
SCRIPT = FakeScript(tokens=["Hel", "lo", " world"], token_delay=0.01)


def assert_sse_headers(resp) -> None:
    assert resp.status == 200
    assert resp.headers["Content-Type"] == "text/event-stream"
    assert resp.headers["Cache-Control"] == "no-cache"
    assert resp.headers["X-Accel-Buffering"] == "no"
    assert resp.headers["X-Request-Id"] == "req-1"
    assert "Content-Length" not in resp.headers


async def _stream(client, path: str, body: dict) -> bytes:
    resp = await client.post(path, json=body, headers={"X-Request-Id": "req-1"})
    assert_sse_headers(resp)
    raw = await resp.read()
    normalized, created = normalize_created(raw)
    assert_created_sane(created)
    return normalized


async def test_chat_stream_golden(serve):
    client, engine = await serve(SCRIPT)
    assert USER_HI_PROMPT_TOKENS == 24
    body = await _stream(client, "/v1/chat/completions", {"model": "fake", "messages": USER_HI, "stream": True})
    assert body == CHAT_GOLDEN + DONE
    assert engine.submitted[-1][0] == "req-1"


async def test_chat_stream_golden_include_usage(serve):
    client, _ = await serve(SCRIPT)
    body = await _stream(
        client,
        "/v1/chat/completions",
        {"messages": USER_HI, "stream": True, "stream_options": {"include_usage": True}},
    )
    assert body == CHAT_GOLDEN + CHAT_USAGE + DONE
    payloads = sse.payloads(body)
    usage_chunks = [p for p in payloads if "usage" in p]
    assert len(usage_chunks) == 1 and usage_chunks[0] is payloads[-1]
    assert usage_chunks[0]["choices"] == []
    assert usage_chunks[0]["usage"] == {"prompt_tokens": 24, "completion_tokens": 3, "total_tokens": 27, "prompt_tokens_details": {"cached_tokens": 0}}


async def test_chat_stream_include_usage_false_has_no_usage(serve):
    client, _ = await serve(SCRIPT)
    body = await _stream(
        client,
        "/v1/chat/completions",
        {"messages": USER_HI, "stream": True, "stream_options": {"include_usage": False}},
    )
    assert body == CHAT_GOLDEN + DONE
    assert b'"usage"' not in body


async def test_completions_stream_golden(serve):
    client, engine = await serve(SCRIPT)
    body = await _stream(client, "/v1/completions", {"model": "fake", "prompt": "hi", "stream": True})
    assert body == CMPL_GOLDEN + DONE
    assert engine.submitted[-1][0] == "req-1"
    assert engine.submitted[-1][1] == [ord("h"), ord("i")]


async def test_completions_stream_golden_include_usage(serve):
    client, _ = await serve(SCRIPT)
    body = await _stream(
        client, "/v1/completions", {"prompt": "hi", "stream": True, "stream_options": {"include_usage": True}}
    )
    assert body == CMPL_GOLDEN + CMPL_USAGE + DONE


async def test_chat_continuous_usage_on_every_chunk(serve):
    client, _ = await serve(SCRIPT)
    body = await _stream(
        client,
        "/v1/chat/completions",
        {"messages": USER_HI, "stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True}},
    )
    payloads = sse.payloads(body)
    assert len(payloads) == 6  # role, 3 content, finish, final usage
    assert all("usage" in p for p in payloads), payloads
    assert [p["usage"]["completion_tokens"] for p in payloads] == [0, 1, 2, 3, 3, 3]
    for p in payloads:
        u = p["usage"]
        assert u["prompt_tokens"] == 24
        assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"]
    # Exactly one chunk without choices: the final usage chunk.
    assert [p["choices"] == [] for p in payloads] == [False] * 5 + [True]
    assert [c["delta"].get("content") for p in payloads[:-1] for c in p["choices"]] == ["", "Hel", "lo", " world", None]


async def test_chat_continuous_usage_role_chunk_counts_the_prompt(serve):
    client, _ = await serve(SCRIPT)
    body = await _stream(
        client,
        "/v1/chat/completions",
        {"messages": USER_HI, "stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True}},
    )
    first = sse.payloads(body)[0]
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert first["usage"] == {"prompt_tokens": 24, "completion_tokens": 0, "total_tokens": 24}


async def test_continuous_usage_without_include_usage_adds_nothing(serve):
    # As in vLLM: continuous_usage_stats only takes effect together with include_usage.
    client, _ = await serve(SCRIPT)
    body = await _stream(
        client,
        "/v1/chat/completions",
        {"messages": USER_HI, "stream": True, "stream_options": {"continuous_usage_stats": True}},
    )
    assert body == CHAT_GOLDEN + DONE


async def test_completions_continuous_usage(serve):
    client, _ = await serve(SCRIPT)
    body = await _stream(
        client,
        "/v1/completions",
        {"prompt": "hi", "stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True}},
    )
    payloads = sse.payloads(body)
    assert [p["usage"] for p in payloads] == [
        {"prompt_tokens": 2, "completion_tokens": 1, "total_tokens": 3},
        {"prompt_tokens": 2, "completion_tokens": 2, "total_tokens": 4},
        {"prompt_tokens": 2, "completion_tokens": 3, "total_tokens": 5},
        {"prompt_tokens": 2, "completion_tokens": 3, "total_tokens": 5},
        {"prompt_tokens": 2, "completion_tokens": 3, "total_tokens": 5, "prompt_tokens_details": {"cached_tokens": 0}},
    ]


# -- headers before the first token ---------------------------------------------------


async def _headers_before_first_token(serve, monkeypatch, path: str, body: dict) -> None:
    client, _ = await serve(FakeScript(tokens=["a", "b"], ttft=1.5))
    order: list[str] = []
    put = DeltaQueue.put

    def spy(self: DeltaQueue, deltas: list) -> None:  # the engine hands over its first token
        if "token" not in order:
            order.append("token")
        put(self, deltas)

    monkeypatch.setattr(DeltaQueue, "put", spy)
    resp = await client.post(path, json=body)
    order.append("headers")
    assert resp.status == 200
    assert resp.headers["Content-Type"] == "text/event-stream"
    raw = await resp.read()
    # Headers first, and the engine really did hold the first token back until
    # after them (otherwise this test proves nothing).
    assert order == ["headers", "token"], order
    texts = [c.get("text", c.get("delta", {}).get("content")) for p in sse.payloads(raw) for c in p["choices"]]
    assert "".join(t for t in texts if t) == "ab"


async def test_chat_headers_before_first_token(serve, monkeypatch):
    await _headers_before_first_token(serve, monkeypatch, "/v1/chat/completions", {"messages": USER_HI, "stream": True})


async def test_completions_headers_before_first_token(serve, monkeypatch):
    await _headers_before_first_token(serve, monkeypatch, "/v1/completions", {"prompt": "hi", "stream": True})
