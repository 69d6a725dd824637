"""Sampling parameters reach the engine as sent; `user` stays private; every chat role is accepted."""

from __future__ import annotations

from typing import Any

import pytest

from engine_adapter.base import GenerationParams
from tests.support import USER_HI, sse

SAMPLING = {
    "temperature": 0.7,
    "top_p": 0.9,
    "top_k": 40,
    "seed": 1234,
    "stop": ["END", "STOP"],
    "logit_bias": {"42": -5.5, "7": 100},
    "ignore_eos": True,
    "min_p": 0.05,
    "presence_penalty": 0.5,
    "frequency_penalty": -0.25,
    "repetition_penalty": 1.1,
    "min_tokens": 1,
    "stop_token_ids": [3, 4],
    "max_tokens": 5,
}


def assert_params(p: GenerationParams) -> None:
    assert isinstance(p, GenerationParams)
    assert p.temperature == 0.7
    assert p.top_p == 0.9
    assert p.top_k == 40
    assert p.seed == 1234
    assert p.stop == ["END", "STOP"]
    assert p.logit_bias == {42: -5.5, 7: 100.0}
    assert p.ignore_eos is True
    assert p.min_p == 0.05
    assert p.presence_penalty == 0.5
    assert p.frequency_penalty == -0.25
    assert p.repetition_penalty == 1.1
    assert p.min_tokens == 1
    assert p.stop_token_ids == [3, 4]
    assert p.max_tokens == 5
    assert p.n == 1


@pytest.mark.parametrize("stream", [False, True])
async def test_chat_sampling_params_reach_engine(serve, stream):
    client, engine = await serve()
    resp = await client.post("/v1/chat/completions", json={"messages": USER_HI, "stream": stream, **SAMPLING})
    assert resp.status == 200
    await resp.read()
    assert_params(engine.submitted[-1][2])


async def test_completions_sampling_params_reach_engine(serve):
    client, engine = await serve()
    resp = await client.post("/v1/completions", json={"prompt": "hi", **SAMPLING})
    assert resp.status == 200
    assert_params(engine.submitted[-1][2])


async def test_stop_string_and_defaults(serve):
    client, engine = await serve()
    resp = await client.post("/v1/chat/completions", json={"messages": USER_HI, "stop": "END"})
    assert resp.status == 200
    p = engine.submitted[-1][2]
    assert p.stop == ["END"]
    # Unset fields keep the engine's defaults.
    defaults = GenerationParams(max_tokens=1)
    for field in ("temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty",
                  "repetition_penalty", "seed", "logit_bias", "ignore_eos", "logprobs"):
        assert getattr(p, field) == getattr(defaults, field), field


async def test_top_k_minus_one_means_disabled(serve):
    client, engine = await serve()
    resp = await client.post("/v1/chat/completions", json={"messages": USER_HI, "top_k": -1})
    assert resp.status == 200
    assert engine.submitted[-1][2].top_k == 0


async def test_temperature_zero_is_kept(serve):
    client, engine = await serve()
    resp = await client.post("/v1/chat/completions", json={"messages": USER_HI, "temperature": 0})
    assert resp.status == 200
    assert engine.submitted[-1][2].temperature == 0.0


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
async def test_user_is_never_echoed(serve, path, stream):
    client, _ = await serve()
    body = {"messages": USER_HI} if "chat" in path else {"prompt": "hi"}
    resp = await client.post(path, json={**body, "user": "user-secret-7f3a", "stream": stream})
    assert resp.status == 200
    raw = await resp.read()
    assert b"user-secret-7f3a" not in raw
    docs = sse.payloads(raw) if stream else [await resp.json()]
    for doc in docs:
        assert "user" not in doc


async def test_unknown_fields_are_ignored(serve):
    # Clients send vendor extras (OpenAI SDK extra_body, metadata, store, ...): not an error.
    client, _ = await serve()
    body = {"messages": USER_HI, "metadata": {"k": "v"}, "store": False, "some_vendor_flag": [1, 2], "service_tier": "auto"}
    resp = await client.post("/v1/chat/completions", json=body)
    assert resp.status == 200
    assert (await resp.json())["choices"][0]["message"]["content"] == "Hello world"
    resp = await client.post("/v1/completions", json={"prompt": "hi", "unknown": {"x": 1}})
    assert resp.status == 200


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", {"messages": USER_HI, "n": None, "stream": None, "logprobs": None}),
        ("/v1/completions", {"prompt": "hi", "n": None, "stream": None, "echo": None}),
        ("/v1/responses", {"input": "hi", "stream": None}),
    ],
)
async def test_null_means_the_default(serve, path, body):
    # OpenAI types these as nullable (the SDKs send null for an explicit None): once a 400
    # "Expected `bool`, got `null`" (found by tests/http/test_openapi.py against the SDKs' types).
    client, engine = await serve()
    resp = await client.post(path, json=body)
    assert resp.status == 200, await resp.text()
    assert resp.headers["Content-Type"].startswith("application/json")
    assert engine.submitted[-1][2].n == 1
    assert engine.submitted[-1][2].logprobs is None


# -- roles ---------------------------------------------------------------------------

ROLE_CASES: dict[str, list[Any]] = {
    "system": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
    "developer": [{"role": "developer", "content": "be brief"}, {"role": "user", "content": "hi"}],
    "user": [{"role": "user", "content": "hi"}],
    "user-parts": [{"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "text", "text": "there"}]}],
    "assistant": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}, {"role": "user", "content": "again"}],
    "assistant-null-content": [
        {"role": "user", "content": "weather?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ],
    "tool": [{"role": "user", "content": "hi"}, {"role": "tool", "tool_call_id": "call_9", "content": "42"}],
    "function": [{"role": "user", "content": "hi"}, {"role": "function", "name": "get_weather", "content": "sunny"}],
}

# What the fake template renders for each role (developer is mapped to system).
RENDERED = {
    "system": "<|system|>be brief\n<|user|>hi\n",
    "developer": "<|system|>be brief\n<|user|>hi\n",
    "user": "<|user|>hi\n",
    "user-parts": "<|user|>hi\nthere\n",
    "assistant": "<|user|>hi\n<|assistant|>hello\n<|user|>again\n",
    "assistant-null-content": "<|user|>weather?\n<|assistant|>\n<|tool|>sunny\n",
    "tool": "<|user|>hi\n<|tool|>42\n",
    "function": "<|user|>hi\n<|function|>sunny\n",
}


@pytest.mark.parametrize("case", list(ROLE_CASES))
async def test_roles_accepted(serve, case):
    client, engine = await serve()
    resp = await client.post("/v1/chat/completions", json={"messages": ROLE_CASES[case]})
    assert resp.status == 200, await resp.text()
    data = await resp.json()
    assert data["choices"][0]["message"]["content"] == "Hello world"
    prompt = engine.decode(engine.submitted[-1][1])
    assert prompt == RENDERED[case] + "<|assistant|>"


async def test_all_roles_in_one_conversation(serve):
    client, engine = await serve()
    messages = [m for case in ROLE_CASES.values() for m in case]
    resp = await client.post("/v1/chat/completions", json={"messages": messages, "stream": True})
    assert resp.status == 200
    payloads = sse.payloads(await resp.read())
    assert payloads[-1]["choices"][0]["finish_reason"] == "stop"
    prompt = engine.decode(engine.submitted[-1][1])
    for role in ("system", "user", "assistant", "tool", "function"):
        assert f"<|{role}|>" in prompt
    assert "<|developer|>" not in prompt
