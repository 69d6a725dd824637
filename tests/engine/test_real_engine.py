"""End to end against the real vLLM CPU engine and the default model."""

from __future__ import annotations

import json
import re
import socket

import openai
import pytest
import requests

from tests.support import sse, wait_until_sync

pytestmark = pytest.mark.engine

MESSAGES = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]

# Greedy answers differ between CPUs (kernels, ISA), so no test may depend on what the
# model says. Where a test needs known text, a regex constraint forces it: any model,
# on any machine, writes exactly FORCED_TEXT (with multi-byte characters split across tokens).
FORCED_TEXT = "Waves 🌊 roll in, gulls cry 🐦 over the sea; night falls."
STOP_WORD = "gulls"
FORCED = {"structured_outputs": {"regex": re.escape(FORCED_TEXT)}}


def running_requests(base: str) -> float:
    text = requests.get(base + "/metrics", timeout=10).text
    values = [float(m.group(1)) for m in re.finditer(r"^vllm:num_requests_running\{[^}]*\} (\S+)$", text, re.M)]
    assert values, "vllm:num_requests_running missing from /metrics"
    return sum(values)


def test_stream_chat_contract(engine_server, model_name):
    r = requests.post(
        engine_server + "/v1/chat/completions",
        json={"model": model_name, "messages": MESSAGES, "stream": True, "max_tokens": 30, "temperature": 0},
        headers={"X-Request-Id": "engine-stream-1"},
        timeout=120,
    )
    assert r.status_code == 200
    assert r.headers["Content-Type"] == "text/event-stream"
    assert r.headers["Cache-Control"] == "no-cache"
    assert r.headers["X-Accel-Buffering"] == "no"
    assert r.headers["X-Request-Id"] == "engine-stream-1"
    chunks = sse.payloads(r.content)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert {c["id"] for c in chunks} == {"chatcmpl-engine-stream-1"}
    assert len({c["created"] for c in chunks}) == 1 and {c["model"] for c in chunks} == {model_name}
    last = chunks[-1]["choices"][0]
    assert last["delta"] == {} and last["finish_reason"] in ("stop", "length")
    middle = chunks[1:-1]
    assert all(c["choices"][0]["finish_reason"] is None and "role" not in c["choices"][0]["delta"] for c in middle)
    # What the model says differs between CPUs: only the shape is asserted here.
    assert all(isinstance(c["choices"][0]["delta"]["content"], str) for c in middle)


def test_non_stream_usage_matches_stream_usage(engine_server, model_name):
    body = {"model": model_name, "messages": MESSAGES, "max_tokens": 12, "temperature": 0}
    full = requests.post(engine_server + "/v1/chat/completions", json=body, timeout=120).json()
    usage = full["usage"]
    assert usage["completion_tokens"] >= 1 and usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    r = requests.post(
        engine_server + "/v1/chat/completions",
        json={**body, "stream": True, "stream_options": {"include_usage": True}},
        timeout=120,
    )
    chunks = sse.payloads(r.content)
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["prompt_tokens"] == usage["prompt_tokens"]
    assert chunks[-1]["usage"]["completion_tokens"] == usage["completion_tokens"]
    streamed = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks[:-1])
    assert streamed == full["choices"][0]["message"]["content"]


def test_max_tokens_gives_length(engine_server, model_name):
    out = requests.post(
        engine_server + "/v1/chat/completions",
        json={"model": model_name, "messages": MESSAGES, "max_tokens": 5, "ignore_eos": True},
        timeout=120,
    ).json()
    assert out["choices"][0]["finish_reason"] == "length"
    assert out["usage"]["completion_tokens"] == 5


def test_stop_string(engine_server, model_name):
    """The answer is forced (a regex constraint), so the stop string is known to come after some text."""
    body = {"model": model_name, "messages": MESSAGES, "max_tokens": 60, "temperature": 0, "stop": [STOP_WORD], **FORCED}
    out = requests.post(engine_server + "/v1/chat/completions", json=body, timeout=120).json()
    choice = out["choices"][0]
    assert choice["finish_reason"] == "stop"
    assert choice["message"]["content"] == FORCED_TEXT[: FORCED_TEXT.index(STOP_WORD)]


def test_seed_is_reproducible_and_n2_keeps_choices_apart(engine_server, model_name):
    body = {"model": model_name, "messages": MESSAGES, "max_tokens": 20, "temperature": 1.0, "seed": 1234, "n": 2}
    a = requests.post(engine_server + "/v1/chat/completions", json=body, timeout=120).json()
    b = requests.post(engine_server + "/v1/chat/completions", json=body, timeout=120).json()
    assert [c["index"] for c in a["choices"]] == [0, 1]
    assert [c["message"]["content"] for c in a["choices"]] == [c["message"]["content"] for c in b["choices"]]
    r = requests.post(engine_server + "/v1/chat/completions", json={**body, "stream": True}, timeout=120)
    chunks = sse.payloads(r.content)
    roles = [c["choices"][0]["index"] for c in chunks if "role" in c["choices"][0]["delta"]]
    finishes = [c["choices"][0]["index"] for c in chunks if c["choices"][0]["finish_reason"]]
    assert sorted(roles) == [0, 1] and sorted(finishes) == [0, 1]
    per_index = {0: "", 1: ""}
    for c in chunks:
        ch = c["choices"][0]
        per_index[ch["index"]] += ch["delta"].get("content") or ""
    assert [per_index[0], per_index[1]] == [c["message"]["content"] for c in a["choices"]]


def test_completions_stream_and_non_stream(engine_server, model_name):
    body = {"model": model_name, "prompt": "The capital of France is", "max_tokens": 8, "temperature": 0}
    full = requests.post(engine_server + "/v1/completions", json=body, timeout=120).json()
    assert full["object"] == "text_completion" and full["usage"]["completion_tokens"] >= 1
    r = requests.post(engine_server + "/v1/completions", json={**body, "stream": True}, timeout=120)
    chunks = sse.payloads(r.content)
    assert "".join(c["choices"][0]["text"] for c in chunks) == full["choices"][0]["text"]
    assert chunks[-1]["choices"][0]["finish_reason"] == full["choices"][0]["finish_reason"]


def test_openai_sdk_stream(engine_server, model_name):
    client = openai.OpenAI(base_url=engine_server + "/v1", api_key="unused")
    stream = client.chat.completions.create(
        model=model_name, messages=MESSAGES, stream=True, max_tokens=20, temperature=0,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens >= 1
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    full = client.chat.completions.create(model=model_name, messages=MESSAGES, max_tokens=20, temperature=0)
    assert text == full.choices[0].message.content
    assert [m.id for m in client.models.list()] == [model_name]


def _raw_stream_then_close(base: str, body: dict, read_bytes: int) -> None:
    host, port = base.removeprefix("http://").split(":")
    payload = json.dumps(body).encode()
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload
        )
        got = b""
        while len(got) < read_bytes:
            data = sock.recv(65536)
            if not data:
                break
            got += data


def _busy(base: str) -> float:
    """What vLLM runs plus what the engine adapter holds (direct route included)."""
    return running_requests(base) + _metric(base, "streamproxy_engine_requests")


def _wait_idle(base: str, timeout: float = 20.0) -> float:
    """Until nothing runs; what still runs at the deadline."""
    wait_until_sync(lambda: _busy(base) == 0, timeout, interval=0.2)
    return _busy(base)


def test_disconnect_mid_stream_aborts(engine_server, model_name):
    body = {"model": model_name, "messages": MESSAGES, "stream": True, "max_tokens": 1500, "ignore_eos": True}
    _raw_stream_then_close(engine_server, body, read_bytes=1500)
    assert _wait_idle(engine_server) == 0


def test_disconnect_non_stream_aborts(engine_server, model_name):
    body = {"model": model_name, "messages": MESSAGES, "max_tokens": 1500, "ignore_eos": True}
    host, port = engine_server.removeprefix("http://").split(":")
    payload = json.dumps(body).encode()
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload
        )
        assert wait_until_sync(lambda: running_requests(engine_server) >= 1, 20, interval=0.1)
        assert _metric(engine_server, "streamproxy_engine_requests") >= 1
    assert _wait_idle(engine_server) == 0


def test_tokenize_counts_match_billed_usage(engine_server, model_name):
    tok = requests.post(engine_server + "/tokenize", json={"model": model_name, "messages": MESSAGES}, timeout=30).json()
    out = requests.post(
        engine_server + "/v1/chat/completions",
        json={"model": model_name, "messages": MESSAGES, "max_tokens": 3},
        timeout=120,
    ).json()
    assert tok["count"] == out["usage"]["prompt_tokens"] == len(tok["tokens"])
    assert tok["max_model_len"] == 2048
    prompt = "The capital of France is"
    tok = requests.post(engine_server + "/v1/tokenize", json={"prompt": prompt}, timeout=30).json()
    out = requests.post(engine_server + "/v1/completions", json={"prompt": prompt, "max_tokens": 2}, timeout=120).json()
    assert tok["count"] == out["usage"]["prompt_tokens"]
    back = requests.post(engine_server + "/detokenize", json={"tokens": tok["tokens"]}, timeout=30).json()
    assert back["prompt"] == prompt


def _metric(base: str, name: str) -> float:
    text = requests.get(base + "/metrics", timeout=10).text
    return sum(float(m.group(1)) for m in re.finditer(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.M))


def test_direct_route_text_equals_vllms_path(engine_server, model_name):
    """A plain request goes the direct route (engine_adapter/vllm_direct.py); one with
    logprobs goes through vLLM's OutputProcessor. Greedy, they must say the same, token
    for token, streamed and not, with the same usage and finish reason, whatever the model
    says. Then once more with a stop string, on a forced answer (FORCED), so that the stop
    string is known to stand after some text on every machine. Both routes feed vLLM's
    per-request histograms and token counters; streamproxy_direct_requests tells them apart."""
    finished, generated = "vllm:e2e_request_latency_seconds_count", "vllm:generation_tokens_total"
    direct_count = "streamproxy_direct_requests_total"
    messages = [{"role": "user", "content": "Write a short poem about the sea, with an emoji or two: 🌊"}]
    rounds = [(True, {}), (False, {}), (True, {"stop": [STOP_WORD], **FORCED}), (False, {"stop": [STOP_WORD], **FORCED})]
    for stream, shape in rounds:
        results = []
        for extra in ({}, {"logprobs": True}):
            body = {"model": model_name, "messages": messages, "max_tokens": 48, "temperature": 0, "stream": stream, **shape, **extra}
            if stream:
                body["stream_options"] = {"include_usage": True}
            before = _metric(engine_server, finished), _metric(engine_server, generated), _metric(engine_server, direct_count)
            r = requests.post(engine_server + "/v1/chat/completions", json=body, timeout=120)
            assert r.status_code == 200, r.text
            if stream:
                chunks = sse.payloads(r.content)
                text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
                finish = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
                results.append((text, finish, chunks[-1]["usage"]))
            else:
                data = r.json()
                results.append((data["choices"][0]["message"]["content"], [data["choices"][0]["finish_reason"]], data["usage"]))
            # vLLM's stat loggers record after the step's outputs are handed over: wait until
            # every token of the answer is counted (then its last step, finish included, is).
            tokens = results[-1][2]["completion_tokens"]
            assert wait_until_sync(lambda: _metric(engine_server, generated) - before[1] >= tokens, 30, interval=0.1)
            assert wait_until_sync(lambda: _metric(engine_server, finished) - before[0] >= 1, 30, interval=0.1)
            after = _metric(engine_server, finished), _metric(engine_server, generated), _metric(engine_server, direct_count)
            assert after[2] - before[2] == (0 if extra else 1), "the request took the wrong route"
            assert after[0] - before[0] == 1 and after[1] - before[1] > 0
        direct, vllm_path = results
        assert direct == vllm_path
        assert direct[2]["completion_tokens"] >= 1
        if "stop" in shape:
            assert direct[:2] == (FORCED_TEXT[: FORCED_TEXT.index(STOP_WORD)], ["stop"])
