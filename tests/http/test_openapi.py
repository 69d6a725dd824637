"""GET /openapi.json: every route, valid OpenAPI 3.1, and in agreement with OpenAI's published shapes.

OpenAI's side comes from its SDKs: the response schemas of
tests/support/openai_schema.py (the `openai` SDK's models, as strict as the
API reference), and, for the request bodies, the request types OpenAI's and
Anthropic's own Python SDKs are generated from (`CompletionCreateParams...`,
TypedDicts turned into JSON Schema by pydantic, which the SDKs depend on).

Requests: everything OpenAI requires is a property of ours, we require
nothing OpenAI does not, and every JSON type OpenAI allows for a property
we share, our schema (so our decoder) allows too. Responses: every property
OpenAI requires is one of ours, and a real answer of the server validates
against both our schema and OpenAI's.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import jsonschema
import pydantic
import pytest

from engine_adapter.fake import FakeScript
from streamproxy.http import openapi
from streamproxy.http.routes import unsupported
from tests.support import USER_HI
from tests.support.openai_schema import load_defs
from tests.support.openai_schema import validate as validate_openai
from tests.support.openapi_doc import app_routes, assert_refs_closed, assert_valid_3_1


@cache
def doc() -> dict[str, Any]:
    return openapi.build()


def ours(name: str) -> dict[str, Any]:
    return doc()["components"]["schemas"][name]


def our_validator(name: str) -> jsonschema.protocols.Validator:
    """Our component `name` as a JSON Schema 2020-12 validator (refs resolve inside the document)."""
    schema = {**doc(), "$ref": f"#/components/schemas/{name}"}
    return jsonschema.Draft202012Validator(schema)


def resolve(schema: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        schema = defs[schema["$ref"].rsplit("/", 1)[-1]]
    return schema


_JSON_TYPE = {str: "string", int: "integer", float: "number", bool: "boolean", type(None): "null", dict: "object", list: "array"}


def json_types(schema: dict[str, Any], defs: dict[str, Any]) -> set[str]:
    """The JSON types a schema admits ({"any"} when it does not restrict them)."""
    schema = resolve(schema, defs)
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return set().union(*(json_types(s, defs) for s in schema[key]))
    if "allOf" in schema:
        return set.intersection(*(json_types(s, defs) for s in schema["allOf"]))
    if "type" in schema:
        t = schema["type"]
        found = set(t) if isinstance(t, list) else {t}
    elif "const" in schema:
        found = {_JSON_TYPE[type(schema["const"])]}
    elif "enum" in schema:
        found = {_JSON_TYPE[type(v)] for v in schema["enum"]}
    else:
        return {"any"}
    if "number" in found:
        found.add("integer")
    return found


# --- the document itself ---------------------------------------------------


async def test_served_once_and_lists_exactly_the_routes(serve):
    client, _ = await serve()
    resp = await client.get("/openapi.json")
    assert resp.status == 200
    assert resp.headers["Content-Type"].startswith("application/json")
    body = await resp.read()
    assert body == await (await client.get("/openapi.json")).read()
    assert openapi.document() is openapi.document()  # built once
    served = await resp.json()
    assert served == doc()
    documented = {(method, path) for path, item in served["paths"].items() for method in item}
    # vLLM's routes that are not served answer a 404 saying so (routes/unsupported.py): not documented.
    refused = {(method.lower(), path) for method, path, _ in unsupported.UNSUPPORTED}
    assert documented == app_routes(client.server.app) - refused
    assert refused <= app_routes(client.server.app)


def test_valid_openapi_3_1():
    assert_valid_3_1(doc(), "/v1/models/{model_id}")


def test_every_ref_resolves_and_every_component_is_used():
    assert_refs_closed(doc(), openapi.document().decode())


def test_request_schemas_are_the_decoders():
    # What the document says a request may be is what the route's decoder accepts.
    chat = ours("ChatCompletionRequest")
    assert chat["required"] == ["messages"]
    assert json_types(chat["properties"]["stop"], doc()["components"]["schemas"]) >= {"string", "array", "null"}
    op = doc()["paths"]["/v1/messages"]["post"]
    assert op["responses"]["4XX"]["content"]["application/json"]["schema"]["$ref"].endswith("anthropic.protocol.ErrorEnvelope")
    assert "text/event-stream" in op["responses"]["200"]["content"]
    assert "text/event-stream" not in doc()["paths"]["/v1/embeddings"]["post"]["responses"]["200"]["content"]


# --- requests against OpenAI's (and Anthropic's) own SDK types ----------------


def _sdk_schemas() -> list[tuple[str, str, Any]]:
    from anthropic.types import message_count_tokens_params, message_create_params
    from openai.types import completion_create_params, embedding_create_params
    from openai.types.chat import completion_create_params as chat_params
    from openai.types.responses import response_create_params

    return [
        ("ChatCompletionRequest", "streaming", chat_params.CompletionCreateParamsStreaming),
        ("ChatCompletionRequest", "non-streaming", chat_params.CompletionCreateParamsNonStreaming),
        ("CompletionRequest", "streaming", completion_create_params.CompletionCreateParamsStreaming),
        ("CompletionRequest", "non-streaming", completion_create_params.CompletionCreateParamsNonStreaming),
        ("EmbeddingRequest", "", embedding_create_params.EmbeddingCreateParams),
        ("ResponsesRequest", "streaming", response_create_params.ResponseCreateParamsStreaming),
        ("ResponsesRequest", "non-streaming", response_create_params.ResponseCreateParamsNonStreaming),
        ("MessagesRequest", "streaming", message_create_params.MessageCreateParamsStreaming),
        ("MessagesRequest", "non-streaming", message_create_params.MessageCreateParamsNonStreaming),
        ("CountTokensRequest", "", message_count_tokens_params.MessageCountTokensParams),
    ]


# Where we knowingly accept less than OpenAI: (our struct, property) -> why.
NARROWER: dict[tuple[str, str], str] = {
    ("CompletionRequest", "prompt"): "null (OpenAI's default prompt, <|endoftext|>) is a 400 naming 'prompt'",
}


@pytest.mark.parametrize(("name", "variant", "sdk_type"), _sdk_schemas(), ids=lambda x: x if isinstance(x, str) else "")
def test_request_accepts_what_the_sdk_may_send(name, variant, sdk_type):
    theirs = pydantic.TypeAdapter(sdk_type).json_schema()
    their_defs = theirs.get("$defs", {})
    mine = ours(name)
    defs = doc()["components"]["schemas"]
    their_required = set(theirs.get("required", ()))
    assert their_required - {"stream"} <= set(mine["properties"]), f"{name}: OpenAI requires what we do not know"
    assert set(mine.get("required", ())) <= their_required, f"{name}: we require what the SDK may leave out"
    narrower = []
    for prop, their_schema in theirs["properties"].items():
        if prop not in mine["properties"] or (name, prop) in NARROWER:
            continue
        allowed = json_types(mine["properties"][prop], defs)
        if "any" in allowed:
            continue
        missing = json_types(their_schema, their_defs) - allowed - {"any"}
        if missing:
            narrower.append(f"{prop}: {sorted(missing)}")
    assert narrower == [], f"{name} ({variant}) refuses JSON types the SDK may send"


def test_the_type_check_sees_a_narrower_field():
    # A property typed `integer` where OpenAI allows `integer | null` is caught.
    defs: dict[str, Any] = {}
    assert json_types({"anyOf": [{"type": "integer"}, {"type": "null"}]}, defs) - json_types({"type": "integer"}, defs) == {"null"}
    assert json_types({"const": True}, defs) == {"boolean"}
    assert json_types({"type": "number"}, defs) >= {"integer"}


# --- responses against OpenAI's (tests/support/openai_schema.py) ---------------

PAIRS = [
    ("CreateChatCompletionResponse", "ChatCompletion"),
    ("ListModelsResponse", "ModelList"),
    ("Model", "ModelCard"),
    ("ErrorResponse", "streamproxy.errors.ErrorEnvelope"),
    ("Error", "streamproxy.errors.ErrorBody"),
    ("CompletionUsage", "streamproxy.protocol.common.Usage"),
    ("ChatCompletionResponseMessage", "ResponseMessage"),
]


@pytest.mark.parametrize(("openai_name", "name"), PAIRS)
def test_response_has_every_property_openai_requires(openai_name, name):
    theirs = resolve(load_defs()[openai_name], load_defs())
    mine = ours(name)
    missing = set(theirs.get("required", ())) - set(mine["properties"])
    assert missing == set()
    # The choices' items, down to the message.
    if openai_name == "CreateChatCompletionResponse":
        their_choice = resolve(theirs["properties"]["choices"]["items"], load_defs())
        my_choice = resolve(mine["properties"]["choices"]["items"], doc()["components"]["schemas"])
        assert set(their_choice["required"]) <= set(my_choice["properties"])


async def test_real_answers_fit_both_schemas(serve):
    client, _ = await serve(FakeScript(tokens=["Hel", "lo"]))
    checks = [
        ("post", "/v1/chat/completions", {"messages": USER_HI, "n": 2}, "CreateChatCompletionResponse", "ChatCompletion"),
        ("get", "/v1/models", None, "ListModelsResponse", "ModelList"),
        ("get", "/v1/models/fake", None, "Model", "ModelCard"),
        ("post", "/v1/chat/completions", {"messages": USER_HI, "n": "two"}, "ErrorResponse", "streamproxy.errors.ErrorEnvelope"),
        ("get", "/v1/models/none", None, "ErrorResponse", "streamproxy.errors.ErrorEnvelope"),
    ]
    for method, path, body, openai_name, name in checks:
        resp = await client.request(method, path, json=body)
        data = await resp.json()
        validate_openai(openai_name, data)
        our_validator(name).validate(data)
    # Our schema is not a validator that accepts anything.
    with pytest.raises(jsonschema.ValidationError):
        our_validator("ChatCompletion").validate({**data, "choices": "none"})


@pytest.mark.parametrize(
    ("path", "body", "name"),
    [
        ("/v1/completions", {"prompt": "Hi"}, "Completion"),
        ("/v1/responses", {"input": "Hi"}, "Response"),
        ("/v1/messages", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5}, "Message"),
        ("/v1/messages/count_tokens", {"messages": [{"role": "user", "content": "Hi"}]}, "TokenCount"),
        ("/v1/messages", {"messages": "Hi", "max_tokens": 5}, "streamproxy.apis.anthropic.protocol.ErrorEnvelope"),
        ("/tokenize", {"prompt": "Hi"}, "TokenizeResponse"),
        ("/v1/detokenize", {"tokens": [72, 105]}, "DetokenizeResponse"),
    ],
)
async def test_other_answers_fit_our_schema(serve, path, body, name):
    client, _ = await serve(FakeScript(tokens=["Hel", "lo"]))
    resp = await client.post(path, json=body)
    our_validator(name).validate(await resp.json())
