"""Every route through HTTP on the fake engine: any body is a 200 or a 4xx in the route's shape.

The real handlers (their inline checks, generation, the stream encoders and
the filter chain: the app runs with --reasoning-parser qwen3 and the hermes
tool parser, and the fake engine's answer thinks and calls a tool) behind
aiohttp's test server. For every body: never a 5xx, nothing logged at ERROR
(an unhandled exception, even one answered in time), no traceback; a 4xx
is OpenAI's exact error envelope (Anthropic's on /v1/messages*); a 200 is
JSON, or a stream that parses cleanly, ends the way its API ends, and
carries no in-band server error. A smaller budget than test_decoders.py,
which fuzzes the same decoders and preparation directly.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from tests.fuzz.fuzz_support import WORDS, budget, request_bodies
from tests.fuzz.live import Live
from tests.support import sse

SERVER_ERROR_TYPES = {"internal_error", "api_error", "service_unavailable", "timeout_error", "overloaded_error"}


@pytest.fixture(scope="module")
def live() -> Iterator[Live]:
    server = Live()
    yield server
    server.close()


@pytest.fixture(scope="module")
def pooling() -> Iterator[Live]:
    server = Live(runner="pooling")
    yield server
    server.close()


def assert_error(status: int, body: bytes, anthropic: bool) -> None:
    data = json.loads(body)
    if anthropic:
        assert set(data) == {"type", "error"} and data["type"] == "error", data
        assert set(data["error"]) == {"type", "message"}, data
    else:
        assert list(data) == ["error"], data
        assert set(data["error"]) == {"message", "type", "param", "code"}, data
        assert data["error"]["param"] is None or isinstance(data["error"]["param"], str), data
    assert isinstance(data["error"]["message"], str) and data["error"]["message"], data
    assert data["error"]["type"] not in SERVER_ERROR_TYPES, data


def assert_stream(body: bytes, kind: str) -> None:
    frames, problems = sse.parse(body)
    assert problems == [], problems
    payloads = [f.json() for f in frames if f.data is not None and not f.is_done]
    for p in payloads:
        err = p.get("error") if isinstance(p, dict) else None
        assert not (isinstance(err, dict) and err.get("type") in SERVER_ERROR_TYPES), p
    last = [f for f in frames if not f.is_comment][-1]
    if kind == "chunks":
        assert last.is_done, last
    elif kind == "responses":
        assert last.event in ("response.completed", "response.incomplete"), last
    else:
        assert last.event == "message_stop", last


def check(server: Live, path: str, body: bytes, *, kind: str = "json", anthropic: bool = False, method: str = "POST") -> None:
    before = len(server.errors)
    status, ctype, raw = server.request(method, path, body)
    where = f"{method} {path} with the body {(body or b'')[:3000]!r}"
    event(f"{status} {ctype.split(';')[0]}")
    assert status < 500, f"{status} {raw[:500]!r} for {where}"
    assert server.errors[before:] == [], f"logged {server.errors[before:]} for {where}"
    assert b"Traceback" not in raw and b'File "' not in raw, where
    if status >= 400:
        assert ctype.startswith("application/json"), (ctype, where)
        assert_error(status, raw, anthropic)
    elif ctype.startswith("text/event-stream"):
        assert kind != "json", where
        assert_stream(raw, kind)
    else:
        assert ctype.startswith("application/json"), (ctype, where)
        data: Any = json.loads(raw)
        err = data.get("error") if isinstance(data, dict) else None  # an error after an early 200, or a failed Response
        assert err is None or err.get("type") not in SERVER_ERROR_TYPES, (data, where)


@budget(40)
@given(request_bodies("ChatCompletionRequest"))
def test_chat(live, body):
    check(live, "/v1/chat/completions", body, kind="chunks")


@budget(25)
@given(request_bodies("CompletionRequest"))
def test_completions(live, body):
    check(live, "/v1/completions", body, kind="chunks")


@budget(40)
@given(request_bodies("ResponsesRequest"))
def test_responses(live, body):
    check(live, "/v1/responses", body, kind="responses")


@budget(40)
@given(request_bodies("MessagesRequest"))
def test_messages(live, body):
    check(live, "/v1/messages", body, kind="anthropic", anthropic=True)


@budget(15)
@given(request_bodies("CountTokensRequest"))
def test_count_tokens(live, body):
    check(live, "/v1/messages/count_tokens", body, anthropic=True)


@budget(20)
@given(request_bodies("EmbeddingRequest"))
def test_embeddings(pooling, body):
    check(pooling, "/v1/embeddings", body)


@budget(15)
@given(st.sampled_from(["/tokenize", "/v1/tokenize"]), request_bodies("TokenizeRequest"))
def test_tokenize(live, path, body):
    check(live, path, body)


@budget(10)
@given(request_bodies("DetokenizeRequest"))
def test_detokenize(live, body):
    check(live, "/detokenize", body)


@budget(15)
@given(st.sampled_from(WORDS) | st.text(min_size=1, max_size=20))
def test_model_ids(live, model_id):
    check(live, "/v1/models/" + quote(model_id, safe=""), None, method="GET")
