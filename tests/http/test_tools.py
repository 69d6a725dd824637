"""Tool calling, structured outputs and logprobs end to end on the fake engine.

Real HTTP through the app, scripted model output. Every response and chunk
is validated against OpenAI's schemas; the OpenAI Python SDK reassembles
the same calls from the stream and from the non-stream answer.
"""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest

from engine_adapter.fake import FakeScript
from tests.http.http_support import assert_openai_error
from tests.support import sse, validate
from tests.support.chat import chat_chunks, reassemble
from tests.support.sdk import function_calls

USER: list[Any] = [{"role": "user", "content": "Weather in Paris and Rome?"}]
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    "required": ["city"],
    "additionalProperties": False,
}
TOOLS: list[Any] = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather for a city", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}},
]
PARIS, ROME = '{"city": "Paris"}', '{"city": "Rome", "days": 2}'

# Each parser's native syntax for the same two parallel calls.
NATIVE = {
    "hermes": f'<tool_call>\n{{"name": "get_weather", "arguments": {PARIS}}}\n</tool_call>\n'
    f'<tool_call>\n{{"name": "get_weather", "arguments": {ROME}}}\n</tool_call>',
    "llama3_json": f'<|python_tag|>{{"name": "get_weather", "parameters": {PARIS}}}; {{"name": "get_weather", "parameters": {ROME}}}',
    "mistral": f"[TOOL_CALLS]get_weather[ARGS]{PARIS}[TOOL_CALLS]get_weather[ARGS]{ROME}",
    "pythonic": '[get_weather(city="Paris"), get_weather(city="Rome", days=2)]',
}
EXPECTED = [("get_weather", PARIS), ("get_weather", ROME)]


def tokens(text: str, size: int = 3) -> list[str | bytes]:
    return [text[i : i + size] for i in range(0, len(text), size)]


def message_calls(message: dict) -> list[tuple[str, str]]:
    return [(c["function"]["name"], c["function"]["arguments"]) for c in message.get("tool_calls", [])]


async def post(client, body: dict):
    return await client.post("/v1/chat/completions", json=body)


# -- auto mode, each parser ------------------------------------------------------------------


@pytest.mark.parametrize("parser", sorted(NATIVE))
async def test_auto_nonstream(serve, parser):
    client, engine = await serve(FakeScript(tokens=tokens(NATIVE[parser])), enable_auto_tool_choice=True, tool_call_parser=parser)
    resp = await post(client, {"messages": USER, "tools": TOOLS})
    assert resp.status == 200
    data = await resp.json()
    validate("CreateChatCompletionResponse", data)
    choice = data["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] is None
    assert message_calls(choice["message"]) == EXPECTED
    ids = [c["id"] for c in choice["message"]["tool_calls"]]
    assert len(set(ids)) == 2 and all(i.startswith("call_") for i in ids)
    # Mistral's markers are special tokens: the engine is asked to keep them.
    assert engine.submitted[0][2].skip_special_tokens is (parser not in ("mistral", "hermes"))


@pytest.mark.parametrize("parser", sorted(NATIVE))
async def test_auto_stream(serve, parser):
    client, _ = await serve(FakeScript(tokens=tokens(NATIVE[parser])), enable_auto_tool_choice=True, tool_call_parser=parser)
    resp = await post(client, {"messages": USER, "tools": TOOLS, "tool_choice": "auto", "stream": True})
    assert resp.status == 200
    payloads = chat_chunks(await resp.read())
    content, calls, reason = reassemble(payloads)
    assert (content, reason) == (None, "tool_calls")
    assert [(name, args) for _, name, args in calls] == EXPECTED


@pytest.mark.parametrize("parser", sorted(NATIVE))
async def test_auto_plain_answer_stays_content(serve, parser):
    client, _ = await serve(FakeScript(tokens=["It is ", "sunny."]), enable_auto_tool_choice=True, tool_call_parser=parser)
    data = await (await post(client, {"messages": USER, "tools": TOOLS})).json()
    assert data["choices"][0]["message"] == {"role": "assistant", "content": "It is sunny.", "refusal": None}
    assert data["choices"][0]["finish_reason"] == "stop"


async def test_auto_text_before_a_call(serve):
    text = 'Let me look.\n<tool_call>{"name": "get_time", "arguments": {}}</tool_call>'
    client, _ = await serve(FakeScript(tokens=tokens(text, 2)), enable_auto_tool_choice=True, tool_call_parser="hermes")
    data = await (await post(client, {"messages": USER, "tools": TOOLS})).json()
    message = data["choices"][0]["message"]
    assert message["content"] == "Let me look."
    assert message_calls(message) == [("get_time", "{}")]
    payloads = chat_chunks(await (await post(client, {"messages": USER, "tools": TOOLS, "stream": True})).read())
    content, calls, reason = reassemble(payloads)
    assert (content, [(n, a) for _, n, a in calls], reason) == ("Let me look.", [("get_time", "{}")], "tool_calls")


async def test_auto_invalid_arguments_come_back_as_content(serve):
    text = '<tool_call>{"name": "get_weather", "arguments": {"town": "Paris"}}</tool_call>'
    client, _ = await serve(FakeScript(tokens=tokens(text)), enable_auto_tool_choice=True, tool_call_parser="hermes")
    data = await (await post(client, {"messages": USER, "tools": TOOLS})).json()
    assert data["choices"][0]["message"] == {"role": "assistant", "content": text, "refusal": None}
    assert data["choices"][0]["finish_reason"] == "stop"
    payloads = chat_chunks(await (await post(client, {"messages": USER, "tools": TOOLS, "stream": True})).read())
    assert reassemble(payloads) == (text, [], "stop")


@pytest.mark.parametrize("parameters", [{"$ref": "#/nope"}, {"$ref": "#"}], ids=["dangling-ref", "self-ref"])
async def test_auto_call_against_a_schema_that_cannot_be_followed_comes_back_as_content(serve, parameters):
    # Found by tests/fuzz: the check raised (Unresolvable, RecursionError) in the middle of the stream.
    text = f'<tool_call>{{"name": "get_weather", "arguments": {PARIS}}}</tool_call>'
    client, _ = await serve(FakeScript(tokens=tokens(text)), enable_auto_tool_choice=True, tool_call_parser="hermes")
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": parameters}}]
    data = await (await post(client, {"messages": USER, "tools": tools})).json()
    assert data["choices"][0]["message"] == {"role": "assistant", "content": text, "refusal": None}
    payloads = chat_chunks(await (await post(client, {"messages": USER, "tools": tools, "stream": True})).read())
    assert reassemble(payloads) == (text, [], "stop")


async def test_auto_without_flags_is_a_400_naming_them(serve):
    client, engine = await serve(FakeScript(tokens=["x"]))
    for body in ({"messages": USER, "tools": TOOLS}, {"messages": USER, "tools": TOOLS, "tool_choice": "auto"}):
        resp = await post(client, body)
        err = assert_openai_error(resp.status, resp.headers, await resp.read(), expect_status=400, param="tool_choice")
        assert "--enable-auto-tool-choice" in err["message"] and "--tool-call-parser" in err["message"]
    assert engine.submitted == []


async def test_tool_choice_none_gives_text_and_shows_tools_to_the_template(serve):
    client, engine = await serve(FakeScript(tokens=["<tool_call>", "{}"]))
    data = await (await post(client, {"messages": USER, "tools": TOOLS, "tool_choice": "none"})).json()
    assert data["choices"][0]["message"]["content"] == "<tool_call>{}"
    assert engine.rendered[-1][1] == TOOLS
    assert engine.submitted[0][2].structured is None


async def test_n2_keeps_each_choice_apart(serve):
    client, _ = await serve(FakeScript(tokens=tokens(NATIVE["hermes"])), enable_auto_tool_choice=True, tool_call_parser="hermes")
    data = await (await post(client, {"messages": USER, "tools": TOOLS, "n": 2})).json()
    first, second = (c["message"] for c in data["choices"])
    assert message_calls(first) == message_calls(second) == EXPECTED
    assert {c["id"] for c in first["tool_calls"]}.isdisjoint(c["id"] for c in second["tool_calls"])
    payloads = chat_chunks(await (await post(client, {"messages": USER, "tools": TOOLS, "n": 2, "stream": True})).read())
    for index in (0, 1):
        content, calls, reason = reassemble(payloads, index)
        assert (content, [(n, a) for _, n, a in calls], reason) == (None, EXPECTED, "tool_calls")


async def test_round_trip_reaches_the_template(serve):
    client, engine = await serve(FakeScript(tokens=["It is 21 C."]), enable_auto_tool_choice=True, tool_call_parser="hermes")
    messages = USER + [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": PARIS}},
                {"id": "call_2", "type": "function", "function": {"name": "get_weather", "arguments": ROME}},
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "21 C"},
        {"role": "tool", "tool_call_id": "call_2", "content": "25 C"},
    ]
    data = await (await post(client, {"messages": messages, "tools": TOOLS})).json()
    assert data["choices"][0]["message"]["content"] == "It is 21 C."
    rendered, tools = engine.rendered[-1]
    assert tools == TOOLS
    assert rendered[1]["tool_calls"] == messages[1]["tool_calls"]
    assert [(m["role"], m.get("tool_call_id"), m["content"]) for m in rendered[2:]] == [("tool", "call_1", "21 C"), ("tool", "call_2", "25 C")]


# -- constrained: required and named ------------------------------------------------------------


REQUIRED_OUTPUT = f'[{{"name": "get_weather", "parameters": {PARIS}}}, {{"name": "get_time", "parameters": {{}}}}]'


async def test_required_stream_and_nonstream_agree(serve):
    client, engine = await serve(FakeScript(tokens=tokens(REQUIRED_OUTPUT, 2)))
    body = {"messages": USER, "tools": TOOLS, "tool_choice": "required"}
    data = await (await post(client, body)).json()
    validate("CreateChatCompletionResponse", data)
    message = data["choices"][0]["message"]
    assert (message["content"], data["choices"][0]["finish_reason"]) == (None, "tool_calls")
    assert message_calls(message) == [("get_weather", PARIS), ("get_time", "{}")]
    assert engine.submitted[0][2].structured["json"]["type"] == "array"
    payloads = chat_chunks(await (await post(client, {**body, "stream": True})).read())
    assert payloads[0]["choices"][0]["delta"] == {"role": "assistant", "content": None}
    content, calls, reason = reassemble(payloads)
    assert (content, [(n, a) for _, n, a in calls], reason) == (None, [("get_weather", PARIS), ("get_time", "{}")], "tool_calls")


async def test_named_function(serve):
    client, engine = await serve(FakeScript(tokens=tokens(ROME, 2)))
    body = {"messages": USER, "tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}
    data = await (await post(client, body)).json()
    validate("CreateChatCompletionResponse", data)
    assert message_calls(data["choices"][0]["message"]) == [("get_weather", ROME)]
    assert data["choices"][0]["finish_reason"] == "stop"  # OpenAI's reason for a forced function
    assert engine.submitted[0][2].structured == {"json": WEATHER}
    payloads = chat_chunks(await (await post(client, {**body, "stream": True})).read())
    content, calls, reason = reassemble(payloads)
    assert (content, [(n, a) for _, n, a in calls], reason) == (None, [("get_weather", ROME)], "stop")


# -- structured outputs ---------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
async def test_response_format_json_schema_reaches_the_engine(serve, stream):
    client, engine = await serve(FakeScript(tokens=tokens(PARIS)))
    fmt = {"type": "json_schema", "json_schema": {"name": "weather", "schema": WEATHER, "strict": True}}
    resp = await post(client, {"messages": USER, "response_format": fmt, "stream": stream, "n": 2})
    assert resp.status == 200
    assert engine.submitted[0][2].structured == {"json": WEATHER}
    if stream:
        payloads = chat_chunks(await resp.read())
        texts = [reassemble(payloads, i)[0] for i in (0, 1)]
    else:
        texts = [c["message"]["content"] for c in (await resp.json())["choices"]]
    assert [json.loads(t or "") for t in texts] == [{"city": "Paris"}] * 2


async def test_completions_take_response_format_and_guided_fields(serve):
    client, engine = await serve(FakeScript(tokens=["yes"]))
    resp = await client.post("/v1/completions", json={"prompt": "ok?", "response_format": {"type": "json_object"}})
    assert resp.status == 200 and engine.submitted[-1][2].structured == {"json_object": True}
    resp = await client.post("/v1/completions", json={"prompt": "ok?", "guided_choice": ["yes", "no"]})
    assert resp.status == 200 and engine.submitted[-1][2].structured == {"choice": ["yes", "no"]}


async def test_broken_schema_is_a_400_that_says_why(serve):
    client, engine = await serve()
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "required": "city"}}}
    resp = await post(client, {"messages": USER, "response_format": fmt})
    err = assert_openai_error(resp.status, resp.headers, await resp.read(), expect_status=400, param="response_format.json_schema.schema")
    assert "invalid JSON Schema" in err["message"] and "'city' is not of type 'array'" in err["message"]
    assert engine.submitted == []


# -- logprobs ---------------------------------------------------------------------------------------


async def test_chat_logprobs_nonstream_and_stream(serve):
    client, _ = await serve(FakeScript(tokens=["Hel", b"\xe4\xbd", b"\xa0"], logprobs=[-0.5, -1.0, -2.0]))
    body = {"messages": USER, "logprobs": True, "top_logprobs": 2}
    data = await (await post(client, body)).json()
    validate("CreateChatCompletionResponse", data)
    entries = data["choices"][0]["logprobs"]["content"]
    assert data["choices"][0]["logprobs"]["refusal"] is None
    assert [(e["token"], e["bytes"], e["logprob"]) for e in entries] == [
        ("Hel", [72, 101, 108], -0.5),
        ("\\xe4\\xbd", [0xE4, 0xBD], -1.0),
        ("\\xa0", [0xA0], -2.0),
    ]
    assert [[t["token"] for t in e["top_logprobs"]] for e in entries] == [["Hel", " alt1"], ["\\xe4\\xbd", " alt1"], ["\\xa0", " alt1"]]
    assert data["choices"][0]["message"]["content"] == "Hel你"
    payloads = chat_chunks(await (await post(client, {**body, "stream": True})).read())
    streamed = [e for p in payloads for c in p["choices"] if c["logprobs"] for e in c["logprobs"]["content"]]
    assert streamed == entries
    first = [p for p in payloads if p["choices"] and p["choices"][0]["delta"].get("content") == "Hel"]
    assert [e["token"] for e in first[0]["choices"][0]["logprobs"]["content"]] == ["Hel"]


async def test_chat_top_logprobs_zero_gives_empty_lists(serve):
    client, _ = await serve(FakeScript(tokens=["a", "b"]))
    data = await (await post(client, {"messages": USER, "logprobs": True})).json()
    assert [e["top_logprobs"] for e in data["choices"][0]["logprobs"]["content"]] == [[], []]


async def test_completion_legacy_logprobs(serve):
    client, _ = await serve(FakeScript(tokens=["Hé", "llo"], logprobs=[-0.5, -1.5]))
    data = await (await client.post("/v1/completions", json={"prompt": "x", "logprobs": 1})).json()
    assert data["choices"][0]["logprobs"] == {
        "tokens": ["Hé", "llo"],
        "token_logprobs": [-0.5, -1.5],
        "top_logprobs": [{"Hé": -0.5}, {"llo": -1.5}],
        "text_offset": [0, 2],
    }
    body = await (await client.post("/v1/completions", json={"prompt": "x", "logprobs": 1, "stream": True})).read()
    payloads = sse.payloads(body)
    assert [p["choices"][0]["logprobs"] for p in payloads] == [
        {"tokens": ["Hé"], "token_logprobs": [-0.5], "top_logprobs": [{"Hé": -0.5}], "text_offset": [0]},
        {"tokens": ["llo"], "token_logprobs": [-1.5], "top_logprobs": [{"llo": -1.5}], "text_offset": [2]},
        None,
    ]


# -- the OpenAI SDK ----------------------------------------------------------------------------------


async def test_openai_sdk_reassembles_calls_stream_and_nonstream(serve):
    client, _ = await serve(FakeScript(tokens=tokens(NATIVE["hermes"], 4)), enable_auto_tool_choice=True, tool_call_parser="hermes")
    sdk = openai.AsyncOpenAI(base_url=str(client.make_url("/v1")), api_key="none", max_retries=0)
    try:
        done = await sdk.chat.completions.create(model="fake", messages=USER, tools=TOOLS, tool_choice="auto")
        calls = function_calls(done.choices[0].message)
        assert calls == EXPECTED and done.choices[0].finish_reason == "tool_calls"
        async with sdk.chat.completions.stream(model="fake", messages=USER, tools=TOOLS) as stream:
            async for _ in stream:
                pass
            final = await stream.get_final_completion()
        message = final.choices[0].message
        assert function_calls(message) == EXPECTED
        assert [(c.model_extra or {})["index"] for c in message.tool_calls or ()] == [0, 1]  # the stream's index, kept by the SDK as an extra
        assert final.choices[0].finish_reason == "tool_calls"
    finally:
        await sdk.close()


# -- --tool-call-parser auto -----------------------------------------------------------------


async def test_auto_parser_read_from_the_chat_template_parses_calls(serve):
    template = "... within <tool_call></tool_call> XML tags ..."  # what Qwen's and Hermes' templates say
    client, _ = await serve(FakeScript(tokens=tokens(NATIVE["hermes"])), chat_template=template,
                            enable_auto_tool_choice=True, tool_call_parser="auto")
    resp = await post(client, {"messages": USER, "tools": TOOLS})
    data = json.loads(await resp.read())
    assert resp.status == 200 and data["choices"][0]["finish_reason"] == "tool_calls"
    assert message_calls(data["choices"][0]["message"]) == EXPECTED


async def test_auto_parser_with_a_template_without_tool_syntax_refuses_auto_and_serves_required(serve):
    client, engine = await serve(FakeScript(tokens=tokens(f'[{{"name": "get_weather", "parameters": {PARIS}}}]')),
                                 chat_template="{{ messages }}", enable_auto_tool_choice=True, tool_call_parser="auto")
    resp = await post(client, {"messages": USER, "tools": TOOLS, "tool_choice": "auto"})
    err = assert_openai_error(resp.status, resp.headers, await resp.read(), expect_status=400, param="tool_choice")
    assert "--tool-call-parser auto found no tool-call syntax" in err["message"] and '"required"' in err["message"]
    assert engine.submitted == []
    resp = await post(client, {"messages": USER, "tools": TOOLS, "tool_choice": "required"})
    assert resp.status == 200
    assert message_calls(json.loads(await resp.read())["choices"][0]["message"]) == [("get_weather", PARIS)]
