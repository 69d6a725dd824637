"""Tool plans and structured-output constraints from request fields (sans-IO)."""

from __future__ import annotations

import msgspec
import pytest

from streamproxy.core import structured as S
from streamproxy.errors import InvalidRequest
from streamproxy.filters import toolset
from streamproxy.protocol.openai_chat import decode_request
from streamproxy.protocol.openai_completions import decode_request as decode_completion

WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "w", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time"}},
]


def req(**fields):
    return decode_request(msgspec.json.encode({"messages": [{"role": "user", "content": "x"}], **fields}))


def plan(auto_parser=None, **fields):
    return S.tool_plan(req(**fields), auto_parser=auto_parser)


def error(fn, *args, **kw) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as info:
        fn(*args, **kw)
    return info.value


def test_no_tools_no_plan():
    assert plan() is None
    assert plan(tool_choice="none") is None
    assert plan(tool_choice="auto") is None


def test_tools_default_to_auto_which_needs_the_flags():
    err = error(plan, tools=TOOLS)
    assert err.param == "tool_choice" and err.status == 400
    assert "--enable-auto-tool-choice" in err.message and "--tool-call-parser" in err.message


def test_auto_with_a_parser():
    p = plan("hermes", tools=TOOLS, tool_choice="auto")
    assert (p.mode, p.constraint, p.parallel) == ("auto", None, True)
    assert p.schemas == {"get_weather": WEATHER, "get_time": toolset.EMPTY_OBJECT}
    # The template gets the tools as plain dicts, without null fields.
    assert p.tools[1] == {"function": {"name": "get_time"}, "type": "function"}


def test_none_keeps_tools_for_the_template_but_constrains_nothing():
    p = plan(tools=TOOLS, tool_choice="none")
    assert (p.mode, p.constraint) == ("none", None)
    assert S.constraint(req(tools=TOOLS, tool_choice="none"), p) is None


def test_named_constrains_to_the_parameters():
    p = plan(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "get_weather"}})
    assert (p.mode, p.name) == ("named", "get_weather")
    assert p.constraint == {"json": WEATHER}
    p = plan(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "get_time"}})
    assert p.constraint == {"json": {"type": "object", "properties": {}}}


def test_required_constrains_to_an_array_of_calls():
    p = plan(tools=TOOLS, tool_choice="required", parallel_tool_calls=False)
    assert p.constraint == {
        "json": {
            "type": "array",
            "minItems": 1,
            "maxItems": 1,
            "items": {
                "type": "object",
                "anyOf": [
                    {"properties": {"name": {"type": "string", "enum": ["get_weather"]}, "parameters": WEATHER}, "required": ["name", "parameters"]},
                    {
                        "properties": {"name": {"type": "string", "enum": ["get_time"]}, "parameters": {"type": "object", "properties": {}}},
                        "required": ["name", "parameters"],
                    },
                ],
            },
        }
    }
    assert "maxItems" not in plan(tools=TOOLS, tool_choice="required").constraint["json"]


def test_required_hoists_defs_without_touching_the_request():
    params = {"type": "object", "properties": {"p": {"$ref": "#/$defs/P"}}, "$defs": {"P": {"type": "string"}}}
    tools = [{"type": "function", "function": {"name": "f", "parameters": params}}]
    schema = plan(tools=tools, tool_choice="required").constraint["json"]
    assert schema["$defs"] == {"P": {"type": "string"}}
    assert "$defs" not in schema["items"]["anyOf"][0]["properties"]["parameters"]


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice.function.name"),
        ({"tools": [{"type": "custom", "function": {"name": "f"}}], "tool_choice": "none"}, "tools[0].type"),
        ({"tools": [TOOLS[0], TOOLS[0]], "tool_choice": "none"}, "tools[1].function.name"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": 5}}}], "tool_choice": "none"}, "tools[0].function.parameters"),
    ],
    ids=["choice-without-tools", "bad-choice", "unknown-name", "custom-tool", "duplicate", "bad-schema"],
)
def test_plan_errors_name_the_field(fields, param):
    err = error(plan, "hermes", **fields)
    assert err.param == param, err.message


def test_response_format_constraints():
    assert S.constraint(req(response_format={"type": "text"})) is None
    assert S.constraint(req(response_format={"type": "json_object"})) == {"json_object": True}
    fmt = {"type": "json_schema", "json_schema": {"name": "w", "schema": WEATHER, "strict": True}}
    assert S.constraint(req(response_format=fmt)) == {"json": WEATHER}
    assert S.constraint(decode_completion(msgspec.json.encode({"prompt": "x", "response_format": fmt}))) == {"json": WEATHER}


def test_vllm_extensions_ride_along():
    assert S.constraint(req(structured_outputs={"regex": "a+", "disable_any_whitespace": True})) == {
        "regex": "a+",
        "disable_any_whitespace": True,
    }
    assert S.constraint(req(guided_choice=["yes", "no"])) == {"choice": ["yes", "no"]}
    assert S.constraint(req(guided_json=WEATHER)) == {"json": WEATHER}


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}}}, "response_format.json_schema.schema"),
        ({"response_format": {"type": "yaml"}}, "response_format.type"),
        ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs"),
        ({"structured_outputs": {"bogus": 1}}, "structured_outputs.bogus"),
        ({"response_format": {"type": "json_object"}, "guided_regex": "a"}, "guided_regex"),
    ],
    ids=["no-schema", "bad-schema", "unknown-type", "two-kinds", "unknown-field", "two-sources"],
)
def test_constraint_errors(fields, param):
    err = error(S.constraint, req(**fields))
    assert err.param == param, err.message


def test_bad_schema_message_says_why():
    err = error(S.constraint, req(response_format={"type": "json_schema", "json_schema": {"schema": {"type": "nope"}}}))
    assert err.message.startswith("invalid JSON Schema: ") and "nope" in err.message


def test_schema_validators_are_compiled_once_per_distinct_schema():
    schema = {"type": "object", "properties": {"unique_for_this_test": {"type": "integer"}}}
    before = toolset.cached_validators()
    first = toolset.compile_schema(schema)
    same = toolset.compile_schema({"properties": {"unique_for_this_test": {"type": "integer"}}, "type": "object"})
    assert first is same  # key order does not matter: the hash is over canonical JSON
    assert toolset.cached_validators() == before + 1


def test_toolset_check():
    tools = toolset.ToolSet({"get_weather": WEATHER, "get_time": None})
    assert tools.check("get_weather", '{"city": "x"}')
    assert tools.check("get_time", "{}")
    assert not tools.check("get_weather", "{}")
    assert not tools.check("get_weather", '{"city": 1}')
    assert not tools.check("get_weather", "not json")
    assert not tools.check("nope", "{}")
    assert not tools.check(None, "{}")


def test_a_schema_with_an_integer_past_64_bits_is_a_400_not_a_crash():
    # Found by tests/fuzz: the cache key was orjson, which refuses such integers (TypeError, a 500).
    err = error(S.tool_plan, req(tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": 2**64}}}]), auto_parser="hermes")
    assert err.param == "tools[0].function.parameters"
    schema = {"type": "object", "properties": {"n": {"type": "integer", "maximum": 2**70}}}
    assert toolset.compile_schema(schema) is toolset.compile_schema(schema)


@pytest.mark.parametrize("schema", [{"$schema": []}, {"$schema": 5}, {"$schema": {"a": 1}}])
def test_a_schema_whose_dialect_is_not_a_string_is_a_400(schema):
    # Found by tests/fuzz: jsonschema's validator_for raised TypeError / AttributeError (a 500).
    err = error(S.tool_plan, req(tools=[{"type": "function", "function": {"name": "f", "parameters": schema}}]), auto_parser="hermes")
    assert err.param == "tools[0].function.parameters" and "$schema" in err.message


def test_toolset_check_against_refs_that_lead_nowhere():
    # Found by tests/fuzz: valid schemas, but checking a call raised (in the middle of a stream).
    tools = toolset.ToolSet({"dangling": {"$ref": "#/nope"}, "loop": {"$ref": "#"}, "remote": {"$ref": "http://127.0.0.1:9/s.json"}})
    assert not tools.check("dangling", "{}")
    assert not tools.check("loop", "{}")
    assert not tools.check("remote", "{}")
