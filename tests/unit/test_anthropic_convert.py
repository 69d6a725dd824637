"""Anthropic request -> chat request; Anthropic's error shape; the stop-sequence filter."""

from __future__ import annotations

import json

import msgspec
import pytest

from streamproxy.apis.anthropic import convert as C
from streamproxy.apis.anthropic import errors as anthropic_errors
from streamproxy.apis.anthropic.protocol import decode_count_request, decode_request
from streamproxy.core import params as P
from streamproxy.core.prepare import renamed
from streamproxy.errors import (
    APIError,
    AuthenticationError,
    EngineError,
    EngineLoading,
    GenerationTimeout,
    InvalidRequest,
    ModelNotFound,
    PayloadTooLarge,
    RateLimited,
)
from streamproxy.filters.base import CONTENT, Part, Pipeline
from streamproxy.filters.stopseq import StopSequenceFilter
from streamproxy.protocol.openai_chat import NamedToolChoice


def chat(body: dict):
    return C.to_chat(decode_request(msgspec.json.encode({"max_tokens": 10, **body})))


def flat(body: dict) -> list[dict]:
    return P.chat_messages(chat(body).messages)


def error(body: dict) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as info:
        chat(body)
    return info.value


def test_system_string_and_blocks():
    assert flat({"system": "be brief", "messages": [{"role": "user", "content": "hi"}]}) == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hi"},
    ]
    blocks = [{"type": "text", "text": "a", "cache_control": {"type": "ephemeral"}}, {"type": "text", "text": "b"}]
    assert flat({"system": blocks, "messages": [{"role": "user", "content": "hi"}]})[0] == {"role": "system", "content": "a\nb"}


def test_tool_use_and_tool_result_round_trip():
    body = {
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "weather?"}]},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "need a tool", "signature": "sig"},
                    {"type": "redacted_thinking", "data": "xx"},
                    {"type": "text", "text": "Checking."},
                    {"type": "tool_use", "id": "toolu_1", "name": "get", "input": {"city": "Paris"}},
                    {"type": "tool_use", "id": "toolu_2", "name": "get", "input": {"city": "Oslo"}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "18C"},
                    {"type": "tool_result", "tool_use_id": "toolu_2", "content": [{"type": "text", "text": "9C"}], "is_error": False},
                    {"type": "text", "text": "thanks"},
                ],
            },
        ]
    }
    out = flat(body)
    assert out[0] == {"role": "user", "content": "weather?"}
    assert out[1] == {
        "role": "assistant",
        "content": "Checking.",
        "tool_calls": [
            {"id": "toolu_1", "type": "function", "function": {"name": "get", "arguments": '{"city":"Paris"}'}},
            {"id": "toolu_2", "type": "function", "function": {"name": "get", "arguments": '{"city":"Oslo"}'}},
        ],
        "reasoning_content": "need a tool",
    }
    assert out[2:] == [
        {"role": "tool", "content": "18C", "tool_call_id": "toolu_1"},
        {"role": "tool", "content": "9C", "tool_call_id": "toolu_2"},
        {"role": "user", "content": "thanks"},
    ]


def test_settings_map_to_chat_fields():
    req = chat(
        {
            "messages": [{"role": "user", "content": "x"}],
            "max_tokens": 64,
            "temperature": 0.5,
            "top_p": 0.8,
            "top_k": 20,
            "stop_sequences": ["END"],
            "stream": True,
            "metadata": {"user_id": "u1"},
            "tools": [{"name": "get", "description": "d", "input_schema": {"type": "object"}}],
            "tool_choice": {"type": "tool", "name": "get", "disable_parallel_tool_use": True},
            "output_config": {"format": {"type": "json_schema", "schema": {"type": "object"}}},
        }
    )
    assert (req.max_tokens, req.temperature, req.top_p, req.top_k, req.stream, req.user) == (64, 0.5, 0.8, 20, True, "u1")
    assert req.stop == ["END"] and req.include_stop_str_in_output is True
    assert req.tools is not None and req.tools[0].function.parameters == {"type": "object"}
    assert isinstance(req.tool_choice, NamedToolChoice) and req.tool_choice.function.name == "get"
    assert req.parallel_tool_calls is False
    assert req.response_format is not None and req.response_format.json_schema.schema == {"type": "object"}


@pytest.mark.parametrize(("choice", "expected"), [("auto", "auto"), ("any", "required"), ("none", "none")])
def test_tool_choice_kinds(choice, expected):
    req = chat({"messages": [{"role": "user", "content": "x"}], "tools": [{"name": "f", "input_schema": {"type": "object"}}], "tool_choice": {"type": choice}})
    assert req.tool_choice == expected and req.parallel_tool_calls is None


def test_thinking_disabled_turns_the_template_switch_off():
    req = chat({"messages": [{"role": "user", "content": "x"}], "thinking": {"type": "disabled"}})
    assert req.chat_template_kwargs == {"enable_thinking": False}


def test_count_tokens_request_needs_no_max_tokens():
    req = C.to_chat(decode_count_request(b'{"messages":[{"role":"user","content":"x"}],"system":"s"}'))
    assert [m.role for m in req.messages] == ["system", "user"] and req.max_tokens is None


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "system", "content": "x"}]}, "messages[0].role"),
        ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, "messages[0].content[0].type"),
        ({"messages": [{"role": "user", "content": [{"type": "tool_use", "id": "a", "name": "b"}]}]}, "messages[0].content[0].type"),
        ({"messages": [{"role": "assistant", "content": [{"type": "tool_result", "tool_use_id": "a"}]}]}, "messages[0].content[0].type"),
        ({"messages": [{"role": "assistant", "content": [{"type": "tool_use", "name": "b"}]}]}, "messages[0].content[0].id"),
        ({"messages": [{"role": "user", "content": [{"type": "tool_result"}]}]}, "messages[0].content[0].tool_use_id"),
        (
            {"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "a", "content": [{"type": "image"}]}]}]},
            "messages[0].content[0].content[0].type",
        ),
        ({"messages": [{"role": "user", "content": "x"}], "tools": [{"name": "web_search", "type": "web_search_20250305"}]}, "tools[0].type"),
        ({"messages": [{"role": "user", "content": "x"}], "tool_choice": {"type": "tool"}}, "tool_choice.name"),
        ({"messages": [{"role": "user", "content": "x"}], "tool_choice": {"type": "maybe"}}, "tool_choice.type"),
        ({"messages": [{"role": "user", "content": "x"}], "output_config": {"format": {"type": "regex"}}}, "output_config.format"),
    ],
)
def test_refusals_name_the_anthropic_field(body, param):
    assert error(body).param == param


@pytest.mark.parametrize(
    ("chat_param", "api_param"),
    [
        ("tools[0].function.parameters", "tools[0].input_schema"),
        ("tool_choice.function.name", "tool_choice.name"),
        ("response_format.json_schema.schema", "output_config.format.schema"),
        ("stop[1]", "stop_sequences[1]"),
        ("max_tokens", "max_tokens"),
    ],
)
def test_chat_errors_are_renamed(chat_param, api_param):
    with pytest.raises(InvalidRequest) as info, renamed(C.CHAT_NAMES):
        raise InvalidRequest("bad", param=chat_param)
    assert info.value.param == api_param


# -- Anthropic's error shape -------------------------------------------------------


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (InvalidRequest("bad"), "invalid_request_error"),
        (AuthenticationError("no key"), "authentication_error"),
        (ModelNotFound("no model"), "not_found_error"),
        (PayloadTooLarge("big"), "request_too_large"),
        (RateLimited("slow"), "rate_limit_error"),
        (EngineError("boom"), "api_error"),
        (EngineLoading("loading"), "overloaded_error"),
        (GenerationTimeout("late"), "timeout_error"),
        (APIError("odd", status=502), "api_error"),
    ],
)
def test_error_types_follow_the_status(exc, kind):
    body = json.loads(anthropic_errors.error_json(exc))
    assert body == {"type": "error", "error": {"type": kind, "message": exc.message}}


def test_error_message_names_the_param():
    body = json.loads(anthropic_errors.error_json(InvalidRequest("must be at least 1", param="max_tokens")))
    assert body["error"]["message"] == "max_tokens: must be at least 1"
    body = json.loads(anthropic_errors.error_json(InvalidRequest("'max_tokens' must be at least 1", param="max_tokens")))
    assert body["error"]["message"] == "'max_tokens' must be at least 1"


# -- the stop-sequence filter --------------------------------------------------------


def run_filter(chunks: list[str], stops: list[str]) -> tuple[str, str | None]:
    f = StopSequenceFilter(stops)
    pipe = Pipeline([f])
    text = "".join(p.text for c in chunks for p in pipe.feed(c))
    parts, reason = pipe.finish("stop")
    assert reason == "stop"
    return text + "".join(p.text for p in parts), f.matched


@pytest.mark.parametrize("cut", range(len("say hi STOP") + 1))
def test_stop_filter_strips_and_names_at_every_split(cut):
    s = "say hi STOP"
    assert run_filter([s[:cut], s[cut:]], ["STOP", "P", "xyzzy-long"]) == ("say hi ", "STOP")


def test_stop_filter_prefers_the_longest_match_and_passes_other_text():
    assert run_filter(["a", "b", "c", "ba"], ["a", "ba"]) == ("abc", "ba")
    assert run_filter(["no stop here"], ["END"]) == ("no stop here", None)
    assert run_filter(["END"], ["END"]) == ("", "END")


def test_stop_filter_holds_back_only_the_longest_stop():
    f = StopSequenceFilter(["END"])
    out = f.feed([Part(CONTENT, "abcdef", token_ids=[1, 2])])
    assert [p.text for p in out] == ["abc"] and out[0].token_ids == [1, 2]
    out = f.feed([Part(CONTENT, "", token_ids=[3])])
    assert [(p.text, p.token_ids) for p in out] == [("", [3])]


def test_tool_use_input_with_an_integer_past_64_bits():
    # Found by tests/fuzz: the arguments were written with orjson, which refuses such integers (a 500).
    body = {
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {"n": 2**64}}]},
        ]
    }
    (call,) = chat(body).messages[1].tool_calls
    assert json.loads(call.function.arguments) == {"n": 2**64}
