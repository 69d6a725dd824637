"""The OpenAI Python SDK against streamproxy, on the fake engine and the real one.

Each test drives one SDK surface (create stream / non-stream, the `.stream()`
helper, async, completions, models, tools, `parse`), asserts what the SDK
hands back, then checks every byte the SDK read (wirecheck.py).
"""

from __future__ import annotations

import json
from typing import Any, Literal

import openai
import pytest
from pydantic import BaseModel

from tests.compat.conftest import END, JSON_ANSWER, PARALLEL_ARGS, TOOL_ARGS, WEATHER_SCHEMA, WEATHER_TOOL, Target
from tests.compat.wirecheck import assert_wire_ok, stream_chunks

CLIENT = "openai-python"
PROMPT: list[Any] = [{"role": "user", "content": "Say hello in five words."}]


def sync_client(target: Target, wire) -> openai.OpenAI:
    return openai.OpenAI(base_url=target.v1, api_key="unused", http_client=wire.client(), max_retries=0)


def async_client(target: Target, wire) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=target.v1, api_key="unused", http_client=wire.async_client(), max_retries=0)


def expected_text(target: Target, max_tokens: int) -> str | None:
    """The fake engine's words, one token each; None for a real model."""
    if target.real:
        return None
    words = ["Hello!", " This", " is", " a", " fake", " streamed", " answer."]
    return "".join((words * 3)[:max_tokens])


def test_chat_non_stream(target: Target, wire):
    client = sync_client(target, wire)
    r = client.chat.completions.create(model=target.model, messages=PROMPT, max_tokens=6, temperature=0)
    choice = r.choices[0]
    assert choice.message.role == "assistant", f"{CLIENT}: choices[0].message.role = {choice.message.role!r}"
    assert isinstance(choice.message.content, str) and choice.message.content, f"{CLIENT}: choices[0].message.content = {choice.message.content!r}"
    if not target.real:
        assert choice.message.content == expected_text(target, 6)
    assert choice.finish_reason in ("stop", "length"), f"{CLIENT}: choices[0].finish_reason = {choice.finish_reason!r}"
    assert r.usage is not None and r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    assert r.usage.completion_tokens <= 6
    assert r.system_fingerprint, f"{CLIENT}: system_fingerprint = {r.system_fingerprint!r}"
    assert r.object == "chat.completion" and r.model == target.model
    assert_wire_ok(wire.exchanges, CLIENT)


def test_chat_stream_with_usage(target: Target, wire):
    client = sync_client(target, wire)
    stream = client.chat.completions.create(
        model=target.model, messages=PROMPT, max_tokens=6, temperature=0,
        stream=True, stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text, f"{CLIENT}: no delta.content in {len(chunks)} chunks"
    if not target.real:
        assert text == expected_text(target, 6)
    assert chunks[0].choices[0].delta.role == "assistant", f"{CLIENT}: chunk 0 choices[0].delta.role = {chunks[0].choices[0].delta.role!r}"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None, f"{CLIENT}: last chunk choices/usage = {chunks[-1].choices!r}/{chunks[-1].usage!r}"
    assert chunks[-1].usage.completion_tokens <= 6
    finish = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finish[-1] in ("stop", "length") and not any(finish[:-1]), f"{CLIENT}: finish_reason per chunk = {finish}"
    assert all(c.system_fingerprint for c in chunks), f"{CLIENT}: system_fingerprint missing on a chunk"
    # The SDK yields exactly the JSON chunks on the wire: [DONE] ended the stream, was not parsed as a chunk.
    assert len(chunks) == len(stream_chunks(wire.exchanges[0].body))
    assert_wire_ok(wire.exchanges, CLIENT)


def natural_end(target: Target) -> dict:
    """Arguments that end the answer with finish_reason "stop": the `.stream()`
    helpers raise LengthFinishReasonError on "length". The fake engine stops
    on a stop string; the real model is given room to finish its sentence."""
    return {"max_tokens": 48} if target.real else {"max_tokens": 20, "stop": [" fake"]}


def test_chat_stream_helper(target: Target, wire):
    client = sync_client(target, wire)
    with client.chat.completions.stream(model=target.model, messages=PROMPT, temperature=0, **natural_end(target)) as stream:
        events = list(stream)
        final = stream.get_final_completion()
    deltas = "".join(e.delta for e in events if e.type == "content.delta")
    done = [e for e in events if e.type == "content.done"]
    assert len(done) == 1 and done[0].content == deltas, f"{CLIENT} .stream(): content.done = {done!r}, deltas {deltas!r}"
    assert final.choices[0].message.content == deltas, f"{CLIENT} .stream(): final choices[0].message.content"
    assert final.choices[0].finish_reason == "stop"
    if not target.real:
        assert deltas == expected_text(target, 4)
    assert_wire_ok(wire.exchanges, CLIENT)


async def test_async_chat_stream_and_non_stream(target: Target, wire):
    client = async_client(target, wire)
    r = await client.chat.completions.create(model=target.model, messages=PROMPT, max_tokens=4, temperature=0)
    assert isinstance(r.choices[0].message.content, str)
    stream = await client.chat.completions.create(
        model=target.model, messages=PROMPT, max_tokens=4, temperature=0, stream=True, stream_options={"include_usage": True}
    )
    text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    if target.real:
        assert text == r.choices[0].message.content, f"{CLIENT} async: stream text {text!r} != non-stream {r.choices[0].message.content!r} at temperature 0"
    else:
        assert text == r.choices[0].message.content == expected_text(target, 4)
    async with client.chat.completions.stream(model=target.model, messages=PROMPT, temperature=0, **natural_end(target)) as s:
        async for _ in s:
            pass
        final = await s.get_final_completion()
    assert final.choices[0].finish_reason == "stop"
    assert (final.choices[0].message.content or "").startswith(text), f"{CLIENT} async .stream(): {final.choices[0].message.content!r}"
    await client.close()
    assert_wire_ok(wire.exchanges, CLIENT, min_exchanges=3)


def test_completions(target: Target, wire):
    client = sync_client(target, wire)
    r = client.completions.create(model=target.model, prompt="The capital of France is", max_tokens=5, temperature=0)
    assert isinstance(r.choices[0].text, str) and r.choices[0].text, f"{CLIENT}: completions choices[0].text = {r.choices[0].text!r}"
    assert r.choices[0].finish_reason in ("stop", "length")
    assert r.usage is not None and r.usage.completion_tokens <= 5
    stream = client.completions.create(model=target.model, prompt="The capital of France is", max_tokens=5, temperature=0, stream=True)
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == r.choices[0].text
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")
    if not target.real:
        assert r.choices[0].text == expected_text(target, 5)
    assert_wire_ok(wire.exchanges, CLIENT, min_exchanges=2)


def test_models(target: Target, wire):
    client = sync_client(target, wire)
    models = client.models.list()
    ids = [m.id for m in models]
    assert target.model in ids, f"{CLIENT}: models.list() ids = {ids}"
    model = client.models.retrieve(target.model)
    assert model.id == target.model and model.object == "model" and model.owned_by
    assert_wire_ok(wire.exchanges, CLIENT, min_exchanges=2)


# -- tools and structured outputs (issue 3) ------------------------------

class GetWeather(BaseModel):
    """Current weather in a city"""

    city: str
    unit: Literal["celsius", "fahrenheit"]


class Weather(BaseModel):
    city: str
    temperature_c: int


def fake_target(base: str) -> Target:
    return Target("fake", base, "fake")


def test_tools_auto_non_stream_and_stream(fake_tool_server, wire):
    client = sync_client(fake_target(fake_tool_server), wire)
    kw: dict[str, Any] = dict(model="fake", messages=[{"role": "user", "content": "Weather in Paris?"}], tools=[WEATHER_TOOL], stop=[END], max_tokens=100)
    r = client.chat.completions.create(**kw)
    msg = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls", f"{CLIENT}: choices[0].finish_reason = {r.choices[0].finish_reason!r}"
    assert msg.tool_calls and len(msg.tool_calls) == 1, f"{CLIENT}: choices[0].message.tool_calls = {msg.tool_calls!r}"
    call = msg.tool_calls[0]
    assert call.type == "function" and call.id and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == TOOL_ARGS, f"{CLIENT}: tool_calls[0].function.arguments = {call.function.arguments!r}"
    assert msg.content in (None, ""), f"{CLIENT}: choices[0].message.content = {msg.content!r} next to tool_calls"

    stream = client.chat.completions.create(**kw, stream=True)
    chunks = [c for c in stream if c.choices]
    frags = [tc for c in chunks for tc in (c.choices[0].delta.tool_calls or [])]
    assert frags and all(tc.index == 0 for tc in frags), f"{CLIENT}: delta.tool_calls[].index = {[tc.index for tc in frags]}"
    assert frags[0].id and frags[0].function.name == "get_weather" and frags[0].function.arguments == "", (
        f"{CLIENT}: first delta.tool_calls fragment = {frags[0]!r}, expected id, name and arguments ''"
    )
    args = "".join(tc.function.arguments or "" for tc in frags)
    assert json.loads(args) == TOOL_ARGS, f"{CLIENT}: concatenated delta.tool_calls[0].function.arguments = {args!r}"
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert_wire_ok(wire.exchanges, CLIENT, min_exchanges=2)


def test_tools_stream_helper_parses_arguments(fake_tool_server, wire):
    client = sync_client(fake_target(fake_tool_server), wire)
    with client.chat.completions.stream(
        model="fake", messages=[{"role": "user", "content": "Weather in Paris?"}],
        tools=[openai.pydantic_function_tool(GetWeather, name="get_weather")], stop=[END], max_tokens=100,
    ) as stream:
        events = list(stream)
        final = stream.get_final_completion()
    done = [e for e in events if e.type == "tool_calls.function.arguments.done"]
    assert len(done) == 1 and done[0].name == "get_weather", f"{CLIENT} .stream(): tool_calls.function.arguments.done events = {done!r}"
    assert done[0].parsed_arguments == GetWeather.model_validate(TOOL_ARGS), f"{CLIENT} .stream(): parsed_arguments = {done[0].parsed_arguments!r}"
    calls = final.choices[0].message.tool_calls
    assert calls
    assert calls[0].function.parsed_arguments == GetWeather.model_validate(TOOL_ARGS)
    assert_wire_ok(wire.exchanges, CLIENT)


def test_parallel_tool_calls(fake_parallel_tool_server, wire):
    client = sync_client(fake_target(fake_parallel_tool_server), wire)
    kw: dict[str, Any] = dict(model="fake", messages=[{"role": "user", "content": "Weather in Paris and London?"}], tools=[WEATHER_TOOL], stop=[END], max_tokens=100)
    calls = client.chat.completions.create(**kw).choices[0].message.tool_calls
    assert [json.loads(c.function.arguments) for c in calls] == PARALLEL_ARGS, f"{CLIENT}: message.tool_calls = {calls}"
    assert len({c.id for c in calls}) == 2, f"{CLIENT}: tool_calls[].id not unique: {[c.id for c in calls]}"
    with client.chat.completions.stream(**kw) as stream:
        done = [e for e in stream if e.type == "tool_calls.function.arguments.done"]
        final = stream.get_final_completion()
    assert [(e.index, json.loads(e.arguments)) for e in done] == list(enumerate(PARALLEL_ARGS)), f"{CLIENT} .stream(): {done}"
    assert [json.loads(c.function.arguments) for c in final.choices[0].message.tool_calls or ()] == PARALLEL_ARGS
    assert_wire_ok(wire.exchanges, CLIENT, min_exchanges=2)


def test_logprobs_stream_and_non_stream(target: Target, wire):
    client = sync_client(target, wire)
    kw: dict[str, Any] = dict(model=target.model, messages=PROMPT, max_tokens=4, temperature=0, logprobs=True, top_logprobs=2)
    r = client.chat.completions.create(**kw)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens, f"{CLIENT}: choices[0].logprobs.content has {len(content)} entries for {r.usage.completion_tokens} tokens"
    assert all(len(e.top_logprobs) == 2 and e.bytes is not None for e in content), f"{CLIENT}: logprobs.content[].top_logprobs/bytes = {content}"
    chunks = list(client.chat.completions.create(**kw, stream=True))
    streamed = [e for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content or []]
    assert [e.token for e in streamed] == [e.token for e in content], f"{CLIENT}: streamed logprobs tokens {[e.token for e in streamed]}"
    assert "".join(e.token for e in streamed) == r.choices[0].message.content or target.real
    assert_wire_ok(wire.exchanges, CLIENT, min_exchanges=2)


def test_parse_response_format_pydantic_fake(fake_json_server, wire):
    client = sync_client(fake_target(fake_json_server), wire)
    r = client.chat.completions.parse(
        model="fake", messages=[{"role": "user", "content": "Weather in Paris as JSON"}], response_format=Weather, stop=[END], max_tokens=100,
    )
    assert r.choices[0].message.parsed == Weather.model_validate(JSON_ANSWER), f"{CLIENT} parse(): choices[0].message.parsed = {r.choices[0].message.parsed!r}"
    with client.chat.completions.stream(
        model="fake", messages=[{"role": "user", "content": "Weather in Paris as JSON"}], response_format=Weather, stop=[END], max_tokens=100,
    ) as stream:
        for _ in stream:
            pass
        final = stream.get_final_completion()
    assert final.choices[0].message.parsed == Weather.model_validate(JSON_ANSWER)
    request = json.loads(wire.exchanges[0].request_body)
    assert request["response_format"]["type"] == "json_schema"
    assert_wire_ok(wire.exchanges, CLIENT, min_exchanges=2)


@pytest.mark.engine
def test_named_tool_choicereal_engine(engine_target: Target, wire):
    client = sync_client(engine_target, wire)
    kw: dict[str, Any] = dict(
        model=engine_target.model, messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        tools=[WEATHER_TOOL], tool_choice={"type": "function", "function": {"name": "get_weather"}}, max_tokens=60, temperature=0,
    )
    r = client.chat.completions.create(**kw)
    call = r.choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather", f"{CLIENT}: tool_calls[0].function.name = {call.function.name!r}"
    args = json.loads(call.function.arguments)
    assert isinstance(args.get("city"), str), f"{CLIENT}: tool_calls[0].function.arguments = {call.function.arguments!r}"
    chunks = [c for c in client.chat.completions.create(**kw, stream=True) if c.choices]
    frags = [tc for c in chunks for tc in (c.choices[0].delta.tool_calls or [])]
    assert json.loads("".join(tc.function.arguments or "" for tc in frags)) == args, f"{CLIENT}: streamed arguments differ from non-stream"
    assert_wire_ok(wire.exchanges, CLIENT, min_exchanges=2)


@pytest.mark.engine
def test_parse_json_schemareal_engine(engine_target: Target, wire):
    client = sync_client(engine_target, wire)
    r = client.chat.completions.parse(
        model=engine_target.model, messages=[{"role": "user", "content": "Give the weather in Paris as JSON."}],
        response_format=Weather, max_tokens=60, temperature=0,
    )
    parsed = r.choices[0].message.parsed
    assert isinstance(parsed, Weather), f"{CLIENT} parse(): choices[0].message.parsed = {parsed!r} from content {r.choices[0].message.content!r}"
    import jsonschema

    jsonschema.validate(json.loads(r.choices[0].message.content or ""), WEATHER_SCHEMA)
    assert_wire_ok(wire.exchanges, CLIENT)
