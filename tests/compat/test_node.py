"""Node clients against streamproxy: the `openai` npm package and the Vercel AI SDK.

The scripts in node/ (pinned by node/package-lock.json, installed by
`make test` with `npm ci`) run under `node` as subprocesses, print what the
SDK returned plus the raw exchanges (record.mjs tees the fetch bodies),
and the checks here name the client and the field.
"""

from __future__ import annotations

import json

from tests.compat.capture import Exchange
from tests.compat.conftest import END, PARALLEL_ARGS, TOOL_ARGS, WEATHER_TOOL, Target
from tests.compat.wirecheck import assert_wire_ok, stream_chunks

OPENAI_NODE = "openai-node"
AI_SDK = "ai-sdk"


def natural_end(target: Target) -> dict:
    """Arguments that end the answer with finish_reason "stop" (the helpers' happy path)."""
    return {"max_tokens": 48} if target.real else {"max_tokens": 20, "stop": [" fake"]}


def no_errors(client: str, results: dict) -> None:
    errors = {k: f"{v['error']}\n{v.get('stack', '')}" for k, v in results.items() if isinstance(v, dict) and "error" in v}
    assert not errors, f"{client}: " + "\n".join(f"{k}: {v}" for k, v in errors.items())


def exchanges(out: dict) -> list[Exchange]:
    return [Exchange.load(e) for e in out["wire"]]


def test_openai_node_chat_stream_and_done(target: Target, node_runner):
    config = {"base": target.v1, "model": target.model, "max_tokens": 6, "cases": ["chat", "stream"]}
    out = node_runner("openai_sdk.mjs", config, OPENAI_NODE)
    results = out["results"]
    no_errors(OPENAI_NODE, results)
    chat = results["chat"]
    assert chat["role"] == "assistant" and isinstance(chat["content"], str) and chat["content"], f"{OPENAI_NODE}: choices[0].message = {chat}"
    assert chat["system_fingerprint"], f"{OPENAI_NODE}: system_fingerprint = {chat['system_fingerprint']!r}"
    assert chat["usage"]["total_tokens"] == chat["usage"]["prompt_tokens"] + chat["usage"]["completion_tokens"]

    chunks = results["stream"]["chunks"]
    wire = exchanges(out)
    # [DONE] ends the SDK's iteration: every JSON chunk on the wire came out as a chunk, nothing more.
    assert chunks == stream_chunks(wire[1].body), f"{OPENAI_NODE}: yielded chunks differ from the wire's JSON chunks (data: [DONE] handling)"
    assert wire[1].body.endswith(b"data: [DONE]\n\n"), f"{OPENAI_NODE}: stream ends with {wire[1].body[-40:]!r}"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == chat["usage"]["completion_tokens"], (
        f"{OPENAI_NODE}: last chunk = {chunks[-1]} (usage chunk with choices: [])"
    )
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == chat["content"], f"{OPENAI_NODE}: streamed {text!r} vs non-stream {chat['content']!r}"
    assert_wire_ok(wire, OPENAI_NODE, min_exchanges=2)


def test_openai_node_stream_helper(target: Target, node_runner):
    config = {"base": target.v1, "model": target.model, "cases": ["stream_helper"], **natural_end(target)}
    out = node_runner("openai_sdk.mjs", config, OPENAI_NODE)
    no_errors(OPENAI_NODE, out["results"])
    r = out["results"]["stream_helper"]
    assert "".join(r["deltas"]) == r["content"] and r["content"], f"{OPENAI_NODE} .stream(): {r}"
    assert r["finish_reason"] == "stop", f"{OPENAI_NODE} .stream(): finish_reason = {r['finish_reason']!r}"
    if not target.real:
        assert r["content"] == "Hello! This is a"
    assert_wire_ok(exchanges(out), OPENAI_NODE)


def test_openai_node_tools(fake_tool_server, node_runner):
    config = {
        "base": fake_tool_server + "/v1", "model": "fake", "max_tokens": 100, "stop": [END], "tools": [WEATHER_TOOL],
        "prompt": "Weather in Paris?", "cases": ["tools", "tools_stream", "tools_stream_helper"],
    }
    out = node_runner("openai_sdk.mjs", config, OPENAI_NODE)
    results = out["results"]
    no_errors(OPENAI_NODE, results)
    msg = results["tools"]["message"]
    assert results["tools"]["finish_reason"] == "tool_calls", f"{OPENAI_NODE}: finish_reason = {results['tools']['finish_reason']!r}"
    assert [json.loads(tc["function"]["arguments"]) for tc in msg["tool_calls"]] == [TOOL_ARGS], f"{OPENAI_NODE}: message.tool_calls = {msg['tool_calls']}"
    frags = [tc for c in results["tools_stream"]["chunks"] if c["choices"] for tc in c["choices"][0]["delta"].get("tool_calls") or []]
    assert [f["index"] for f in frags] == [0] * len(frags) and frags, f"{OPENAI_NODE}: delta.tool_calls[].index = {[f.get('index') for f in frags]}"
    assert frags[0]["function"]["arguments"] == "", f"{OPENAI_NODE}: first fragment function.arguments = {frags[0]['function'].get('arguments')!r}"
    helper = results["tools_stream_helper"]
    assert [json.loads(d["arguments"]) for d in helper["done"]] == [TOOL_ARGS], f"{OPENAI_NODE} .stream(): tool_calls.function.arguments.done = {helper['done']}"
    assert helper["finish_reason"] == "tool_calls"
    assert_wire_ok(exchanges(out), OPENAI_NODE, min_exchanges=3)


def test_ai_sdk_generate_and_stream_text(target: Target, node_runner):
    out = node_runner("ai_sdk.mjs", {"base": target.v1, "model": target.model, "max_tokens": 6}, AI_SDK)
    results = out["results"]
    no_errors(AI_SDK, results)
    gen, stream = results["generateText"], results["streamText"]
    assert isinstance(gen["text"], str) and gen["text"], f"{AI_SDK} generateText: text = {gen['text']!r}"
    assert gen["finishReason"] in ("stop", "length"), f"{AI_SDK} generateText: finishReason = {gen['finishReason']!r}"
    assert gen["usage"]["outputTokens"] and gen["usage"]["inputTokens"], f"{AI_SDK} generateText: usage = {gen['usage']}"
    assert not stream["errors"], f"{AI_SDK} streamText: errors {stream['errors']}"
    assert "".join(stream["deltas"]) == stream["text"] == gen["text"], f"{AI_SDK} streamText: deltas {stream['deltas']} vs generateText {gen['text']!r}"
    assert stream["finishReason"] == gen["finishReason"], f"{AI_SDK} streamText: finishReason = {stream['finishReason']!r}"
    assert stream["usage"]["outputTokens"] == gen["usage"]["outputTokens"], f"{AI_SDK} streamText: usage = {stream['usage']} (from the usage chunk)"
    if not target.real:
        assert gen["text"] == "Hello! This is a fake streamed"
    assert_wire_ok(exchanges(out), AI_SDK, min_exchanges=2)


def test_ai_sdk_tools(fake_tool_server, node_runner):
    config = {
        "base": fake_tool_server + "/v1", "model": "fake", "max_tokens": 100, "stop": [END],
        "prompt": "Weather in Paris?", "cases": ["generateText_tools", "streamText_tools"],
    }
    out = node_runner("ai_sdk.mjs", config, AI_SDK)
    results = out["results"]
    no_errors(AI_SDK, results)
    for name in ("generateText_tools", "streamText_tools"):
        r = results[name]
        assert not r.get("errors"), f"{AI_SDK} {name}: errors {r['errors']}"
        assert [(c["toolName"], c["input"]) for c in r["toolCalls"]] == [("get_weather", TOOL_ARGS)], f"{AI_SDK} {name}: toolCalls = {r['toolCalls']}"
        assert r["finishReason"] == "tool-calls", f"{AI_SDK} {name}: finishReason = {r['finishReason']!r}"
    assert_wire_ok(exchanges(out), AI_SDK, min_exchanges=2)


def test_node_parallel_tool_calls(fake_parallel_tool_server, node_runner):
    base = {"base": fake_parallel_tool_server + "/v1", "model": "fake", "max_tokens": 100, "stop": [END], "prompt": "Weather in Paris and London?"}
    out = node_runner("openai_sdk.mjs", {**base, "tools": [WEATHER_TOOL], "cases": ["tools_stream_helper"]}, OPENAI_NODE)
    no_errors(OPENAI_NODE, out["results"])
    msg = out["results"]["tools_stream_helper"]["message"]
    assert [json.loads(tc["function"]["arguments"]) for tc in msg["tool_calls"]] == PARALLEL_ARGS, f"{OPENAI_NODE} .stream(): tool_calls = {msg['tool_calls']}"
    assert_wire_ok(exchanges(out), OPENAI_NODE)
    out = node_runner("ai_sdk.mjs", {**base, "cases": ["streamText_tools"]}, AI_SDK)
    no_errors(AI_SDK, out["results"])
    r = out["results"]["streamText_tools"]
    assert [c["input"] for c in r["toolCalls"]] == PARALLEL_ARGS and not r["errors"], f"{AI_SDK} streamText: toolCalls = {r['toolCalls']} errors = {r['errors']}"
    assert_wire_ok(exchanges(out), AI_SDK)
