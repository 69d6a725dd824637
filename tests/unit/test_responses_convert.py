"""Responses request -> chat request: items, tools, formats, refusals, and error names."""

from __future__ import annotations

import msgspec
import pytest

from streamproxy.apis.responses import convert as C
from streamproxy.apis.responses.protocol import decode_request
from streamproxy.core import params as P
from streamproxy.core.prepare import renamed
from streamproxy.errors import InvalidRequest
from streamproxy.protocol.openai_chat import NamedToolChoice


def chat(body: dict):
    return C.to_chat(decode_request(msgspec.json.encode(body)))


def flat(body: dict) -> list[dict]:
    return P.chat_messages(chat(body).messages)


def error(body: dict) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as info:
        chat(body)
    return info.value


def test_string_input_and_instructions():
    assert flat({"input": "hi", "instructions": "be brief"}) == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hi"},
    ]


def test_message_items_with_parts_and_roles():
    body = {
        "input": [
            {"role": "developer", "content": "rules"},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "ok", "annotations": []}]},
        ]
    }
    assert flat(body) == [
        {"role": "system", "content": "rules"},
        {"role": "user", "content": "a\nb"},
        {"role": "assistant", "content": "ok"},
    ]


def test_function_calls_join_their_assistant_message_and_outputs_become_tool_messages():
    body = {
        "input": [
            {"role": "user", "content": "weather in Paris and Oslo?"},
            {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "two calls"}]},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Checking."}]},
            {"type": "function_call", "call_id": "c1", "name": "get", "arguments": '{"city":"Paris"}'},
            {"type": "function_call", "call_id": "c2", "name": "get", "arguments": '{"city":"Oslo"}'},
            {"type": "function_call_output", "call_id": "c1", "output": "18C"},
            {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "9C"}]},
            {"type": "function_call", "call_id": "c3", "name": "get", "arguments": "{}"},
        ]
    }
    out = flat(body)
    assert out[1] == {
        "role": "assistant",
        "content": "Checking.",
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get", "arguments": '{"city":"Paris"}'}},
            {"id": "c2", "type": "function", "function": {"name": "get", "arguments": '{"city":"Oslo"}'}},
        ],
        "reasoning_content": "two calls",
    }
    assert out[2] == {"role": "tool", "content": "18C", "tool_call_id": "c1"}
    assert out[3] == {"role": "tool", "content": "9C", "tool_call_id": "c2"}
    # A call after tool outputs starts a new assistant message.
    assert out[4]["role"] == "assistant" and out[4]["content"] == "" and out[4]["tool_calls"][0]["id"] == "c3"


def test_settings_map_to_chat_fields():
    req = chat(
        {
            "input": "x",
            "max_output_tokens": 50,
            "temperature": 0.2,
            "top_p": 0.9,
            "stream": True,
            "store": True,
            "tools": [{"type": "function", "name": "f", "description": "d", "parameters": {"type": "object"}, "strict": True}],
            "tool_choice": {"type": "function", "name": "f"},
            "parallel_tool_calls": False,
            "text": {"format": {"type": "json_schema", "name": "out", "schema": {"type": "object"}, "strict": True}},
            "user": "u",
        }
    )
    assert (req.max_tokens, req.temperature, req.top_p, req.stream, req.user) == (50, 0.2, 0.9, True, "u")
    assert req.tools is not None and req.tools[0].function.name == "f" and req.tools[0].function.parameters == {"type": "object"}
    assert isinstance(req.tool_choice, NamedToolChoice) and req.tool_choice.function.name == "f"
    assert req.parallel_tool_calls is False
    assert req.response_format is not None and req.response_format.type == "json_schema"
    assert req.response_format.json_schema is not None and req.response_format.json_schema.schema == {"type": "object"}


def test_text_format_text_and_json_object():
    assert chat({"input": "x", "text": {"format": {"type": "text"}}}).response_format is None
    fmt = chat({"input": "x", "text": {"format": {"type": "json_object"}}}).response_format
    assert fmt is not None and fmt.type == "json_object"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": "x", "previous_response_id": "resp_1"}, "previous_response_id"),
        ({"input": "x", "conversation": "conv_1"}, "conversation"),
        ({"input": "x", "background": True, "store": False}, "background"),  # vLLM: background needs store
        ({"input": "x", "prompt": {"id": "p"}}, "prompt"),
        ({}, "input"),
        ({"input": []}, "input"),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0]"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input[0].content[0].type"),
        ({"input": [{"role": "user", "content": [{"type": "input_text"}]}]}, "input[0].content[0].text"),
        ({"input": [{"role": "tool", "content": "x"}]}, "input[0].role"),
        ({"input": [{"type": "web_search_call", "id": "w"}]}, "input[0].type"),
        ({"input": [{"type": "function_call", "name": "f"}]}, "input[0].call_id"),
        ({"input": [{"type": "function_call_output", "output": "x"}]}, "input[0].call_id"),
        ({"input": "x", "tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"input": "x", "tools": [{"type": "function"}]}, "tools[0].name"),
        ({"input": "x", "tool_choice": {"type": "file_search"}}, "tool_choice.type"),
        ({"input": "x", "text": {"format": {"type": "json_schema", "name": "n"}}}, "text.format.schema"),
    ],
)
def test_refusals_name_the_responses_field(body, param):
    assert error(body).param == param


def test_previous_response_id_says_what_to_do():
    message = error({"input": "x", "previous_response_id": "resp_1"}).message
    assert "input" in message and "store" in message


@pytest.mark.parametrize(
    ("chat_param", "api_param"),
    [
        ("max_tokens", "max_output_tokens"),
        ("tools[1].function.parameters", "tools[1].parameters"),
        ("tools[0].function.name", "tools[0].name"),
        ("tool_choice.function.name", "tool_choice.name"),
        ("response_format.json_schema.schema", "text.format.schema"),
        ("messages", "input"),
        ("temperature", "temperature"),
    ],
)
def test_chat_errors_are_renamed(chat_param, api_param):
    with pytest.raises(InvalidRequest) as info, renamed(C.CHAT_NAMES):
        raise InvalidRequest(f"'{chat_param}' is wrong; reduce max_tokens.", param=chat_param)
    assert info.value.param == api_param
    assert info.value.message.startswith(f"'{api_param}'") or chat_param.startswith(("tools", "tool_choice", "response"))
    assert "max_tokens" not in info.value.message
