"""`curl -N` over the raw wire: the exact bytes of a stream.

On the fake engine everything is deterministic except `created` (a clock)
and the `system_fingerprint` (the server's version): both are checked for
shape and equality across chunks, then normalised, and the rest of the body
must equal the expected bytes exactly. Sending `X-Request-Id` fixes the ids.
On the real engine the text is the model's, so the framing is checked.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest

from tests.compat.capture import Exchange
from tests.compat.conftest import missing_runtime
from tests.compat.wirecheck import assert_wire_ok
from tests.support import sse

CLIENT = "curl"
FP = b"streamproxy-VERSION"


@pytest.fixture(scope="session")
def curl() -> str:
    path = shutil.which("curl")
    if path is None:
        missing_runtime("curl is not installed", "apt-get install curl")
    return path


def run_curl(curl: str, url: str, body: dict, request_id: str | None = None) -> tuple[dict[str, str], bytes]:
    cmd = [curl, "-sSN", "--http1.1", "-D", "-", "-H", "Content-Type: application/json", "--data-binary", json.dumps(body), url]
    if request_id:
        cmd[1:1] = ["-H", f"X-Request-Id: {request_id}"]
    out = subprocess.run(cmd, capture_output=True, timeout=120, check=True).stdout
    head, _, payload = out.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    headers[":status"] = lines[0].split()[1]
    # curl un-chunks the body but writes it as it arrives: payload is the SSE byte stream itself.
    return headers, payload


def normalise(payload: bytes) -> bytes:
    created = set(re.findall(rb'"created":(\d+)', payload))
    assert len(created) == 1, f"{CLIENT}: created differs between chunks: {created}"
    fingerprints = set(re.findall(rb'"system_fingerprint":"([^"]*)"', payload))
    assert len(fingerprints) == 1 and all(fingerprints), f"{CLIENT}: system_fingerprint values {fingerprints}"
    payload = re.sub(rb'"created":\d+', b'"created":CREATED', payload)
    return re.sub(rb'"system_fingerprint":"[^"]*"', b'"system_fingerprint":"' + FP + b'"', payload)


def chat_chunk(rest: bytes) -> bytes:
    return (
        b'data: {"id":"chatcmpl-compat-curl-1","object":"chat.completion.chunk","created":CREATED,"model":"fake",'
        b'"system_fingerprint":"' + FP + b'","choices":' + rest + b"}\n\n"
    )


EXPECTED_CHAT_STREAM = (
    chat_chunk(b'[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]')
    + chat_chunk(b'[{"index":0,"delta":{"content":"Hello!"},"logprobs":null,"finish_reason":null}]')
    + chat_chunk(b'[{"index":0,"delta":{"content":" This"},"logprobs":null,"finish_reason":null}]')
    + chat_chunk(b'[{"index":0,"delta":{"content":" is"},"logprobs":null,"finish_reason":null}]')
    + chat_chunk(b'[{"index":0,"delta":{"content":" a"},"logprobs":null,"finish_reason":null}]')
    + chat_chunk(b'[{"index":0,"delta":{},"logprobs":null,"finish_reason":"length"}]')
    + chat_chunk(b'[],"usage":{"prompt_tokens":31,"completion_tokens":4,"total_tokens":35,"prompt_tokens_details":{"cached_tokens":0}}')
    + b"data: [DONE]\n\n"
)


def completion_chunk(rest: bytes) -> bytes:
    return (
        b'data: {"id":"cmpl-compat-curl-2","object":"text_completion","created":CREATED,"model":"fake",'
        b'"system_fingerprint":"' + FP + b'","choices":[{"index":0,' + rest + b"}]}\n\n"
    )


EXPECTED_COMPLETION_STREAM = (
    completion_chunk(b'"text":"Hello!","logprobs":null,"finish_reason":null')
    + completion_chunk(b'"text":" This","logprobs":null,"finish_reason":null')
    + completion_chunk(b'"text":" is","logprobs":null,"finish_reason":null')
    + completion_chunk(b'"text":"","logprobs":null,"finish_reason":"length"')
    + b"data: [DONE]\n\n"
)


def first_difference(got: bytes, want: bytes) -> str:
    n = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
    return f"first difference at byte {n}:\n got  ...{got[max(0, n - 80):n + 80]!r}\n want ...{want[max(0, n - 80):n + 80]!r}"


def as_exchange(url: str, body: dict, headers: dict, payload: bytes) -> Exchange:
    ex = Exchange("POST", url, json.dumps(body).encode())
    ex.status, ex.headers, ex.body, ex.complete = int(headers[":status"]), headers, payload, True
    return ex


def test_chat_stream_exact_bytes(curl, wire_server):
    url = wire_server + "/v1/chat/completions"
    body = {
        "model": "fake", "stream": True, "max_tokens": 4, "stream_options": {"include_usage": True},
        "messages": [{"role": "user", "content": "Say hello"}],
    }
    headers, payload = run_curl(curl, url, body, "compat-curl-1")
    assert headers[":status"] == "200", f"{CLIENT}: status {headers[':status']}: {payload[:300]!r}"
    assert headers["content-type"] == "text/event-stream", f"{CLIENT}: Content-Type = {headers['content-type']!r}"
    assert headers["cache-control"] == "no-cache" and headers["x-accel-buffering"] == "no", f"{CLIENT}: headers {headers}"
    assert headers["x-request-id"] == "compat-curl-1", f"{CLIENT}: X-Request-Id = {headers.get('x-request-id')!r}"
    got = normalise(payload)
    assert got == EXPECTED_CHAT_STREAM, f"{CLIENT} chat stream bytes: {first_difference(got, EXPECTED_CHAT_STREAM)}"
    assert_wire_ok([as_exchange(url, body, headers, payload)], CLIENT)


def test_completion_stream_exact_bytes(curl, wire_server):
    url = wire_server + "/v1/completions"
    body = {"model": "fake", "stream": True, "max_tokens": 3, "prompt": "Say hello"}
    headers, payload = run_curl(curl, url, body, "compat-curl-2")
    assert headers[":status"] == "200" and headers["content-type"] == "text/event-stream", f"{CLIENT}: {headers}"
    got = normalise(payload)
    assert got == EXPECTED_COMPLETION_STREAM, f"{CLIENT} completions stream bytes: {first_difference(got, EXPECTED_COMPLETION_STREAM)}"
    assert_wire_ok([as_exchange(url, body, headers, payload)], CLIENT)


def test_chat_stream_framing(curl, target):
    """Any engine: well-formed SSE, one JSON object per event, [DONE] last, schemas hold."""
    url = target.v1 + "/chat/completions"
    body = {
        "model": target.model, "stream": True, "max_tokens": 8, "temperature": 0, "stream_options": {"include_usage": True},
        "messages": [{"role": "user", "content": "Say hello in five words."}],
    }
    headers, payload = run_curl(curl, url, body, "compat-curl-framing")
    assert headers[":status"] == "200", f"{CLIENT}: status {headers[':status']}: {payload[:300]!r}"
    assert payload.endswith(b"\n\n"), f"{CLIENT}: stream ends with {payload[-60:]!r}"
    events = sse.frames(payload)
    assert events[-1] == b"data: [DONE]", f"{CLIENT}: stream ends with {payload[-60:]!r}"
    events = [e for e in events[:-1] if not e.startswith(b":")]  # keepalive comments may come in between
    for event in events:
        assert event.startswith(b"data: {") and b"\n" not in event, f"{CLIENT}: event {event[:120]!r} is not one 'data: {{json}}' line"
    assert all(b'"id":"chatcmpl-compat-curl-framing"' in e for e in events), f"{CLIENT}: id not derived from X-Request-Id"
    assert_wire_ok([as_exchange(url, body, headers, payload)], CLIENT)
