"""Tool calling, structured outputs and logprobs on the real engine and default model.

The small default model cannot call tools on its own, so these tests use
what works with any model: constrained decoding (tool_choice required or a
named function, response_format json_schema). The output must parse and
validate against the schema, stream and non-stream, and the OpenAI SDK must
reassemble exactly what the server sent. Logprobs are checked for shape
(OpenAI's schema) and for real bytes. The last test drives one of vLLM's
own tool parsers through the adapter filter with the real tokenizer.
"""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import openai
import pydantic
import pytest
import requests

from tests.support import validate
from tests.support.chat import Call, chat_chunks, reassemble
from tests.support.sdk import function_calls

pytestmark = pytest.mark.engine

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 20}, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
    "required": ["city", "days"],
    "additionalProperties": False,
}
TIME = {"type": "object", "properties": {"tz": {"type": "string", "enum": ["UTC", "CET"]}}, "required": ["tz"], "additionalProperties": False}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather forecast for a city", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time", "description": "Current time", "parameters": TIME}},
]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
MESSAGES: list[Any] = [{"role": "user", "content": "What will the weather be in Paris for the next 3 days?"}]


def chat(base: str, body: dict) -> requests.Response:
    return requests.post(base + "/v1/chat/completions", json={"temperature": 0, "max_tokens": 120, **body}, timeout=300)


def named(calls: list[Call]) -> list[tuple[str, str]]:
    return [(c.name, c.arguments) for c in calls]


def assert_valid_calls(calls: list[tuple[str, str]]) -> None:
    assert calls
    for name, arguments in calls:
        assert isinstance(arguments, str)
        jsonschema.validate(json.loads(arguments), SCHEMAS[name])


@pytest.mark.parametrize(
    ("tool_choice", "reason"),
    [("required", "tool_calls"), ({"type": "function", "function": {"name": "get_weather"}}, "stop")],
    ids=["required", "named"],
)
def test_forced_tool_calls_validate_stream_and_nonstream(engine_server, model_name, tool_choice, reason):
    body = {"model": model_name, "messages": MESSAGES, "tools": TOOLS, "tool_choice": tool_choice}
    r = chat(engine_server, body)
    assert r.status_code == 200, r.text
    data = r.json()
    validate("CreateChatCompletionResponse", data)
    choice = data["choices"][0]
    assert choice["finish_reason"] == reason
    assert choice["message"]["content"] is None
    calls = [(c["function"]["name"], c["function"]["arguments"]) for c in choice["message"]["tool_calls"]]
    assert_valid_calls(calls)
    if isinstance(tool_choice, dict):
        assert [name for name, _ in calls] == ["get_weather"]
    r = chat(engine_server, {**body, "stream": True})
    assert r.status_code == 200
    payloads = chat_chunks(r.content)
    assert payloads[0]["choices"][0]["delta"] == {"role": "assistant", "content": None}
    content, streamed, streamed_reason = reassemble(payloads)
    assert (content, streamed_reason) == (None, reason)
    assert named(streamed) == calls  # greedy: the stream reassembles to exactly the non-stream answer
    argument_chunks = [p for p in payloads if p["choices"] and "tool_calls" in p["choices"][0]["delta"]]
    assert len(argument_chunks) > 3  # arguments arrive as the model writes them, not in one piece


def test_required_with_n2_keeps_choices_apart(engine_server, model_name):
    # Sampled answers differ between CPUs: one call per choice (parallel_tool_calls false) with a
    # bounded schema, and room to spare, so that every choice's call is complete whatever is sampled.
    body = {"model": model_name, "messages": MESSAGES, "tools": TOOLS, "tool_choice": "required", "parallel_tool_calls": False,
            "n": 2, "temperature": 1.0, "seed": 7, "max_tokens": 300}
    data = chat(engine_server, body).json()
    ids = []
    for choice in data["choices"]:
        calls = choice["message"]["tool_calls"]
        assert_valid_calls([(c["function"]["name"], c["function"]["arguments"]) for c in calls])
        ids += [c["id"] for c in calls]
    assert len(ids) == len(set(ids))
    payloads = chat_chunks(chat(engine_server, {**body, "stream": True}).content)
    for index in (0, 1):
        _, calls, reason = reassemble(payloads, index)
        assert_valid_calls(named(calls))
        assert reason == "tool_calls"


def test_json_schema_response_format_stream_and_nonstream(engine_server, model_name):
    fmt = {"type": "json_schema", "json_schema": {"name": "weather", "schema": WEATHER, "strict": True}}
    body = {"model": model_name, "messages": MESSAGES, "response_format": fmt}
    data = chat(engine_server, body).json()
    validate("CreateChatCompletionResponse", data)
    text = data["choices"][0]["message"]["content"]
    jsonschema.validate(json.loads(text), WEATHER)
    content, calls, reason = reassemble(chat_chunks(chat(engine_server, {**body, "stream": True}).content))
    assert (content, calls, reason) == (text, [], "stop")


def test_schema_the_engine_cannot_compile_is_a_400_that_says_why(engine_server, model_name):
    schema = {"type": "object", "properties": {"a": {"type": "string", "pattern": "(?<=x)a"}}}
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    r = chat(engine_server, {"model": model_name, "messages": MESSAGES, "response_format": fmt})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error"
    assert err["message"].startswith("the structured-output constraint cannot be compiled:")
    assert "look-around" in err["message"]


def test_chat_logprobs_shape_and_real_bytes(engine_server, model_name):
    messages = [{"role": "user", "content": "Write a long story about a cat in Paris."}]
    # min_tokens: no end-of-text before 12 tokens, whatever this CPU's greedy answer is.
    body = {"model": model_name, "messages": messages, "max_tokens": 12, "min_tokens": 12, "temperature": 0, "logprobs": True, "top_logprobs": 3}
    data = chat(engine_server, body).json()
    validate("CreateChatCompletionResponse", data)
    assert data["choices"][0]["finish_reason"] == "length"  # no end-of-text token among the entries
    entries = data["choices"][0]["logprobs"]["content"]
    assert len(entries) == data["usage"]["completion_tokens"] == 12
    assert all(len(e["top_logprobs"]) == 3 for e in entries)
    assert all(e["logprob"] <= 0 and e["top_logprobs"][0]["logprob"] >= e["top_logprobs"][-1]["logprob"] for e in entries)
    # Greedy: the chosen token is the most likely one, but for an end-of-text token that
    # min_tokens masked (logprobs are the model's raw ones): only special tokens rank above it.
    for e in entries:
        above = [t["token"] for t in e["top_logprobs"] if t["logprob"] > e["logprob"]]
        assert all(t.startswith("<") and t.endswith(">") for t in above), (e["token"], above)
    assert b"".join(bytes(e["bytes"]) for e in entries).decode() == data["choices"][0]["message"]["content"]
    payloads = chat_chunks(chat(engine_server, {**body, "stream": True}).content)
    streamed = [e for p in payloads for c in p["choices"] if c["logprobs"] for e in c["logprobs"]["content"]]
    assert [e["token"] for e in streamed] == [e["token"] for e in entries]  # chat_chunks validated each chunk


def test_completion_legacy_logprobs(engine_server, model_name):
    r = requests.post(
        engine_server + "/v1/completions",
        json={"model": model_name, "prompt": "The capital of France is", "max_tokens": 8, "temperature": 0, "logprobs": 2},
        timeout=300,
    )
    choice = r.json()["choices"][0]
    lp = choice["logprobs"]
    assert set(lp) == {"tokens", "token_logprobs", "top_logprobs", "text_offset"}
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(lp["text_offset"]) == 8
    assert "".join(lp["tokens"]) == choice["text"]
    assert lp["text_offset"] == [sum(len(t) for t in lp["tokens"][:i]) for i in range(8)]
    assert all(2 <= len(top) <= 3 and tok in top for tok, top in zip(lp["tokens"], lp["top_logprobs"]))


# -- the OpenAI SDK --------------------------------------------------------------------------------


class Weather(pydantic.BaseModel):
    city: str
    days: int


def test_openai_sdk_tools_and_parse(engine_server, model_name):
    sdk = openai.OpenAI(base_url=engine_server + "/v1", api_key="none", max_retries=0)
    kw = {"model": model_name, "messages": MESSAGES, "tools": TOOLS, "temperature": 0, "max_tokens": 120}
    done = sdk.chat.completions.create(tool_choice="required", **kw)
    calls = function_calls(done.choices[0].message)
    assert_valid_calls(calls)
    with sdk.chat.completions.stream(tool_choice="required", **kw) as stream:
        events = [e.type for e in stream]
        final = stream.get_final_completion()
    assert "tool_calls.function.arguments.delta" in events and "tool_calls.function.arguments.done" in events
    assert function_calls(final.choices[0].message) == calls
    assert [c.id for c in final.choices[0].message.tool_calls or ()] != [c.id for c in done.choices[0].message.tool_calls or ()]
    parsed = sdk.chat.completions.parse(model=model_name, messages=MESSAGES, response_format=Weather, temperature=0, max_tokens=120)
    assert isinstance(parsed.choices[0].message.parsed, Weather)


# -- vLLM's own parsers through the adapter filter ---------------------------------------------------


@pytest.mark.vllm_sources  # (no engine: vLLM's hermes parser on the default model's tokenizer)
def test_vllm_registry_parser_through_the_adapter(vllm_parsers):
    from vllm.tokenizers import get_tokenizer

    from engine_adapter.default_model import ensure_default_model
    from streamproxy.filters.base import CONTENT, TOOL_ARGS, TOOL_CALL, Pipeline
    from streamproxy.filters.chain import known_parser, parser_spec
    from streamproxy.filters.toolset import ToolSet

    tokenizer = get_tokenizer(str(ensure_default_model()))
    assert known_parser("vllm:hermes") and known_parser("xlam")
    assert not known_parser("no_such_parser")
    spec = parser_spec("vllm:hermes", tokenizer=tokenizer, tools=TOOLS)
    assert spec.keep_special_tokens  # vLLM's hermes asks for special tokens, as ours does
    tools = ToolSet(SCHEMAS)
    good = 'Sure. <tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n</tool_call>'
    bad = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'  # "days" missing
    for text, expected in [
        (good, ("Sure. ", [("get_weather", '{"city": "Paris", "days": 3}')], "tool_calls")),
        (bad, (bad, [], "stop")),
    ]:
        for size in (1, 4, len(text)):
            pipe = Pipeline([spec(tools)])
            parts = []
            for i in range(0, len(text), size):
                piece = text[i : i + size]
                parts += pipe.feed(piece, tokenizer.encode(piece, add_special_tokens=False))
            tail, reason = pipe.finish("stop")
            parts += tail
            content = "".join(p.text for p in parts if p.kind == CONTENT)
            calls: list[list[str]] = [[p.name or "", ""] for p in parts if p.kind == TOOL_CALL]
            for p in parts:
                if p.kind == TOOL_ARGS:
                    calls[p.index][1] += p.text
            assert (content, [tuple(c) for c in calls], reason) == expected, size
