"""Errors as the clients see them: typed exceptions, never a silently short answer.

Before the first byte an error is an HTTP status with an OpenAI error body,
which each SDK turns into its own exception type carrying status, code and
param. After the first byte it is an in-band `data: {"error": ...}` event
followed by `[DONE]`, which the SDKs raise mid-iteration: a client must never
mistake a failed stream for a complete answer.
"""

from __future__ import annotations

from typing import Any

import openai
import pytest
from langchain_core.messages import HumanMessage
from langchain_openai import ChatOpenAI
from pydantic import SecretStr

from tests.compat.capture import Exchange
from tests.compat.wirecheck import assert_wire_ok

PROMPT: list[Any] = [{"role": "user", "content": "hi"}]


def client(base: str, wire) -> openai.OpenAI:
    return openai.OpenAI(base_url=base + "/v1", api_key="unused", http_client=wire.client(), max_retries=0)


def test_openai_python_http_errors(fake_server, wire):
    c = client(fake_server, wire)
    with pytest.raises(openai.NotFoundError) as info:
        c.chat.completions.create(model="no-such-model", messages=PROMPT, max_tokens=2)
    e = info.value
    assert (e.status_code, e.code, e.param) == (404, "model_not_found", "model"), f"openai-python: unknown model -> {e.status_code} code={e.code!r} param={e.param!r}"
    with pytest.raises(openai.BadRequestError) as bad:
        c.chat.completions.create(model="fake", messages=PROMPT, max_tokens=2, temperature=5)
    assert bad.value.param == "temperature", f"openai-python: temperature=5 -> param {bad.value.param!r}"
    with pytest.raises(openai.BadRequestError) as bad:
        c.chat.completions.create(model="fake", messages=PROMPT, max_tokens=2, stream=True, n=0)
    assert bad.value.param == "n", f"openai-python: n=0 (stream) -> param {bad.value.param!r}"
    assert_wire_ok(wire.exchanges, "openai-python", min_exchanges=3)


def test_openai_python_mid_stream_error_raises(fake_failing_server, wire):
    c = client(fake_failing_server, wire)
    seen = []
    with pytest.raises(openai.APIError) as info:
        for chunk in c.chat.completions.create(model="fake", messages=PROMPT, max_tokens=10, stream=True):
            seen.append(chunk)
    assert "failure" in str(info.value.message), f"openai-python: in-band error message {info.value.message!r}"
    assert len(seen) == 3, f"openai-python: {len(seen)} chunks before the error (role + 2 tokens expected)"
    assert_wire_ok(wire.exchanges, "openai-python", stream_error=True)


def test_langchain_errors(fake_server, fake_failing_server, wire):
    llm = ChatOpenAI(base_url=fake_server + "/v1", api_key=SecretStr("unused"), model="no-such-model", max_retries=0, http_client=wire.client())
    with pytest.raises(openai.NotFoundError):
        llm.invoke([HumanMessage("hi")])
    failing = ChatOpenAI(base_url=fake_failing_server + "/v1", api_key=SecretStr("unused"), model="fake", max_completion_tokens=10, max_retries=0, http_client=wire.client())
    with pytest.raises(openai.APIError):
        for _ in failing.stream([HumanMessage("hi")]):
            pass
    with pytest.raises(openai.InternalServerError):
        failing.invoke([HumanMessage("hi")])


def test_node_clients_errors(fake_server, fake_failing_server, node_runner):
    out = node_runner("openai_sdk.mjs", {"base": fake_server + "/v1", "model": "no-such-model", "max_tokens": 2, "cases": ["chat"]}, "openai-node")
    r = out["results"]["chat"]
    assert (r.get("status"), r.get("code"), r.get("param")) == (404, "model_not_found", "model"), f"openai-node: unknown model -> {r}"
    out = node_runner("openai_sdk.mjs", {"base": fake_failing_server + "/v1", "model": "fake", "max_tokens": 10, "cases": ["stream"]}, "openai-node")
    r = out["results"]["stream"]
    assert "error" in r and "failure" in r["error"], f"openai-node: a failed stream must throw while iterating, got {str(r)[:500]}"
    assert_wire_ok([Exchange.load(e) for e in out["wire"]], "openai-node", stream_error=True)

    out = node_runner("ai_sdk.mjs", {"base": fake_failing_server + "/v1", "model": "fake", "max_tokens": 10, "cases": ["streamText"]}, "ai-sdk")
    r = out["results"]["streamText"]
    assert any("failure" in e for e in r.get("errors", [])), f"ai-sdk streamText: a failed stream reported no error: {str(r)[:500]}"
    assert r.get("finishReason") == "error", f"ai-sdk streamText: failed stream finished with finishReason {r.get('finishReason')!r}"
