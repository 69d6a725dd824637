"""POST /v1/responses end to end on the fake engine: raw HTTP and the OpenAI SDK.

Streams are checked event by event against the SDK's own models and for
their life cycle (`tests/support/api_events.py`); the SDK itself is also run over the
wire (`responses.create`, stream and not, and `responses.stream`) and must
hand back complete, correctly typed objects.
"""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest
from openai.types.responses import Response, ResponseFunctionToolCall, ResponseOutputMessage

from engine_adapter.fake import FakeScript
from harness.server import fake_server
from tests.http.http_support import assert_openai_error
from tests.support.api_events import check_responses, responses_order, responses_text
from tests.support.fake import USER_HI_PROMPT_TOKENS
from tests.support.sse import named_events

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
CALL_TEXT = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'


def sdk(client) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=str(client.make_url("/v1")), api_key="x", max_retries=0)


async def post(client, body: dict):
    r = await client.post("/v1/responses", json=body)
    return r, await r.read()


# -- plain text ------------------------------------------------------------------


async def test_non_stream_body(serve):
    client, engine = await serve()
    r, body = await post(client, {"model": "fake", "input": "hi", "store": True, "metadata": {"k": "v"}, "temperature": 0.5})
    assert r.status == 200 and r.headers["Content-Type"].startswith("application/json")
    data = json.loads(body)
    Response.model_validate(data)
    assert data["id"] == "resp_" + r.headers["X-Request-Id"]
    assert data["object"] == "response" and data["status"] == "completed" and data["model"] == "fake"
    assert data["store"] is False and data["metadata"] == {"k": "v"} and data["temperature"] == 0.5
    [item] = data["output"]
    assert item["type"] == "message" and item["status"] == "completed" and item["role"] == "assistant"
    assert item["content"] == [{"type": "output_text", "text": "Hello world", "annotations": [], "logprobs": []}]
    assert data["usage"] == {
        "input_tokens": USER_HI_PROMPT_TOKENS,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": 3,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": USER_HI_PROMPT_TOKENS + 3,
    }
    assert engine.submitted[-1][2].temperature == 0.5


async def test_stream_events(serve):
    client, _ = await serve()
    r, body = await post(client, {"model": "fake", "input": "hi", "stream": True})
    assert r.status == 200 and r.headers["Content-Type"] == "text/event-stream"
    events = named_events(body)
    check_responses(events)
    responses_order(events)
    assert b"[DONE]" not in body
    assert responses_text(events) == "Hello world"
    assert [e for e, _ in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert events[-1][1]["response"]["usage"]["input_tokens"] == USER_HI_PROMPT_TOKENS


async def test_instructions_and_items_reach_the_prompt(serve):
    client, engine = await serve()
    body = {
        "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "weather?"}]},
            {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city":"Paris"}'},
            {"type": "function_call_output", "call_id": "c1", "output": "18C"},
        ],
        "instructions": "be brief",
    }
    r, _ = await post(client, body)
    assert r.status == 200
    prompt = engine.decode(engine.submitted[-1][1])
    assert prompt == "<|system|>be brief\n<|user|>weather?\n<|assistant|>\n<|tool|>18C\n<|assistant|>"


async def test_max_output_tokens_ends_incomplete(serve):
    client, _ = await serve(FakeScript(text="one two three four five"))
    r, body = await post(client, {"input": "hi", "max_output_tokens": 3})
    data = json.loads(body)
    assert data["status"] == "incomplete" and data["incomplete_details"] == {"reason": "max_output_tokens"}
    assert data["output"][0]["status"] == "incomplete" and data["usage"]["output_tokens"] == 3
    r, body = await post(client, {"input": "hi", "max_output_tokens": 3, "stream": True})
    events = named_events(body)
    check_responses(events)
    assert events[-1][0] == "response.incomplete"


async def test_text_format_json_schema_constrains_the_engine(serve):
    client, engine = await serve(FakeScript(tokens=['{"a":', " 1}"]))
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    r, body = await post(client, {"input": "hi", "text": {"format": {"type": "json_schema", "name": "out", "schema": schema, "strict": True}}})
    assert r.status == 200
    assert engine.submitted[-1][2].structured == {"json": schema}
    data = json.loads(body)
    assert data["text"]["format"] == {"type": "json_schema", "name": "out", "schema": schema, "strict": True}
    assert json.loads(data["output"][0]["content"][0]["text"]) == {"a": 1}


# -- the OpenAI SDK -----------------------------------------------------------------


async def test_sdk_create_non_stream(serve):
    client, _ = await serve()
    async with sdk(client) as api:
        resp = await api.responses.create(model="fake", input="hi")
    assert isinstance(resp, Response) and resp.status == "completed"
    assert resp.output_text == "Hello world"
    assert isinstance(resp.output[0], ResponseOutputMessage)
    assert resp.usage is not None and resp.usage.input_tokens == USER_HI_PROMPT_TOKENS and resp.usage.output_tokens == 3
    assert resp.usage.input_tokens_details.cached_tokens == 0


async def test_sdk_create_stream(serve):
    client, _ = await serve()
    async with sdk(client) as api:
        stream = await api.responses.create(model="fake", input="hi", stream=True)
        events = [e async for e in stream]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == "Hello world"
    assert events[-1].type == "response.completed" and events[-1].response.output_text == "Hello world"


async def test_sdk_stream_helper_final_response(serve):
    client, _ = await serve()
    async with sdk(client) as api:
        async with api.responses.stream(model="fake", input="hi") as stream:
            deltas = [e.delta async for e in stream if e.type == "response.output_text.delta"]
            final = await stream.get_final_response()
    assert "".join(deltas) == "Hello world" and final.output_text == "Hello world"


# -- tool calls ------------------------------------------------------------------


async def test_named_tool_choice_gives_a_function_call(serve):
    client, engine = await serve(FakeScript(tokens=['{"city"', ': "Paris"}']))
    body: dict[str, Any] = {"input": "weather?", "tools": [WEATHER], "tool_choice": {"type": "function", "name": "get_weather"}}
    async with sdk(client) as api:
        resp = await api.responses.create(model="fake", **body)
        stream = await api.responses.create(model="fake", stream=True, **body)
        events = [e async for e in stream]
    assert engine.submitted[-1][2].structured == {"json": WEATHER["parameters"]}
    [call] = resp.output
    assert isinstance(call, ResponseFunctionToolCall) and call.name == "get_weather" and json.loads(call.arguments) == {"city": "Paris"}
    assert call.call_id.startswith("call_") and call.status == "completed"
    assert resp.tool_choice.type == "function" and resp.tools[0].name == "get_weather"
    args = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert json.loads(args) == {"city": "Paris"}
    assert events[-1].response.output[0].type == "function_call"


async def test_auto_tool_choice_with_the_servers_parser(serve):
    client, _ = await serve(FakeScript(tokens=["Sure. ", *CALL_TEXT]), enable_auto_tool_choice=True, tool_call_parser="hermes")
    r, body = await post(client, {"input": "weather?", "tools": [WEATHER], "stream": True})
    events = named_events(body)
    check_responses(events)
    responses_order(events)
    final = events[-1][1]["response"]
    assert [o["type"] for o in final["output"]] == ["message", "function_call"]
    assert final["output"][0]["content"][0]["text"] == "Sure."
    assert json.loads(final["output"][1]["arguments"]) == {"city": "Paris"}
    r, body = await post(client, {"input": "weather?", "tools": [WEATHER]})
    assert [o["type"] for o in json.loads(body)["output"]] == ["message", "function_call"]


async def test_auto_tool_choice_without_a_parser_is_a_400(serve):
    client, _ = await serve()
    r, body = await post(client, {"input": "weather?", "tools": [WEATHER]})
    assert_openai_error(r.status, r.headers, body, expect_status=400, param="tool_choice")


# -- errors ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": "hi", "previous_response_id": "resp_123"}, "previous_response_id"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x"}]}]}, "input[0].content[0].type"),
        ({"input": "hi", "max_output_tokens": 0}, "max_output_tokens"),
        ({"input": "hi", "max_output_tokens": 100000}, "max_output_tokens"),
        ({"input": "hi", "tools": [{"type": "function", "name": "f", "parameters": {"type": 5}}], "tool_choice": "none"}, "tools[0].parameters"),
        ({"input": 5}, "input"),
        ({}, "input"),
    ],
)
async def test_request_errors_in_openai_shape(serve, body, param):
    client, engine = await serve()
    r, data = await post(client, body)
    assert_openai_error(r.status, r.headers, data, expect_status=400, param=param)
    assert not engine.submitted


async def test_sdk_sees_a_bad_request(serve):
    client, _ = await serve()
    async with sdk(client) as api:
        with pytest.raises(openai.BadRequestError) as info:
            await api.responses.create(model="fake", input="hi", previous_response_id="resp_1")
    assert "input" in info.value.message


async def test_unknown_model_is_404(serve):
    client, _ = await serve()
    r, data = await post(client, {"model": "nope", "input": "hi"})
    assert_openai_error(r.status, r.headers, data, expect_status=404, code="model_not_found")


async def test_engine_failure_mid_stream_is_error_then_failed(serve):
    client, engine = await serve(FakeScript(text="a b c d e f", fail_after=2))
    r, body = await post(client, {"input": "hi", "stream": True})
    events = named_events(body)
    check_responses(events)
    responses_order(events)
    assert [e for e, _ in events][-2:] == ["error", "response.failed"]
    assert events[-2][1]["code"] == "engine_error"
    assert events[-1][1]["response"]["status"] == "failed"


# -- the sync SDK against a served process ------------------------------------------------


def test_sync_sdk_against_the_cli_server():
    with fake_server("--fake-text", "Paris is the capital.") as base:
        api = openai.OpenAI(base_url=base + "/v1", api_key="x", max_retries=0)
        resp = api.responses.create(model="fake", input="capital of France?", max_output_tokens=4)
        assert isinstance(resp, Response) and resp.status == "incomplete"
        assert resp.output_text == "Paris is the capital." and resp.incomplete_details is not None and resp.incomplete_details.reason == "max_output_tokens"
        events = list(api.responses.create(model="fake", input="capital of France?", max_output_tokens=4, stream=True))
        assert [e.sequence_number for e in events] == list(range(len(events)))
        assert events[-1].type == "response.incomplete" and events[-1].response.output_text == resp.output_text
