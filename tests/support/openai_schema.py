"""OpenAI's response shapes as JSON Schemas, built from the `openai` SDK the tests install.

Nothing is read from outside the repository: the schemas are generated with
pydantic from the SDK's own models (`openai.types.chat.ChatCompletionChunk`,
`ChatCompletion`, `ChatCompletionMessage`, `openai.types.Model`,
`CompletionUsage`, `openai.types.shared.ErrorObject`), plus two wrappers the
SDK has no model for (`ListModelsResponse`, `ErrorResponse`, written here).

The SDK's models are written to parse old and partial answers, so they are
looser than OpenAI's API reference in two ways, which `_Strict` (a pydantic
`GenerateJsonSchema`) takes back while it generates:

- `REQUIRED`: keys the API reference requires and the SDK does not (a chunk's
  `finish_reason`, a message's `content` and `refusal`, an error's `param` and
  `code`, a logprob's `bytes`, ...).
- null: the SDK types every optional key `Optional[X] = None` ("may be
  absent"), which pydantic renders as "may be null". A key's null is kept
  only where the SDK requires the key or `NULLABLE` lists it (the API
  reference's `nullable: true`); elsewhere `null` is a wrong shape.

Enum values and types are the SDK's own `Literal`s and annotations. Keys
beyond the schema are allowed (OpenAI's practice for vendor fields).
`tests/http/test_schema.py` checks that every rule names a real field and
that broken payloads fail.

    validate(name, instance)        raise jsonschema.ValidationError (the most relevant one)
    errors(name, instance)          every message, [] when valid, for readable assertions
    validator_with(name, edit)      a validator on a copy of the $defs changed by `edit`
                                    (to isolate one known gap and check the rest)
    load_defs()                     the $defs: every model by its title, and each name of NAMES
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from functools import cache
from typing import Any, Literal

import jsonschema
import pydantic
from openai.types import CompletionUsage, Model
from openai.types.chat import ChatCompletion, ChatCompletionChunk, ChatCompletionMessage
from openai.types.chat import chat_completion as nonstream
from openai.types.chat import chat_completion_chunk as chunk
from openai.types.chat.chat_completion_token_logprob import ChatCompletionTokenLogprob, TopLogprob
from openai.types.shared import ErrorObject
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue
from pydantic_core import core_schema


class ListModelsResponse(pydantic.BaseModel):
    """GET /v1/models (the SDK pages through it and has no model for the page)."""

    model_config = pydantic.ConfigDict(extra="allow")
    object: Literal["list"]
    data: list[Model]


class ErrorResponse(pydantic.BaseModel):
    """Every error body (the SDK reads `error` from the raw JSON)."""

    model_config = pydantic.ConfigDict(extra="allow")
    error: ErrorObject


# The names the tests use (OpenAI's component names) and the model each one is.
NAMES: dict[str, type[pydantic.BaseModel]] = {
    "CreateChatCompletionStreamResponse": ChatCompletionChunk,
    "CreateChatCompletionResponse": ChatCompletion,
    "ChatCompletionResponseMessage": ChatCompletionMessage,
    "CompletionUsage": CompletionUsage,
    "ListModelsResponse": ListModelsResponse,
    "Model": Model,
    "ErrorResponse": ErrorResponse,
    "Error": ErrorObject,
}

# Keys OpenAI's API reference requires that the SDK's model leaves optional.
REQUIRED: dict[type[pydantic.BaseModel], frozenset[str]] = {
    chunk.Choice: frozenset({"finish_reason"}),
    chunk.ChoiceLogprobs: frozenset({"content", "refusal"}),
    nonstream.Choice: frozenset({"logprobs"}),
    nonstream.ChoiceLogprobs: frozenset({"content", "refusal"}),
    ChatCompletionMessage: frozenset({"content", "refusal"}),
    ChatCompletionTokenLogprob: frozenset({"bytes"}),
    TopLogprob: frozenset({"bytes"}),
    ErrorObject: frozenset({"param", "code"}),
}

# Keys whose value may be null (`nullable: true` in the API reference) although the SDK does not require them.
NULLABLE: dict[type[pydantic.BaseModel], frozenset[str]] = {
    ChatCompletionChunk: frozenset({"usage", "service_tier", "moderation"}),
    chunk.Choice: frozenset({"finish_reason", "logprobs"}),
    chunk.ChoiceDelta: frozenset({"content", "refusal"}),
    chunk.ChoiceLogprobs: frozenset({"content", "refusal"}),
    ChatCompletion: frozenset({"service_tier", "moderation", "metadata"}),
    nonstream.Choice: frozenset({"logprobs"}),
    nonstream.ChoiceLogprobs: frozenset({"content", "refusal"}),
    ChatCompletionMessage: frozenset({"content", "refusal", "audio"}),
    ChatCompletionTokenLogprob: frozenset({"bytes"}),
    TopLogprob: frozenset({"bytes"}),
    Model: frozenset({"shutdown_date"}),
    ErrorObject: frozenset({"param", "code"}),
}


def _without_null(prop: dict[str, Any]) -> dict[str, Any]:
    """`prop` with its `{"type": "null"}` alternative (and a `null` default) removed."""
    alternatives = [a for a in prop.get("anyOf", ()) if a != {"type": "null"}]
    if "anyOf" not in prop or len(alternatives) == len(prop["anyOf"]):
        return prop
    rest = {k: v for k, v in prop.items() if k not in ("anyOf", "default")}
    return {**rest, **alternatives[0]} if len(alternatives) == 1 else {**rest, "anyOf": alternatives}


class _Strict(GenerateJsonSchema):
    """pydantic's generator, with REQUIRED added and null kept only where the SDK requires the key or NULLABLE lists it."""

    def model_schema(self, schema: core_schema.ModelSchema) -> JsonSchemaValue:
        json_schema = super().model_schema(schema)
        cls = schema["cls"]
        props: dict[str, Any] = json_schema.get("properties", {})
        sdk_required = set(json_schema.get("required", ()))
        required = sdk_required | REQUIRED.get(cls, frozenset())
        for key, prop in list(props.items()):
            if key not in sdk_required and key not in NULLABLE.get(cls, frozenset()):
                props[key] = _without_null(prop)
        if required:
            json_schema["required"] = sorted(required)
        return json_schema


@cache
def load_defs() -> dict[str, Any]:
    """Every model's schema under its title, and each of NAMES as a `$ref` to its model."""
    refs, document = pydantic.json_schema.models_json_schema(
        [(model, "validation") for model in NAMES.values()], ref_template="#/$defs/{model}", schema_generator=_Strict
    )
    defs: dict[str, Any] = document["$defs"]
    for name, model in NAMES.items():
        ref = refs[(model, "validation")]
        if ref["$ref"] != f"#/$defs/{name}":
            defs.setdefault(name, ref)
    return defs


def schema_for(name: str, defs: dict[str, Any]) -> dict[str, Any]:
    if name not in defs:
        raise KeyError(f"no schema {name!r} (tests/support/openai_schema.py NAMES)")
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "$defs": defs, "$ref": f"#/$defs/{name}"}


@cache
def validator(name: str) -> jsonschema.protocols.Validator:
    schema = schema_for(name, load_defs())
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def validate(name: str, instance: Any) -> None:
    """Raise `jsonschema.ValidationError` (the most relevant one) unless `instance` fits `name`."""
    error = jsonschema.exceptions.best_match(validator(name).iter_errors(instance))
    if error is not None:
        raise error


def errors(name: str, instance: Any) -> list[str]:
    """All validation messages (empty when valid), each as `path: message`."""
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator(name).iter_errors(instance)]


def validator_with(name: str, edit: Callable[[dict[str, Any]], None]) -> jsonschema.protocols.Validator:
    """A validator for `name` on a deep copy of the $defs changed by `edit`."""
    defs = copy.deepcopy(load_defs())
    edit(defs)
    schema = schema_for(name, defs)
    return jsonschema.validators.validator_for(schema)(schema)
