"""Responses and stream chunks against OpenAI's shapes (tests/support/openai_schema.py: the SDK's models, made as strict as the API reference)."""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest

from engine_adapter.fake import FakeScript
from tests.support import USER_HI, sse, validate
from tests.support.openai_schema import NAMES, NULLABLE, REQUIRED, errors, load_defs, validator_with


def test_schema_helper_is_strict():
    # The helper itself must reject what the schema forbids (a validator that
    # accepts everything would make every test here pass).
    good = {
        "id": "x", "object": "chat.completion.chunk", "created": 1, "model": "m",
        "choices": [{"index": 0, "delta": {"content": "a"}, "logprobs": None, "finish_reason": None}],
    }
    validate("CreateChatCompletionStreamResponse", good)
    for bad in [
        {**good, "object": "chat.completion"},
        {**good, "created": "1"},
        {k: v for k, v in good.items() if k != "id"},
        {**good, "choices": [{"index": 0, "delta": {"content": "a"}, "finish_reason": "exploded"}]},
        {**good, "choices": [{"index": 0, "delta": {"content": 5}, "finish_reason": None}]},
    ]:
        with pytest.raises(jsonschema.ValidationError):
            validate("CreateChatCompletionStreamResponse", bad)


def test_schema_helper_requires_what_the_api_reference_requires():
    # The keys the SDK leaves optional and the API reference requires (REQUIRED), and null
    # only where the reference says `nullable`: a broken copy of a good payload must fail.
    good_chunk: dict[str, Any] = {
        "id": "x", "object": "chat.completion.chunk", "created": 1, "model": "m", "system_fingerprint": "fp",
        "choices": [{"index": 0, "delta": {"role": "assistant", "content": None}, "finish_reason": None,
                     "logprobs": {"content": [{"token": "a", "logprob": -0.5, "bytes": [97], "top_logprobs": []}], "refusal": None}}],
        "usage": None,
    }
    assert errors("CreateChatCompletionStreamResponse", good_chunk) == []
    choice = good_chunk["choices"][0]
    logprob = choice["logprobs"]["content"][0]
    for bad in [
        {**good_chunk, "choices": [{k: v for k, v in choice.items() if k != "finish_reason"}]},
        {**good_chunk, "choices": [{**choice, "delta": {"role": None}}]},
        {**good_chunk, "choices": [{**choice, "delta": {"tool_calls": None}}]},
        {**good_chunk, "choices": [{**choice, "delta": {"role": "robot"}}]},
        {**good_chunk, "choices": [{**choice, "logprobs": {"content": None}}]},
        {**good_chunk, "choices": [{**choice, "logprobs": {"content": [{k: v for k, v in logprob.items() if k != "bytes"}], "refusal": None}}]},
        {**good_chunk, "system_fingerprint": None},
        {**good_chunk, "usage": {"prompt_tokens": 1, "completion_tokens": 1}},
    ]:
        assert errors("CreateChatCompletionStreamResponse", bad), bad
    message = {"role": "assistant", "content": "hi", "refusal": None}
    good: dict[str, Any] = {"id": "x", "object": "chat.completion", "created": 1, "model": "m",
            "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}
    assert errors("CreateChatCompletionResponse", good) == []
    for bad in [
        {**good, "choices": [{"index": 0, "message": message, "finish_reason": "stop"}]},
        {**good, "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "logprobs": None, "finish_reason": "stop"}]},
        {**good, "choices": [{"index": 0, "message": {**message, "tool_calls": None}, "logprobs": None, "finish_reason": "stop"}]},
        {**good, "choices": [{"index": 0, "message": {**message, "role": "user"}, "logprobs": None, "finish_reason": "stop"}]},
        {**good, "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": None}]},
        {**good, "usage": None},
        {**good, "usage": {**good["usage"], "prompt_tokens_details": None}},
    ]:
        assert errors("CreateChatCompletionResponse", bad), bad
    error = {"message": "m", "type": "invalid_request_error", "param": None, "code": None}
    assert errors("ErrorResponse", {"error": error}) == []
    for bad_error in [{k: v for k, v in error.items() if k != key} for key in error] + [{**error, "message": None}]:
        assert errors("ErrorResponse", {"error": bad_error}), bad_error
    assert errors("ErrorResponse", error)
    models = {"object": "list", "data": [{"id": "m", "object": "model", "created": 1, "owned_by": "me"}]}
    assert errors("ListModelsResponse", models) == []
    assert errors("ListModelsResponse", {**models, "object": "models"})
    assert errors("ListModelsResponse", {"object": "list", "data": [{"id": "m", "object": "model", "created": 1}]})
    assert errors("Model", {"id": "m", "object": "model", "created": None, "owned_by": "me"})


def test_schema_rules_name_real_fields():
    # A misspelt key in REQUIRED or NULLABLE would quietly check nothing.
    for rules in (REQUIRED, NULLABLE):
        for model, keys in rules.items():
            assert keys <= set(model.model_fields), (model, keys - set(model.model_fields))
    defs = load_defs()
    assert set(NAMES) <= set(defs)


def test_schema_helper_allows_null_where_nullable():
    # `usage` is `nullable: true` in OpenAI's API reference (NULLABLE): null must validate.
    chunk = {"id": "x", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [], "usage": None}
    validate("CreateChatCompletionStreamResponse", chunk)


def _drop_refusal_requirement(defs: dict) -> None:
    defs["ChatCompletionMessage"]["required"].remove("refusal")


@pytest.mark.parametrize("n", [1, 2])
async def test_nonstream_schema_apart_from_refusal(serve, n):
    """Everything but the `refusal` gap (xfail below) matches CreateChatCompletionResponse."""
    client, _ = await serve(FakeScript(tokens=["Hel", "lo"]))
    resp = await client.post("/v1/chat/completions", json={"messages": USER_HI, "n": n})
    assert resp.status == 200
    data = await resp.json()
    validator_with("CreateChatCompletionResponse", _drop_refusal_requirement).validate(data)
    assert data["object"] == "chat.completion"
    assert len(data["choices"]) == n


async def test_nonstream_matches_schema(serve):
    # Fixed: ResponseMessage now always carries `"refusal": null`, which the schema requires.
    client, _ = await serve(FakeScript(tokens=["Hel", "lo"]))
    resp = await client.post("/v1/chat/completions", json={"messages": USER_HI})
    validate("CreateChatCompletionResponse", await resp.json())


@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"n": 2},
        {"stream_options": {"include_usage": True}},
        {"stream_options": {"include_usage": True, "continuous_usage_stats": True}},
        {"max_tokens": 2},
    ],
    ids=["plain", "n2", "usage", "continuous-usage", "length"],
)
async def test_stream_chunks_match_schema(serve, extra):
    client, _ = await serve(FakeScript(tokens=["Hel", "lo", " é"], token_delay=0.005))
    resp = await client.post("/v1/chat/completions", json={"messages": USER_HI, "stream": True, **extra})
    payloads = sse.payloads(await resp.read())
    assert len(payloads) >= 4
    for chunk in payloads:
        validate("CreateChatCompletionStreamResponse", chunk)


async def test_error_bodies_match_schema(serve):
    client, _ = await serve()
    requests: list[tuple[str, str, dict[str, Any] | None]] = [
        ("POST", "/v1/chat/completions", {"messages": []}),
        ("GET", "/v1/models/nope", None),
        ("GET", "/nowhere", None),
    ]
    for method, path, body in requests:
        resp = await client.request(method, path, json=body)
        validate("ErrorResponse", await resp.json())
