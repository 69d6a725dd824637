"""Thin handlers per endpoint: decode -> admit -> generate -> stream -> write."""

from __future__ import annotations

import logging

from aiohttp import web

from streamproxy.apis.anthropic import errors as anthropic_errors
from streamproxy.http import error_shapes
from streamproxy.http.metrics import metrics
from streamproxy.http.openapi import LORA_ROUTES_KEY, openapi_json
from streamproxy.http.routes.anthropic import count_tokens, messages
from streamproxy.http.routes.chat import chat_completions
from streamproxy.http.routes.completions import completions
from streamproxy.http.routes.embeddings import embeddings
from streamproxy.http.routes.lora import load_lora_adapter, runtime_updates_allowed, unload_lora_adapter
from streamproxy.http.routes.models import get_model, health, list_models, version
from streamproxy.http.routes.responses import responses
from streamproxy.http.routes.tokens import detokenize, tokenize

log = logging.getLogger("streamproxy")


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/embeddings", embeddings)
    app.router.add_post("/v1/responses", responses)
    for path, handler in (("/v1/messages", messages), ("/v1/messages/count_tokens", count_tokens)):
        error_shapes.register(app, app.router.add_post(path, handler), anthropic_errors.error_json)
    app.router.add_get("/v1/models", list_models)
    app.router.add_get("/v1/models/{model_id:.+}", get_model)
    app.router.add_get("/health", health)
    app.router.add_get("/version", version)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/openapi.json", openapi_json)  # its route table: http/openapi.py
    for prefix in ("", "/v1"):
        app.router.add_post(prefix + "/tokenize", tokenize)
        app.router.add_post(prefix + "/detokenize", detokenize)
    if runtime_updates_allowed():
        log.warning("VLLM_ALLOW_RUNTIME_LORA_UPDATING: POST /v1/load_lora_adapter and /v1/unload_lora_adapter are on "
                    "(vLLM: 'This should ONLY be used for local development!')")
        app.router.add_post("/v1/load_lora_adapter", load_lora_adapter)
        app.router.add_post("/v1/unload_lora_adapter", unload_lora_adapter)
        app[LORA_ROUTES_KEY] = True
