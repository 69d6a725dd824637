"""The known traps, one test each, named after the trap.

Each is where some "OpenAI-compatible" server broke a real client; each
failure names the client that would break and the exact field. The general
wire check (wirecheck.py) covers the same rules on every exchange of the
suite; these tests make each rule visible on its own, through the client
that depends on it.
"""

from __future__ import annotations

import json
from typing import Any

import openai
from langchain_core.messages import HumanMessage
from langchain_openai import ChatOpenAI
from pydantic import SecretStr

from tests.compat.capture import Exchange
from tests.compat.conftest import END, WEATHER_TOOL, Target
from tests.compat.wirecheck import assert_wire_ok, stream_chunks

PROMPT: list[Any] = [{"role": "user", "content": "Say hello in five words."}]


def oai(target: Target, wire) -> openai.OpenAI:
    return openai.OpenAI(base_url=target.v1, api_key="unused", http_client=wire.client(), max_retries=0)


def stream(target: Target, wire, **kw) -> tuple[list, list[dict]]:
    """(SDK chunk objects, the raw JSON chunks on the wire) of one chat stream."""
    kw = {"model": target.model, "messages": PROMPT, "max_tokens": 5, "temperature": 0, **kw}
    chunks = list(oai(target, wire).chat.completions.create(stream=True, **kw))
    return chunks, stream_chunks(wire.exchanges[-1].body)


def test_trap_content_empty_string_not_null(target: Target, wire):
    """LangChain: 'NoneType' object has no attribute ... when content is null."""
    _, raw = stream(target, wire)
    first = raw[0]["choices"][0]["delta"]
    assert first.get("content") == "", f"openai-python/langchain: chunk 0 choices[0].delta.content = {first.get('content')!r}, expected ''"
    for n, c in enumerate(raw):
        for ch in c["choices"]:
            if "content" in ch["delta"]:
                assert isinstance(ch["delta"]["content"], str), f"langchain: chunk {n} choices[{ch['index']}].delta.content = null"
    r = oai(target, wire).chat.completions.create(model=target.model, messages=PROMPT, max_tokens=5, temperature=0)
    body = json.loads(wire.exchanges[-1].body)
    assert isinstance(body["choices"][0]["message"]["content"], str), f"langchain: choices[0].message.content = {body['choices'][0]['message']['content']!r}"
    llm = ChatOpenAI(base_url=target.v1, api_key=SecretStr("unused"), model=target.model, max_completion_tokens=5, temperature=0, http_client=wire.client(), stream_usage=True)
    parts = list(llm.stream([HumanMessage("Say hello in five words.")]))
    assert all(isinstance(p.content, str) for p in parts), f"langchain: AIMessageChunk.content types {[type(p.content).__name__ for p in parts]}"
    assert "".join(p.text for p in parts) == r.choices[0].message.content
    assert_wire_ok(wire.exchanges, "openai-python+langchain", min_exchanges=3)


def test_trap_role_only_in_first_chunk(target: Target, wire):
    n = 1 if target.real else 2
    chunks, raw = stream(target, wire, n=n)
    for i in range(n):
        roles = [c.choices[0].delta.role for c in chunks if c.choices and c.choices[0].index == i]
        assert roles[0] == "assistant", f"openai-python: choice {i} first chunk delta.role = {roles[0]!r}"
        assert not any(roles[1:]), f"openai-python: choice {i} delta.role after the first chunk: {roles}"
    assert_wire_ok(wire.exchanges, "openai-python")


def test_trap_usage_chunk_has_empty_choices(target: Target, wire):
    chunks, raw = stream(target, wire, stream_options={"include_usage": True})
    assert raw[-1]["choices"] == [], f"openai-python: usage chunk choices = {raw[-1].get('choices')!r}, expected []"
    assert raw[-1]["usage"]["total_tokens"] > 0, f"openai-python: usage chunk usage = {raw[-1].get('usage')!r}"
    assert all(c.get("usage") is None for c in raw[:-1]), "openai-python: usage on a chunk before the usage chunk (no continuous_usage_stats asked)"
    chunks, raw = stream(target, wire)
    assert all(c["choices"] for c in raw) and all(c.get("usage") is None for c in raw), (
        "openai-python: a usage chunk / choices: [] without stream_options.include_usage"
    )
    assert_wire_ok(wire.exchanges, "openai-python", min_exchanges=2)


def test_trap_finish_reason_on_last_chunk_only(target: Target, wire):
    chunks, raw = stream(target, wire, stream_options={"include_usage": True})
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert reasons[-1] in ("stop", "length"), f"openai-python: last choice chunk finish_reason = {reasons[-1]!r}"
    assert all(r is None for r in reasons[:-1]), f"openai-python: finish_reason before the last chunk: {reasons}"
    assert_wire_ok(wire.exchanges, "openai-python")


def test_trap_system_fingerprint_present(target: Target, wire):
    chunks, raw = stream(target, wire)
    missing = [n for n, c in enumerate(raw) if "system_fingerprint" not in c]
    assert not missing, f"openai-python: system_fingerprint missing on chunks {missing}"
    r = oai(target, wire).chat.completions.create(model=target.model, messages=PROMPT, max_tokens=3, temperature=0)
    assert r.system_fingerprint, f"openai-python: system_fingerprint = {r.system_fingerprint!r}"
    assert_wire_ok(wire.exchanges, "openai-python", min_exchanges=2)


def test_trap_tool_calls_index_and_first_fragment_arguments(fake_parallel_tool_server, wire):
    target = Target("fake", fake_parallel_tool_server, "fake")
    chunks, raw = stream(target, wire, tools=[WEATHER_TOOL], stop=[END], max_tokens=100, messages=[{"role": "user", "content": "Weather?"}])
    frags = [tc for c in raw if c["choices"] for tc in c["choices"][0]["delta"].get("tool_calls") or []]
    assert frags, f"openai-python: no delta.tool_calls in {raw}"
    for f in frags:
        assert isinstance(f.get("index"), int), f"openai-python: delta.tool_calls[].index = {f.get('index')!r} in {f}"
    assert sorted({f["index"] for f in frags}) == [0, 1], f"openai-python: two parallel calls, delta.tool_calls[].index = {[f['index'] for f in frags]}"
    for k in (0, 1):
        first = next(f for f in frags if f["index"] == k)
        assert first["function"].get("arguments") == "", (
            f"openai-python: first delta.tool_calls[{k}].function.arguments = {first['function'].get('arguments')!r}, expected ''"
        )
        assert first.get("id") and first.get("type") == "function" and first["function"].get("name") == "get_weather", f"openai-python: first fragment {first}"
    sdk_frags = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or []]
    assert [tc.index for tc in sdk_frags] == [f["index"] for f in frags]
    assert_wire_ok(wire.exchanges, "openai-python")


def test_trap_done_parsing_in_node_sdk(fake_server, node_runner):
    """openai-node must end its iteration at `data: [DONE]`, not parse it or hang."""
    out = node_runner("openai_sdk.mjs", {"base": fake_server + "/v1", "model": "fake", "max_tokens": 3, "cases": ["stream"]}, "openai-node")
    r = out["results"]["stream"]
    assert "error" not in r, f"openai-node: stream iteration failed: {r.get('error')}\n{r.get('stack')}"
    ex = Exchange.load(out["wire"][0])
    assert ex.body.endswith(b"\n\ndata: [DONE]\n\n"), f"openai-node: wire ends with {ex.body[-40:]!r}"
    assert r["chunks"] == stream_chunks(ex.body), "openai-node: yielded chunks differ from the JSON events before [DONE]"
    assert_wire_ok([ex], "openai-node")
