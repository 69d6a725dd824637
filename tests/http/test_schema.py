"""Responses and stream chunks against OpenAI's own JSON Schemas (shared/openai-spec)."""

from __future__ import annotations

import jsonschema
import pytest

from engine_adapter.fake import FakeScript
from tests.support import USER_HI, sse, validate
from tests.support.openai_schema import validator_with


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


def test_schema_helper_allows_null_where_nullable():
    # `usage` is `nullable: true` in the spec: null must validate after the rewrite.
    chunk = {"id": "x", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [], "usage": None}
    validate("CreateChatCompletionStreamResponse", chunk)


def _drop_refusal_requirement(defs: dict) -> None:
    defs["ChatCompletionResponseMessage"]["required"].remove("refusal")


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
    for method, path, body in [
        ("POST", "/v1/chat/completions", {"messages": []}),
        ("GET", "/v1/models/nope", None),
        ("GET", "/nowhere", None),
    ]:
        resp = await client.request(method, path, json=body)
        validate("ErrorResponse", await resp.json())
