"""POST /v1/messages and /v1/messages/count_tokens on the fake engine: raw HTTP and the Anthropic SDK.

Streams are checked event by event against the SDK's own models and for
their life cycle (`tests/support/api_events.py`); the SDK itself runs over the wire
(`messages.create`, stream and not, `messages.stream`, `count_tokens`) and
must hand back complete, correctly typed objects. Errors on these routes are
in Anthropic's shape, before the first byte and in the stream.
"""

from __future__ import annotations

import json
from typing import Any

import anthropic
import pytest
import requests
from anthropic.types import Message, MessageParam, TextBlock, ToolParam, ToolUseBlock
from anthropic.types.message_create_params import MessageCreateParamsBase

from engine_adapter.fake import FakeScript
from harness.server import fake_server
from tests.support.api_events import anthropic_order, anthropic_text, check_anthropic
from tests.support.fake import USER_HI_PROMPT_TOKENS
from tests.support.sdk import error_body, text_of
from tests.support.sse import named_events

HI: list[MessageParam] = [{"role": "user", "content": "hi"}]
WEATHER: ToolParam = {
    "name": "get_weather",
    "description": "Weather in a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
# For `requests` (its `json=` wants JSON types, not the SDK's TypedDicts).
ANTHROPIC_STREAM_BODY: dict[str, Any] = {"max_tokens": 4, "messages": HI, "stream": True}
CALL_TEXT = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'


def sdk(client, key: str = "x") -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=str(client.make_url("")), api_key=key, max_retries=0)


async def post(client, body: dict, path: str = "/v1/messages", **kw):
    r = await client.post(path, json=body, **kw)
    return r, await r.read()


def anthropic_error(status: int, headers, body: bytes, *, expect_status: int, kind: str) -> str:
    assert status == expect_status, (status, body)
    assert headers["Content-Type"].startswith("application/json")
    data = json.loads(body)
    assert data == {"type": "error", "error": {"type": kind, "message": data["error"]["message"]}}, data
    assert data["error"]["message"]
    return data["error"]["message"]


# -- plain text -------------------------------------------------------------------


async def test_non_stream_message(serve):
    client, _ = await serve()
    r, body = await post(client, {"model": "fake", "max_tokens": 50, "messages": HI})
    assert r.status == 200
    data = json.loads(body)
    Message.model_validate(data)
    assert data == {
        "id": "msg_" + r.headers["X-Request-Id"],
        "type": "message",
        "role": "assistant",
        "model": "fake",
        "content": [{"type": "text", "text": "Hello world"}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": USER_HI_PROMPT_TOKENS, "output_tokens": 3, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0},
    }


async def test_stream_events(serve):
    client, _ = await serve()
    r, body = await post(client, {"model": "fake", "max_tokens": 50, "messages": HI, "stream": True})
    assert r.status == 200 and r.headers["Content-Type"] == "text/event-stream"
    events = named_events(body)
    check_anthropic(events)
    anthropic_order(events)
    assert anthropic_text(events) == "Hello world"
    assert [e for e, _ in events] == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert events[0][1]["message"]["usage"]["input_tokens"] == USER_HI_PROMPT_TOKENS
    assert events[-2][1]["usage"]["output_tokens"] == 3


async def test_system_and_tool_history_reach_the_prompt(serve):
    client, engine = await serve()
    body = {
        "max_tokens": 20,
        "system": [{"type": "text", "text": "be brief"}],
        "messages": [
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "18C"}]},
        ],
    }
    r, _ = await post(client, body)
    assert r.status == 200
    assert engine.decode(engine.submitted[-1][1]) == "<|system|>be brief\n<|user|>weather?\n<|assistant|>\n<|tool|>18C\n<|assistant|>"


async def test_stop_sequence_is_named(serve):
    client, engine = await serve(FakeScript(tokens=["alpha", " beta", " END", " gamma"]))
    body = {"max_tokens": 50, "messages": HI, "stop_sequences": ["END"]}
    r, data = await post(client, body)
    message = json.loads(data)
    assert message["content"] == [{"type": "text", "text": "alpha beta "}]
    assert (message["stop_reason"], message["stop_sequence"]) == ("stop_sequence", "END")
    params = engine.submitted[-1][2]
    assert params.stop == ["END"] and params.include_stop_str_in_output
    r, data = await post(client, {**body, "stream": True})
    events = named_events(data)
    check_anthropic(events)
    assert anthropic_text(events) == "alpha beta "
    assert events[-2][1]["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "END"}


async def test_max_tokens_stop_reason(serve):
    client, _ = await serve(FakeScript(text="one two three four"))
    r, data = await post(client, {"max_tokens": 2, "messages": HI})
    message = json.loads(data)
    assert message["stop_reason"] == "max_tokens" and message["usage"]["output_tokens"] == 2


async def test_max_tokens_beyond_the_context_is_lowered_to_fit(serve):
    client, engine = await serve(FakeScript(text="word"), max_model_len=64)
    r, data = await post(client, {"max_tokens": 32000, "messages": HI})
    assert r.status == 200, data
    room = 64 - USER_HI_PROMPT_TOKENS
    assert engine.submitted[-1][2].max_tokens == room
    message = json.loads(data)
    assert message["stop_reason"] == "model_context_window_exceeded" and message["usage"]["output_tokens"] == room


# -- the Anthropic SDK ---------------------------------------------------------------


async def test_sdk_create(serve):
    client, _ = await serve()
    async with sdk(client) as api:
        message = await api.messages.create(model="fake", max_tokens=50, messages=HI)
    assert isinstance(message, Message) and isinstance(message.content[0], TextBlock)
    assert message.content[0].text == "Hello world" and message.stop_reason == "end_turn"
    assert message.usage.input_tokens == USER_HI_PROMPT_TOKENS and message.usage.output_tokens == 3


async def test_sdk_create_stream_and_stream_helper(serve):
    client, _ = await serve()
    async with sdk(client) as api:
        raw = await api.messages.create(model="fake", max_tokens=50, messages=HI, stream=True)
        kinds = [e.type async for e in raw]
        async with api.messages.stream(model="fake", max_tokens=50, messages=HI) as stream:
            text = "".join([t async for t in stream.text_stream])
            final = await stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert text == "Hello world"
    assert isinstance(final, Message) and text_of(final.content[0]) == "Hello world"
    assert final.stop_reason == "end_turn" and final.usage.output_tokens == 3 and final.usage.input_tokens == USER_HI_PROMPT_TOKENS


async def test_sdk_count_tokens_matches_the_billed_prompt(serve):
    client, _ = await serve()
    async with sdk(client) as api:
        counted = await api.messages.count_tokens(model="fake", system="be brief", messages=HI, tools=[WEATHER])
        message = await api.messages.create(
            model="fake", max_tokens=5, tool_choice={"type": "none"}, system="be brief", messages=HI, tools=[WEATHER]
        )
        plain = await api.messages.count_tokens(model="fake", system="be brief", messages=HI)
    assert counted.input_tokens == message.usage.input_tokens + (message.usage.cache_read_input_tokens or 0)
    assert plain.input_tokens == len("<|system|>be brief\n<|user|>hi\n<|assistant|>")
    assert counted.input_tokens > plain.input_tokens  # the tools are in the template's prompt too


async def test_sdk_tool_use_forced_and_streamed(serve):
    client, engine = await serve(FakeScript(tokens=['{"city"', ': "Paris"}']))
    body: MessageCreateParamsBase = {
        "model": "fake", "max_tokens": 50, "messages": HI, "tools": [WEATHER], "tool_choice": {"type": "tool", "name": "get_weather"}
    }
    async with sdk(client) as api:
        message = await api.messages.create(**body)
        async with api.messages.stream(**body) as stream:
            partial = "".join([e.partial_json async for e in stream if e.type == "input_json"])
            final = await stream.get_final_message()
    assert engine.submitted[-1][2].structured == {"json": WEATHER["input_schema"]}
    for m in (message, final):
        [block] = m.content
        assert isinstance(block, ToolUseBlock) and block.name == "get_weather" and block.input == {"city": "Paris"}
        assert block.id.startswith("toolu_") and m.stop_reason == "tool_use"
    assert json.loads(partial) == {"city": "Paris"}


async def test_auto_tool_use_with_the_servers_parser(serve):
    client, _ = await serve(FakeScript(tokens=["On it. ", *CALL_TEXT]), enable_auto_tool_choice=True, tool_call_parser="hermes")
    async with sdk(client) as api:
        async with api.messages.stream(model="fake", max_tokens=200, messages=HI, tools=[WEATHER]) as stream:
            final = await stream.get_final_message()
        message = await api.messages.create(model="fake", max_tokens=200, messages=HI, tools=[WEATHER])
    for m in (final, message):
        assert [b.type for b in m.content] == ["text", "tool_use"] and m.stop_reason == "tool_use"
        assert text_of(m.content[0]) == "On it." and isinstance(m.content[1], ToolUseBlock) and m.content[1].input == {"city": "Paris"}


# -- errors in Anthropic's shape -------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "where"),
    [
        ({"messages": HI}, "max_tokens"),
        ({"max_tokens": 0, "messages": HI}, "max_tokens"),
        ({"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, "messages[0].content[0].type"),
        ({"max_tokens": 5, "messages": HI, "temperature": 5}, "temperature"),
        ({"max_tokens": 5, "messages": HI, "tools": [WEATHER]}, "tool_choice"),
    ],
)
async def test_request_errors(serve, body, where):
    client, engine = await serve()
    r, data = await post(client, body)
    message = anthropic_error(r.status, r.headers, data, expect_status=400, kind="invalid_request_error")
    assert where in message
    assert not engine.submitted


async def test_bad_json_and_unknown_model(serve):
    client, _ = await serve()
    r = await client.post("/v1/messages", data=b"{nope", headers={"Content-Type": "application/json"})
    anthropic_error(r.status, r.headers, await r.read(), expect_status=400, kind="invalid_request_error")
    r, data = await post(client, {"model": "claude-nope", "max_tokens": 5, "messages": HI})
    anthropic_error(r.status, r.headers, data, expect_status=404, kind="not_found_error")
    r, data = await post(client, {"model": "claude-nope", "messages": HI}, path="/v1/messages/count_tokens")
    anthropic_error(r.status, r.headers, data, expect_status=404, kind="not_found_error")


async def test_engine_loading_is_overloaded(serve):
    client, _ = await serve(load_delay=5.0, wait_ready=False)
    r, data = await post(client, {"max_tokens": 5, "messages": HI})
    anthropic_error(r.status, r.headers, data, expect_status=503, kind="overloaded_error")
    assert r.headers["Retry-After"]


async def test_x_api_key(serve):
    client, _ = await serve(api_key=["secret"])
    r, data = await post(client, {"max_tokens": 5, "messages": HI}, headers={"x-api-key": "wrong"})
    anthropic_error(r.status, r.headers, data, expect_status=401, kind="authentication_error")
    async with sdk(client, key="wrong") as api:
        with pytest.raises(anthropic.AuthenticationError) as info:
            await api.messages.create(model="fake", max_tokens=5, messages=HI)
    assert error_body(info.value)["error"]["type"] == "authentication_error"
    async with sdk(client, key="secret") as api:
        message = await api.messages.create(model="fake", max_tokens=5, messages=HI)
    assert text_of(message.content[0]) == "Hello world"
    # Other routes keep the OpenAI shape.
    r = await client.post("/v1/chat/completions", json={"messages": HI}, headers={"x-api-key": "wrong"})
    assert "error" in await r.json() and r.status == 401


async def test_sdk_bad_request_carries_the_anthropic_body(serve):
    client, _ = await serve()
    async with sdk(client) as api:
        with pytest.raises(anthropic.BadRequestError) as info:
            await api.messages.create(model="fake", max_tokens=0, messages=HI)
    assert error_body(info.value)["type"] == "error" and error_body(info.value)["error"]["type"] == "invalid_request_error"


async def test_engine_failure_mid_stream_is_an_error_event(serve):
    client, _ = await serve(FakeScript(text="a b c d e f", fail_after=2))
    r, body = await post(client, {"max_tokens": 50, "messages": HI, "stream": True})
    events = named_events(body)
    check_anthropic(events)
    anthropic_order(events)
    assert events[-1] == ("error", {"type": "error", "error": {"type": "api_error", "message": events[-1][1]["error"]["message"]}})
    async with sdk(client) as api:
        with pytest.raises(anthropic.APIStatusError) as info:
            async with api.messages.stream(model="fake", max_tokens=50, messages=HI) as stream:
                await stream.get_final_message()
    assert error_body(info.value)["error"]["type"] == "api_error"


# -- the sync SDK against a served process ------------------------------------------------


def test_sync_sdk_against_the_cli_server():
    with fake_server("--fake-text", "Paris is the capital.", "--sse-heartbeat", "0.05", "--fake-ttft", "0.2") as base:
        api = anthropic.Anthropic(base_url=base, api_key="x", max_retries=0)
        message = api.messages.create(model="fake", max_tokens=4, messages=HI)
        assert isinstance(message, Message) and text_of(message.content[0]) == "Paris is the capital."
        assert message.stop_reason == "max_tokens" and message.usage.output_tokens == 4
        with api.messages.stream(model="fake", max_tokens=4, messages=HI) as stream:
            final = stream.get_final_message()
        assert text_of(final.content[0]) == text_of(message.content[0]) and final.stop_reason == "max_tokens"
        r = requests.post(base + "/v1/messages", json=ANTHROPIC_STREAM_BODY, timeout=10)
        assert b"event: ping\n" in r.content  # the slow first token was bridged with pings
        assert api.messages.count_tokens(model="fake", messages=HI).input_tokens == message.usage.input_tokens
