"""The fuzzers' budgets and strategies.

    load_profile()        "ci" (default) or "long" (STREAMPROXY_FUZZ=long), see conftest.py
    budget(n)             @settings for a property worth n examples under "ci"
    json_values           any JSON value (nested a few levels)
    deep(depth)           a JSON array/object nested `depth` levels (any nesting, past every limit)
    request_bodies(name)  bodies for a route whose request is our component `name` in
                          GET /openapi.json: random bytes, any JSON, typed requests built from
                          the schema (with the words the code dispatches on), the same with
                          one field replaced by something else, and deep nesting in a field
    chunkings(text)       the same text cut into random pieces
"""

from __future__ import annotations

import copy
import os
from functools import cache
from typing import Any

import msgspec
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

LONG = os.environ.get("STREAMPROXY_FUZZ", "").lower() == "long"
# The long profile's budgets: this many times the ci ones (10: the whole folder in about 10 minutes on 2 cores).
LONG_FACTOR = int(os.environ.get("STREAMPROXY_FUZZ_FACTOR") or 10)

settings.register_profile(
    "ci",
    deadline=None,
    derandomize=True,
    database=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture],
)
settings.register_profile(
    "long",
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture],
)


def load_profile() -> None:
    settings.load_profile("long" if LONG else "ci")


def budget(n: int) -> settings:
    return settings(max_examples=n * LONG_FACTOR if LONG else n)


# --- JSON ---------------------------------------------------------------------

# Strings the code dispatches on (roles, block and item types, tool choices, formats),
# so typed requests reach past the first check.
WORDS = (
    "system", "developer", "user", "assistant", "tool", "function", "text", "image_url", "input_text", "output_text",
    "refusal", "summary_text", "reasoning_text", "input_image", "file", "message", "function_call", "function_call_output",
    "reasoning", "item_reference", "auto", "required", "none", "any", "custom", "json_object", "json_schema", "enabled",
    "disabled", "adaptive", "low", "medium", "high", "tool_use", "tool_result", "thinking", "redacted_thinking", "image",
    "document", "web_search_20250305", "float", "base64", "fake", "f", "g", "", " ", "<think>", "</think>", "<tool_call>",
    "\u00e9", "\U0001f600", "\x00",
    # JSON Schema's own words: tool parameters and response formats are schemas the server compiles.
    "$ref", "$schema", "$defs", "$id", "#", "#/nope", "#/$defs/x", "properties", "items", "type", "object", "string", "integer",
    "enum", "pattern", "additionalProperties", "city",
)

_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.integers(-3, 3)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.sampled_from(WORDS)
    | st.text(max_size=12)
)
json_values = st.recursive(
    _scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.sampled_from(WORDS) | st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
json_objects = st.dictionaries(st.sampled_from(WORDS) | st.text(max_size=8), json_values, max_size=5)

# JSON Schemas, right and wrong: tool parameters, response formats and vLLM's guided_json are
# schemas the server compiles and later validates calls against.
_schema_leaf = st.fixed_dictionaries(
    {},
    optional={
        "type": st.sampled_from(["object", "string", "integer", "array", "null", "nope"]) | _scalars,
        "$ref": st.sampled_from(["#", "#/nope", "#/$defs/x", "#/properties/city", "http://127.0.0.1:9/s.json", "x.json"]) | _scalars,
        "$schema": st.sampled_from(["https://json-schema.org/draft/2020-12/schema", "http://json-schema.org/draft-07/schema#",
                                    "http://json-schema.org/draft-03/schema#", "urn:nope"]) | json_values,
        "$id": st.sampled_from(["urn:a", "http://127.0.0.1:9/a", "#a"]) | _scalars,
        "pattern": st.sampled_from(["^a", "(", "[a-z]+", "\\p{L}"]),
        "format": st.sampled_from(["email", "date-time", "regex", "uri", "nope"]),
        "enum": st.lists(_scalars, max_size=3),
        "required": st.lists(st.sampled_from(["city", "a"]), max_size=2) | _scalars,
        "minimum": _scalars,
    },
)
json_schemas = st.recursive(
    _schema_leaf,
    lambda inner: st.fixed_dictionaries(
        {"type": st.just("object")},
        optional={
            "properties": st.dictionaries(st.sampled_from(["city", "a"]), inner, max_size=2),
            "items": inner,
            "$defs": st.dictionaries(st.just("x"), inner, max_size=1),
            "anyOf": st.lists(inner, max_size=2),
            "additionalProperties": inner | st.booleans(),
            "$ref": st.sampled_from(["#", "#/$defs/x", "#/nope"]),
        },
    ),
    max_leaves=6,
)


def deep(depth: int) -> bytes:
    """JSON nested `depth` levels (objects and arrays by turns), as bytes: no encoder writes that deep."""
    opens = b"".join(b"[" if i % 2 else b'{"a":' for i in range(depth))
    closes = b"".join(b"]" if i % 2 else b"}" for i in reversed(range(depth)))
    return opens + b"null" + closes


depths = st.sampled_from([30, 120, 300, 600, 1100, 5000]) | st.integers(1, 3000)


class Deep:
    """A placeholder for `deep(depth)` in a value about to be encoded (see `_encode`)."""

    def __init__(self, depth: int) -> None:
        self.depth = depth


def _encode(value: Any) -> bytes:
    found: list[int] = []

    def enc_hook(obj: Any) -> Any:
        if isinstance(obj, Deep):
            found.append(obj.depth)
            return f"\x00deep{len(found) - 1}\x00"
        raise NotImplementedError(type(obj))

    body = msgspec.json.encode(value, enc_hook=enc_hook)
    for i, depth in enumerate(found):
        body = body.replace(b'"\\u0000deep%d\\u0000"' % i, deep(depth))
    return body


# --- from our schema ----------------------------------------------------------


@cache
def components() -> dict[str, Any]:
    from streamproxy.http.openapi import build

    return build()["components"]["schemas"]


_strings = st.one_of(st.sampled_from(WORDS), st.sampled_from(WORDS), st.sampled_from(WORDS), st.text(max_size=10))
_integers = st.integers(-3, 40) | st.sampled_from([2**31, 2**63, 2**64, -(2**63) - 1, 10**30])
_numbers = st.floats(allow_nan=False, allow_infinity=False) | st.sampled_from([0.0, 0.5, 1.0, 2.0, -1.0, 100.0, 1e308])


def from_schema(schema: dict[str, Any], depth: int = 0) -> st.SearchStrategy[Any]:
    """Values of a JSON Schema as msgspec writes them ($ref, anyOf, type, properties,
    additionalProperties, items); past a few levels of $ref, any JSON (recursive structs end)."""
    if "$ref" in schema:
        if depth > 4:
            return json_values
        name = schema["$ref"].rsplit("/", 1)[-1]
        return st.deferred(lambda: from_schema(components()[name], depth + 1))
    if "anyOf" in schema:
        return st.one_of([from_schema(s, depth) for s in schema["anyOf"]])
    kind = schema.get("type")
    if kind is None:
        return json_values
    if kind == "null":
        return st.none()
    if kind == "boolean":
        return st.booleans()
    if kind == "integer":
        return _integers
    if kind == "number":
        return _numbers | _integers
    if kind == "string":
        return _strings
    if kind == "array":
        return st.lists(from_schema(schema.get("items", {}), depth), max_size=3)
    if kind == "object":
        props = schema.get("properties")
        if props is None:
            if "additionalProperties" in schema:
                return st.dictionaries(_strings, from_schema(schema["additionalProperties"], depth), max_size=3)
            return st.dictionaries(_strings, json_values, max_size=3) | json_schemas
        required = set(schema.get("required", ()))
        return st.fixed_dictionaries(
            {k: from_schema(v, depth) for k, v in props.items() if k in required},
            optional={k: from_schema(v, depth) for k, v in props.items() if k not in required},
        )
    raise AssertionError(f"a schema this strategy does not know: {schema}")


_replacements = (
    json_values
    | json_schemas
    | st.sampled_from(WORDS)
    | _integers
    | st.sampled_from([None, [], {}, "", 0, -1, True, 2**64, 1e308, [None], {"": None}])
    | depths.map(Deep)
)


@st.composite
def _mutated(draw: st.DrawFn, name: str, seeded: bool = False) -> Any:
    """A request (a seed, or typed from the schema) changed in one to three places: a value
    replaced by something else (any JSON, a word, a deep one), a key dropped, or a key of
    the request added with a typed value."""
    value = draw(st.sampled_from(SEEDS[name]) if seeded else from_schema(components()[name]))
    value = msgspec.json.decode(msgspec.json.encode(value))  # a copy to change
    for _ in range(draw(st.integers(1, 3))):
        value = _mutate_once(draw, name, value)
    return value


def _mutate_once(draw: st.DrawFn, name: str, value: Any) -> Any:
    paths: list[list[Any]] = []

    def walk(node: Any, path: list[Any]) -> None:
        paths.append(path)
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, [*path, k])
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, [*path, i])

    walk(value, [])
    path = draw(st.sampled_from(paths[1:] or paths))  # the whole body is `json_values`' job
    op = draw(st.sampled_from(["replace", "replace", "drop", "add"]))
    if op == "add" and isinstance(value, dict):
        props = components()[name]["properties"]
        key = draw(st.sampled_from(sorted(props)))
        value[key] = draw(from_schema(props[key]))
        return value
    # A copy: sampled constants ([], {}) must not be shared, or changed from one example to the next.
    typed = _typed_at(name, path, value)
    replacement = copy.deepcopy(draw(st.one_of(_replacements, typed, typed)))
    if not path:
        return replacement
    node = value
    for key in path[:-1]:
        node = node[key]
    if op == "drop" and isinstance(node, dict):
        del node[path[-1]]
    else:
        node[path[-1]] = replacement
    return value


_JSON_TYPE = {dict: "object", list: "array", str: "string", bool: "boolean", int: "integer", float: "number", type(None): "null"}


def _typed_at(name: str, path: list[Any], value: Any) -> st.SearchStrategy[Any]:
    """Values of the right type for the place `path` in `value` (a request of component `name`),
    following its schema; any JSON where the schema does not say."""
    schema: dict[str, Any] = components()[name]
    node = value
    for key in path:
        schema = _branch(schema, node)
        if isinstance(key, str):
            props = schema.get("properties", {})
            schema = props.get(key) or schema.get("additionalProperties") or {}
        else:
            schema = schema.get("items", {})
        node = node[key]
    return from_schema(_branch(schema, node) if "$ref" in schema else schema)


def _branch(schema: dict[str, Any], node: Any) -> dict[str, Any]:
    """`schema` with its $refs followed and, of an anyOf, the branch `node`'s type takes."""
    while True:
        if "$ref" in schema:
            schema = components()[schema["$ref"].rsplit("/", 1)[-1]]
        elif "anyOf" in schema:
            kind = _JSON_TYPE.get(type(node))
            found = [s for s in schema["anyOf"] if s.get("type") == kind or "$ref" in s]
            schema = found[0] if found else {}
        else:
            return schema


def typed(name: str) -> st.SearchStrategy[Any]:
    return from_schema(components()[name])


# Valid requests of each route, using the features that take the deeper paths
# (tools and tool choices, structured outputs, reasoning, tool results,
# thinking blocks); `_mutated` changes them one value at a time.
_PARAMS = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
_CHAT_TOOLS = [{"type": "function", "function": {"name": "f", "parameters": _PARAMS}}]
_CHAT_MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": [{"type": "text", "text": "Hi"}]},
    {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"city":"P"}'}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
]
_ANTHROPIC_MESSAGES = [
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "hm", "signature": ""},
        {"type": "text", "text": "Calling"},
        {"type": "tool_use", "id": "t1", "name": "f", "input": {"city": "P"}},
    ]},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "sunny"}]}]},
]
_ANTHROPIC_TOOLS = [{"name": "f", "input_schema": _PARAMS}]
_RESPONSES_INPUT = [
    {"role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
    {"type": "reasoning", "id": "r1", "summary": [{"type": "summary_text", "text": "hm"}]},
    {"type": "function_call", "call_id": "c1", "name": "f", "arguments": '{"city":"P"}'},
    {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
]
SEEDS: dict[str, list[dict[str, Any]]] = {
    "ChatCompletionRequest": [
        {"messages": [{"role": "user", "content": "Hi"}], "stream": True, "stream_options": {"include_usage": True}},
        {"messages": _CHAT_MESSAGES, "tools": _CHAT_TOOLS, "tool_choice": "auto", "n": 2, "stop": ["x"], "max_tokens": 5},
        {"messages": _CHAT_MESSAGES, "tools": _CHAT_TOOLS, "tool_choice": "required", "parallel_tool_calls": False},
        {"messages": _CHAT_MESSAGES, "tools": _CHAT_TOOLS, "tool_choice": {"type": "function", "function": {"name": "f"}}},
        {"messages": [{"role": "user", "content": "Hi"}], "response_format": {"type": "json_schema", "json_schema": {"name": "r", "schema": _PARAMS}}},
        {"messages": [{"role": "user", "content": "Hi"}], "structured_outputs": {"choice": ["a", "b"]}, "logprobs": True, "top_logprobs": 2},
        {"messages": [{"role": "user", "content": "Hi"}], "reasoning_effort": "low", "chat_template_kwargs": {"enable_thinking": True},
         "logit_bias": {"65": 1.5}, "seed": 7, "temperature": 0.5, "top_p": 0.9, "top_k": 5, "min_tokens": 1},
    ],
    "CompletionRequest": [
        {"prompt": "Hi", "max_tokens": 5, "stream": True, "logprobs": 2},
        {"prompt": [72, 105], "n": 2, "stop": "x", "response_format": {"type": "json_object"}},
        {"prompt": ["Hi"], "guided_regex": "[a-z]+", "echo": False},
    ],
    "ResponsesRequest": [
        {"input": "Hi", "instructions": "Be brief.", "max_output_tokens": 5, "stream": True},
        {"input": _RESPONSES_INPUT, "tools": [{"type": "function", "name": "f", "parameters": _PARAMS}], "tool_choice": "auto"},
        {"input": _RESPONSES_INPUT, "tools": [{"type": "function", "name": "f", "parameters": _PARAMS}], "tool_choice": {"type": "function", "name": "f"}},
        {"input": "Hi", "text": {"format": {"type": "json_schema", "name": "r", "schema": _PARAMS}}, "reasoning": {"effort": "low"}},
    ],
    "MessagesRequest": [
        {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5, "stream": True, "system": "Be brief.", "stop_sequences": ["x"]},
        {"messages": _ANTHROPIC_MESSAGES, "max_tokens": 5, "tools": _ANTHROPIC_TOOLS, "tool_choice": {"type": "auto"}},
        {"messages": _ANTHROPIC_MESSAGES, "max_tokens": 5, "tools": _ANTHROPIC_TOOLS, "tool_choice": {"type": "tool", "name": "f"},
         "thinking": {"type": "enabled", "budget_tokens": 100}},
        {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5, "output_config": {"format": {"type": "json_schema", "schema": _PARAMS}},
         "system": [{"type": "text", "text": "Be brief."}], "metadata": {"user_id": "u"}},
    ],
    "CountTokensRequest": [
        {"messages": _ANTHROPIC_MESSAGES, "tools": _ANTHROPIC_TOOLS, "tool_choice": {"type": "any"}},
        {"messages": [{"role": "user", "content": "Hi"}], "system": "Be brief.", "thinking": {"type": "disabled"}},
    ],
    "EmbeddingRequest": [{"input": "Hi"}, {"input": ["Hi", "there"], "encoding_format": "base64", "dimensions": 4}, {"input": [[72, 105]]}],
    "TokenizeRequest": [{"prompt": "Hi", "return_token_strs": True}, {"messages": _CHAT_MESSAGES, "add_generation_prompt": False}],
    "DetokenizeRequest": [{"tokens": [72, 105]}],
}


# Bytes no encoder writes: a lone surrogate escape, invalid UTF-8 in a string, a BOM,
# numbers past every range, duplicate keys, trailing garbage.
_TRICKS = st.sampled_from([
    b'"\\ud800"', b'"\xff\xfe"', b'1e999', b'-1e999', b'123456789012345678901234567890', b'{"a":1,"a":2}', b'[1,]', b'nul',
])


@st.composite
def _tricky(draw: st.DrawFn, name: str) -> bytes:
    body = _encode(draw(typed(name)))
    trick = draw(_TRICKS)
    where = draw(st.sampled_from(["value", "prefix", "suffix"]))
    if where == "prefix":
        return draw(st.sampled_from([b"\xef\xbb\xbf", b" \t\r\n", b"\x00"])) + body
    if where == "suffix":
        return body + draw(st.sampled_from([b" ", b"x", b"}", b"\x00", b"{}"]))
    # Put the trick in place of a JSON value: after the first colon that starts one.
    at = body.find(b":")
    if at < 0:
        return trick
    end = _value_end(body, at + 1)
    return body[: at + 1] + trick + body[end:]


def _value_end(body: bytes, start: int) -> int:
    """Where the JSON value at `start` ends (msgspec wrote it: no whitespace)."""
    from streamproxy.filters.jsonscan import value_end

    text = body.decode()
    prefix = len(body[:start].decode())
    end = value_end(text, prefix)
    return len(text[:end].encode()) if end >= 0 else len(body)


def request_bodies(name: str) -> st.SearchStrategy[bytes]:
    return st.one_of(
        st.binary(max_size=64),
        _tricky(name),
        json_values.map(_encode),
        depths.map(deep),
        typed(name).map(_encode),
        _mutated(name).map(_encode),
        st.sampled_from(SEEDS[name]).map(_encode),
        _mutated(name, seeded=True).map(_encode),
        _mutated(name, seeded=True).map(_encode),
        _mutated(name, seeded=True).map(_encode),
    )


# --- chunking -----------------------------------------------------------------


@st.composite
def chunkings(draw: st.DrawFn, text: Any) -> list[Any]:
    """`text` (str or bytes) cut at random places into pieces (some of them empty)."""
    cuts = sorted(draw(st.lists(st.integers(0, len(text)), max_size=max(1, min(len(text), 24)))))
    pieces, start = [], 0
    for cut in [*cuts, len(text)]:
        pieces.append(text[start:cut])
        start = cut
    return pieces
