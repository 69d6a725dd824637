"""LangChain's `ChatOpenAI(base_url=...)` against streamproxy.

LangChain is where "OpenAI-compatible" servers most often break in
practice: it sends `max_completion_tokens`, reads `usage` into
`usage_metadata` (stream: from the usage chunk with `choices: []`), and
fails with `'NoneType' object has no attribute ...` when a content or
delta it expects as a string comes back null.
"""

from __future__ import annotations

import json
from typing import Literal

import pytest
from langchain_core.messages import AIMessage, AIMessageChunk, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from pydantic import BaseModel, SecretStr

from tests.compat.conftest import END, JSON_ANSWER, PARALLEL_ARGS, TOOL_ARGS, Target
from tests.compat.wirecheck import assert_wire_ok

CLIENT = "langchain"
PROMPT = [HumanMessage("Say hello in five words.")]


def chat(target: Target, wire, **kw) -> ChatOpenAI:
    kw.setdefault("max_tokens", 6)
    return ChatOpenAI(
        base_url=target.v1, api_key=SecretStr("unused"), model=target.model, temperature=0, max_retries=0,
        stream_usage=True, http_client=wire.client(), http_async_client=wire.async_client(), **kw,
    )


def check_usage(msg: AIMessage, where: str) -> None:
    usage = msg.usage_metadata
    assert usage is not None, f"{CLIENT} {where}: usage_metadata is None (usage missing on the wire)"
    assert usage["input_tokens"] > 0 and 0 < usage["output_tokens"] <= 6, f"{CLIENT} {where}: usage_metadata = {usage}"
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"], f"{CLIENT} {where}: usage_metadata = {usage}"


def test_invoke(target: Target, wire):
    msg = chat(target, wire).invoke(PROMPT)
    assert isinstance(msg, AIMessage)
    assert isinstance(msg.content, str) and msg.content, f"{CLIENT} invoke: content = {msg.content!r}"
    if not target.real:
        assert msg.content == "Hello! This is a fake streamed"
    check_usage(msg, "invoke")
    meta = msg.response_metadata
    assert meta.get("finish_reason") in ("stop", "length"), f"{CLIENT} invoke: response_metadata.finish_reason = {meta.get('finish_reason')!r}"
    assert meta.get("model_name") == target.model, f"{CLIENT} invoke: response_metadata.model_name = {meta.get('model_name')!r}"
    assert meta.get("system_fingerprint"), f"{CLIENT} invoke: response_metadata.system_fingerprint = {meta.get('system_fingerprint')!r}"
    request = json.loads(wire.exchanges[0].request_body)
    assert request.get("max_completion_tokens") == 6, f"{CLIENT} sends max_completion_tokens: {request}"
    assert_wire_ok(wire.exchanges, CLIENT)


def test_stream(target: Target, wire):
    chunks = list(chat(target, wire).stream(PROMPT))
    assert all(isinstance(c, AIMessageChunk) and isinstance(c.content, str) for c in chunks), (
        f"{CLIENT} stream: a chunk's content is not a str: {[type(c.content).__name__ for c in chunks]}"
    )
    full = chunks[0]
    for c in chunks[1:]:
        full = full + c
    assert full.content, f"{CLIENT} stream: aggregated content = {full.content!r}"
    if not target.real:
        assert full.content == "Hello! This is a fake streamed"
    check_usage(full, "stream (aggregated)")
    assert full.response_metadata.get("finish_reason") in ("stop", "length"), f"{CLIENT} stream: response_metadata = {full.response_metadata}"
    request = json.loads(wire.exchanges[0].request_body)
    assert request.get("stream_options") == {"include_usage": True}, f"{CLIENT} stream: request stream_options = {request.get('stream_options')}"
    assert_wire_ok(wire.exchanges, CLIENT)


async def test_ainvoke_and_astream(target: Target, wire):
    llm = chat(target, wire)
    msg = await llm.ainvoke(PROMPT)
    parts = [c async for c in llm.astream(PROMPT)]
    text = "".join(c.text for c in parts)
    assert text == msg.content, f"{CLIENT} astream: {text!r} != ainvoke {msg.content!r} at temperature 0"
    assert_wire_ok(wire.exchanges, CLIENT, min_exchanges=2)


# -- tools and structured outputs (issue 3) ------------------------------

@tool
def get_weather(city: str, unit: Literal["celsius", "fahrenheit"] = "celsius") -> str:
    """Current weather in a city"""
    return f"21 degrees {unit} in {city}"


class Weather(BaseModel):
    """Weather report"""

    city: str
    temperature_c: int


def test_bind_tools_invoke_and_stream(fake_tool_server, wire):
    llm = chat(Target("fake", fake_tool_server, "fake"), wire, max_tokens=100, stop=[END]).bind_tools([get_weather])
    msg = llm.invoke([HumanMessage("Weather in Paris?")])
    assert msg.content == "", f"{CLIENT} bind_tools invoke: content = {msg.content!r} (null on the wire must become '')"
    assert len(msg.tool_calls) == 1, f"{CLIENT} bind_tools invoke: tool_calls = {msg.tool_calls} invalid_tool_calls = {msg.invalid_tool_calls}"
    call = msg.tool_calls[0]
    assert call["name"] == "get_weather", f"{CLIENT}: tool_calls[0].name = {call['name']!r}"
    assert call["args"] == TOOL_ARGS and call["id"], f"{CLIENT}: tool_calls[0] = {call}"
    assert msg.response_metadata.get("finish_reason") == "tool_calls"
    # Round trip: the assistant's tool call and the tool's answer go back in.
    again = llm.invoke([HumanMessage("Weather in Paris?"), msg, ToolMessage("21 degrees celsius", tool_call_id=call["id"])])
    assert isinstance(again, AIMessage), f"{CLIENT} round trip with a ToolMessage: {again!r}"
    sent = json.loads(wire.exchanges[-1].request_body)["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "tool"], f"{CLIENT} round trip sent {sent}"

    full: AIMessageChunk | None = None
    for chunk in llm.stream([HumanMessage("Weather in Paris?")]):
        assert isinstance(chunk, AIMessageChunk), chunk
        full = chunk if full is None else full + chunk
    assert full is not None
    assert [tc["args"] for tc in full.tool_calls] == [TOOL_ARGS], (
        f"{CLIENT} bind_tools stream: tool_calls = {full.tool_calls} tool_call_chunks = {full.tool_call_chunks}"
    )
    assert [tc["index"] for tc in full.tool_call_chunks] == [0], f"{CLIENT}: tool_call_chunks index = {full.tool_call_chunks}"
    assert_wire_ok(wire.exchanges, CLIENT, min_exchanges=2)


def test_bind_tools_parallel_stream_merges_by_index(fake_parallel_tool_server, wire):
    """LangChain merges streamed tool-call fragments by `index`: two calls must stay two."""
    llm = chat(Target("fake", fake_parallel_tool_server, "fake"), wire, max_tokens=100, stop=[END]).bind_tools([get_weather])
    full: AIMessageChunk | None = None
    for chunk in llm.stream([HumanMessage("Weather in Paris and London?")]):
        assert isinstance(chunk, AIMessageChunk), chunk
        full = chunk if full is None else full + chunk
    assert full is not None
    assert [tc["args"] for tc in full.tool_calls] == PARALLEL_ARGS, (
        f"{CLIENT} stream: tool_calls = {full.tool_calls}, invalid = {full.invalid_tool_calls}"
    )
    assert len({tc["id"] for tc in full.tool_calls}) == 2
    msg = llm.invoke([HumanMessage("Weather in Paris and London?")])
    assert [tc["args"] for tc in msg.tool_calls] == PARALLEL_ARGS, f"{CLIENT} invoke: tool_calls = {msg.tool_calls}"
    assert_wire_ok(wire.exchanges, CLIENT, min_exchanges=2)


def test_with_structured_output_json_schema_fake(fake_json_server, wire):
    llm = chat(Target("fake", fake_json_server, "fake"), wire, max_tokens=100, stop=[END])
    result = llm.with_structured_output(Weather).invoke([HumanMessage("Weather in Paris as JSON")])
    assert result == Weather.model_validate(JSON_ANSWER), f"{CLIENT} with_structured_output(json_schema): {result!r}"
    request = json.loads(wire.exchanges[0].request_body)
    assert request["response_format"]["type"] == "json_schema"
    assert_wire_ok(wire.exchanges, CLIENT)


@pytest.mark.engine
@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
def test_with_structured_outputreal_engine(engine_target: Target, wire, method):
    llm = chat(engine_target, wire, max_tokens=60)
    result = llm.with_structured_output(Weather, method=method, include_raw=True).invoke(
        [HumanMessage("Give the weather in Paris: city and temperature in Celsius.")]
    )
    assert result["parsing_error"] is None, f"{CLIENT} with_structured_output({method}): {result['parsing_error']!r}, raw {result['raw']!r}"
    assert isinstance(result["parsed"], Weather), f"{CLIENT} with_structured_output({method}): parsed = {result['parsed']!r}"
    assert_wire_ok(wire.exchanges, CLIENT)


def test_completion_model_batches_prompts_into_one_request(target: Target, wire):
    # LangChain's completion-model class (`OpenAI`) sends its prompts as one /v1/completions
    # request with a list of prompts, and reads the choices back n per prompt, in index order.
    from langchain_openai import OpenAI

    llm = OpenAI(
        # n=2 needs sampling: vLLM refuses n > 1 with greedy decoding.
        base_url=target.v1, api_key=SecretStr("unused"), model=target.model, temperature=0.8, max_tokens=6, n=2, max_retries=0,
        http_client=wire.client(), http_async_client=wire.async_client(),
    )
    result = llm.generate(["Say hello.", "Say goodbye.", "Count to three."])
    assert len(wire.exchanges) == 1, f"{CLIENT} completions: {len(wire.exchanges)} requests for one batch"
    request = json.loads(wire.exchanges[0].request_body)
    assert request["prompt"] == ["Say hello.", "Say goodbye.", "Count to three."] and request["n"] == 2
    assert [len(g) for g in result.generations] == [2, 2, 2], f"{CLIENT} completions: {result.generations}"
    for generations in result.generations:
        for g in generations:
            assert isinstance(g.text, str), f"{CLIENT} completions: {g}"  # a sampled answer may be empty (EOS first)
            if not target.real:
                assert g.text == "Hello! This is a fake streamed"
            assert (g.generation_info or {}).get("finish_reason") in ("stop", "length"), f"{CLIENT} completions: {g.generation_info}"
    usage = (result.llm_output or {}).get("token_usage", {})
    assert usage.get("completion_tokens", 0) > 0 and usage.get("prompt_tokens", 0) > 0, f"{CLIENT} completions: usage = {usage}"
    assert_wire_ok(wire.exchanges, CLIENT)
