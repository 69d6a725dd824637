"""GET /openapi.json: an OpenAPI 3.1 description of every route, generated from the wire structs.

The schemas are msgspec's (`schema_components` over the Structs the routes decode and encode), so they
say what the decoders accept; one `Operation` per route adds the path metadata and its API's error
envelope. Streams are described in words. Built once, on the first request;
tests/http/test_openapi.py checks it lists exactly the registered routes. `build_document` serves the
gateway's table too (gateway/openapi.py).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any

import msgspec
from aiohttp import web

from streamproxy.apis.anthropic import protocol as anthropic
from streamproxy.apis.responses import protocol as responses
from streamproxy.errors import ErrorEnvelope
from streamproxy.http.state import VERSION
from streamproxy.protocol import embeddings, lora, openai_chat, openai_completions, render, tokenize
from streamproxy.protocol.common import HealthStatus, ModelCard, ModelList, VersionInfo

SSE = "text/event-stream"
METRICS = "text/plain; version=0.0.4; charset=utf-8"
REF = "#/components/schemas/{name}"


@dataclass(frozen=True, slots=True)
class ErrorStatus:
    """An error status a route documents on its own (the others fall under 4XX/5XX)."""

    status: int
    description: str
    retry_after: bool = False  # sent with a Retry-After header


@dataclass(frozen=True, slots=True)
class QueryParam:
    """A query-string parameter of a GET route (none is required)."""

    name: str
    description: str
    schema: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Operation:
    method: str
    path: str
    summary: str
    request: type | None = None  # the JSON body's Struct
    response: type | None = None  # a 200's JSON body's Struct
    media: str | None = None  # a 200's media type when its body is not a Struct's JSON
    stream: str | None = None  # what a `"stream": true` request gets as text/event-stream
    errors: type = ErrorEnvelope
    tag: str = "OpenAI"
    also: tuple[int, ...] = ()  # statuses other than 200 and the errors, with the 200's body
    statuses: tuple[ErrorStatus, ...] = ()  # error statuses described one by one
    array: bool = False  # a 200's JSON body is a list of `response`
    query: tuple[QueryParam, ...] = ()  # the query string's parameters


_CHUNKS = "`data:` frames of `chat.completion.chunk` objects, an optional usage chunk, then `data: [DONE]`"
OPERATIONS: tuple[Operation, ...] = (
    Operation("post", "/v1/chat/completions", "Create a chat completion", openai_chat.ChatCompletionRequest,
              openai_chat.ChatCompletion, stream=_CHUNKS),
    Operation("post", "/v1/completions", "Create a (legacy) text completion", openai_completions.CompletionRequest,
              openai_completions.Completion, stream=_CHUNKS.replace("chat.completion.chunk", "text_completion")),
    Operation("post", "/v1/embeddings", "Create embeddings (embedding models only)", embeddings.EmbeddingRequest,
              embeddings.EmbeddingList),
    Operation("post", "/v1/responses", "Create a model response (Responses API)", responses.ResponsesRequest,
              responses.Response, stream="named events (`event: response.created` ... `response.completed`), as OpenAI's Responses API"),
    Operation("get", "/v1/responses/{response_id}", "Retrieve a response kept by the server's response store "
              "(--responses-store): a background one as it stands (queued, in_progress, then final)",
              response=responses.Response,
              stream="(query `stream=true`, a response created with `background` and `stream`) its named events from "
              "sequence number `starting_after` + 1, following it to the end, as vLLM",
              query=(QueryParam("stream", "true: stream the events of a background streamed response", {"type": "boolean"}),
                     QueryParam("starting_after", "with stream: resume after this sequence number", {"type": "integer"}))),
    Operation("post", "/v1/responses/{response_id}/cancel", "Cancel a running background response (its engine request is "
              "aborted; it is then `cancelled`); a finished response is vLLM's 400", response=responses.Response),
    Operation("post", "/v1/messages", "Create a message (Anthropic Messages API)", anthropic.MessagesRequest, anthropic.Message,
              stream="named events (`event: message_start` ... `message_stop`), as Anthropic's Messages API",
              errors=anthropic.ErrorEnvelope, tag="Anthropic"),
    Operation("post", "/v1/messages/count_tokens", "Count a message's input tokens (Anthropic Messages API)",
              anthropic.CountTokensRequest, anthropic.TokenCount, errors=anthropic.ErrorEnvelope, tag="Anthropic"),
    Operation("post", "/v1/chat/completions/render", "The prompt's token ids and sampling parameters a chat completion "
              "would generate from, without generating (vLLM)", openai_chat.ChatCompletionRequest, render.RenderedRequest, tag="vLLM"),
    Operation("post", "/v1/completions/render", "The prompts' token ids and sampling parameters a completion would "
              "generate from, one per prompt, without generating (vLLM)", openai_completions.CompletionRequest,
              render.RenderedRequest, tag="vLLM", array=True),
    Operation("get", "/v1/models", "List the served models", response=ModelList),
    Operation("get", "/v1/models/{model_id}", "Retrieve a served model", response=ModelCard),
    *(
        op
        for prefix in ("", "/v1")
        for op in (
            Operation("post", prefix + "/tokenize", "Tokenize a prompt or chat messages (vLLM)", tokenize.TokenizeRequest,
                      tokenize.TokenizeResponse, tag="vLLM"),
            Operation("post", prefix + "/detokenize", "Detokenize token ids (vLLM)", tokenize.DetokenizeRequest,
                      tokenize.DetokenizeResponse, tag="vLLM"),
        )
    ),
    Operation("get", "/health", "Readiness: 200 once the engine is ready, 503 while it loads or after it died",
              response=HealthStatus, tag="Server", also=(503,)),
    *(
        Operation(method, "/ping", "Readiness as vLLM's SageMaker route answers it: 200 (empty) once the engine is "
                  "ready, 503 while it loads or after it died", media="text/plain", tag="vLLM", also=(503,))
        for method in ("get", "post")
    ),
    Operation("post", "/invocations", "SageMaker's inference route (vLLM): a body with `messages` is a chat completion, "
              "with `prompt` a completion, with `input` an embedding (embedding models)", media="application/json",
              stream="as the route the body is dispatched to", tag="vLLM"),
    Operation("get", "/load", "Generation requests in flight (with --enable-server-load-tracking; else 0) (vLLM)",
              response=render.ServerLoad, tag="vLLM"),
    Operation("get", "/version", "The server's version", response=VersionInfo, tag="Server"),
    Operation("get", "/metrics", "Prometheus metrics (vLLM's and the server's)", media=METRICS, tag="Server"),
    Operation("get", "/openapi.json", "This document", media="application/json", tag="Server"),
)
# Only with VLLM_ALLOW_RUNTIME_LORA_UPDATING (routes/lora.py), as in vLLM.
LORA_OPERATIONS: tuple[Operation, ...] = (
    Operation("post", "/v1/load_lora_adapter", "Load a LoRA adapter, served as a model of its own (vLLM)",
              lora.LoadLoRAAdapterRequest, media="text/plain", tag="vLLM"),
    Operation("post", "/v1/unload_lora_adapter", "Stop serving a LoRA adapter (vLLM)", lora.UnloadLoRAAdapterRequest,
              media="text/plain", tag="vLLM"),
)

# Only with --enable-tokenizer-info-endpoint, as in vLLM.
TOKENIZER_INFO_OPERATIONS: tuple[Operation, ...] = (
    Operation("get", "/tokenizer_info", "The tokenizer's configuration and class, and --chat-template (vLLM)",
              media="application/json", tag="vLLM"),
)

# Path parameters, by name: what they are.
PARAMETERS = {"model_id": "A served model's name", "response_id": "A response's id (resp_...)"}


def _types(operations: Iterable[Operation]) -> list[type]:
    return sorted(
        {t for op in operations for t in (op.request, op.response, op.errors) if t is not None},
        key=lambda t: (t.__module__, t.__qualname__),
    )


def _json_content(schema: dict[str, Any]) -> dict[str, Any]:
    return {"application/json": {"schema": schema}}


_RETRY_AFTER = {"Retry-After": {"description": "Seconds to wait before retrying", "schema": {"type": "integer", "minimum": 0}}}


def _operation(op: Operation, refs: dict[type, dict[str, Any]], parameters: Mapping[str, str]) -> dict[str, Any]:
    if op.response is not None:
        content = _json_content({"type": "array", "items": refs[op.response]} if op.array else refs[op.response])
    else:
        content = {(op.media or "application/json").split(";")[0]: {"schema": {"type": "object"} if op.media == "application/json" else {"type": "string"}}}
    ok: dict[str, Any] = {"description": "OK", "content": content}
    if op.stream:
        ok["description"] = f"A JSON body; with `\"stream\": true` a Server-Sent-Events stream: {op.stream}"
        ok["content"] = {**content, SSE: {"schema": {"type": "string"}}}
    error = _json_content(refs[op.errors])
    errors = {"description": "An error, in this API's error shape", "content": error}
    responses: dict[str, Any] = {"200": ok, **{str(s): {"description": "Not ready", "content": content} for s in op.also}}
    for e in op.statuses:
        responses[str(e.status)] = {"description": e.description, "content": error, **({"headers": _RETRY_AFTER} if e.retry_after else {})}
    out: dict[str, Any] = {
        "operationId": op.method + op.path.replace("/", "_").replace("{", "").replace("}", "").replace(".", "_"),
        "summary": op.summary,
        "tags": [op.tag],
        "responses": {**responses, "4XX": errors, "5XX": errors},
    }
    names = re.findall(r"\{(\w+)\}", op.path)
    if names:
        out["parameters"] = [
            {"name": n, "in": "path", "required": True, "description": parameters[n], "schema": {"type": "string"}} for n in names
        ]
    if op.query:
        out.setdefault("parameters", []).extend(
            {"name": q.name, "in": "query", "required": False, "description": q.description, "schema": dict(q.schema)}
            for q in op.query
        )
    if op.request is not None:
        out["requestBody"] = {"required": True, "content": _json_content(refs[op.request])}
    return out


def build_document(
    operations: Iterable[Operation], *, title: str, description: str, key_note: str, parameters: Mapping[str, str] = PARAMETERS
) -> dict[str, Any]:
    """An OpenAPI 3.1 document of `operations`, their JSON Schemas as msgspec writes them;
    `key_note`: when the API key applies."""
    operations = tuple(operations)
    types = _types(operations)
    schemas, components = msgspec.json.schema_components(types, ref_template=REF)
    refs = dict(zip(types, schemas))
    paths: dict[str, dict[str, Any]] = {}
    for op in operations:
        paths.setdefault(op.path, {})[op.method] = _operation(op, refs, parameters)
    return {
        "openapi": "3.1.0",
        "info": {"title": title, "version": VERSION, "description": description},
        "paths": paths,
        "components": {
            "schemas": components,
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer", "description": key_note},
                "apiKey": {"type": "apiKey", "in": "header", "name": "x-api-key", "description": key_note},
            },
        },
        # No key at all (a server without keys), or either form of the key.
        "security": [{}, {"bearer": []}, {"apiKey": []}],
    }


def build(lora_routes: bool = False, tokenizer_info: bool = False) -> dict[str, Any]:
    """serve's OpenAPI document as a dict (a fresh one on every call; `document()` caches the bytes)."""
    return build_document(
        OPERATIONS + (LORA_OPERATIONS if lora_routes else ()) + (TOKENIZER_INFO_OPERATIONS if tokenizer_info else ()),
        title="streamproxy",
        description="OpenAI-compatible (and Anthropic Messages) streaming server. Request bodies ignore unknown fields.",
        key_note="Only when the server runs with --api-key",
    )


@cache
def document(lora_routes: bool = False, tokenizer_info: bool = False) -> bytes:
    return msgspec.json.encode(build(lora_routes, tokenizer_info))


# Set by routes.add_routes when it adds the run-time LoRA routes.
LORA_ROUTES_KEY: web.AppKey[bool] = web.AppKey("lora_routes", bool)
TOKENIZER_INFO_KEY: web.AppKey[bool] = web.AppKey("tokenizer_info", bool)


async def openapi_json(request: web.Request) -> web.Response:
    app = request.app
    body = document(app.get(LORA_ROUTES_KEY, False), app.get(TOKENIZER_INFO_KEY, False))
    return web.Response(body=body, content_type="application/json")
