"""Thin handlers per endpoint: decode -> admit -> generate -> stream -> write.

Every route is registered at its path and, with `--root-path P` (vLLM's flag:
a path-routing proxy in front), at `P` + its path too, so both the proxy's
forwarded paths and direct calls reach it. The routes of vLLM's server that
are not served answer a 404 saying so (`unsupported.py`).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from aiohttp import web

from streamproxy.apis.anthropic import errors as anthropic_errors
from streamproxy.http import error_shapes
from streamproxy.http.metrics import metrics
from streamproxy.http.openapi import LORA_ROUTES_KEY, TOKENIZER_INFO_KEY, openapi_json
from streamproxy.http.routes import unsupported
from streamproxy.http.routes.anthropic import count_tokens, messages
from streamproxy.http.routes.chat import chat_completions
from streamproxy.http.routes.completions import completions
from streamproxy.http.routes.embeddings import embeddings
from streamproxy.http.routes.hosting import invocations, load, ping
from streamproxy.http.routes.lora import load_lora_adapter, runtime_updates_allowed, unload_lora_adapter
from streamproxy.http.routes.models import get_model, health, list_models, version
from streamproxy.http.routes.render import render_chat, render_completion
from streamproxy.http.routes.responses import cancel_response, get_response, responses
from streamproxy.http.routes.tokens import detokenize, tokenize, tokenizer_info
from streamproxy.http.state import STATE_KEY

log = logging.getLogger("streamproxy")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def add_routes(app: web.Application) -> None:
    settings = app[STATE_KEY].settings
    prefixes = ("", settings.root_path) if settings.root_path else ("",)

    def add(method: str, path: str, handler: Handler, shape: bool = False) -> None:
        for prefix in prefixes:
            route = app.router.add_route(method, prefix + path, handler)
            if shape:
                error_shapes.register(app, route, anthropic_errors.error_json)

    add("POST", "/v1/chat/completions", chat_completions)
    add("POST", "/v1/completions", completions)
    add("POST", "/v1/embeddings", embeddings)
    add("POST", "/v1/responses", responses)
    add("GET", "/v1/responses/{response_id}", get_response)
    add("POST", "/v1/responses/{response_id}/cancel", cancel_response)
    add("POST", "/v1/messages", messages, shape=True)
    add("POST", "/v1/messages/count_tokens", count_tokens, shape=True)
    add("POST", "/v1/chat/completions/render", render_chat)
    add("POST", "/v1/completions/render", render_completion)
    add("GET", "/v1/models", list_models)
    add("GET", "/v1/models/{model_id:.+}", get_model)
    add("GET", "/health", health)
    add("GET", "/ping", ping)
    add("POST", "/ping", ping)
    add("POST", "/invocations", invocations)
    add("GET", "/load", load)
    add("GET", "/version", version)
    add("GET", "/metrics", metrics)
    if not settings.disable_fastapi_docs:
        add("GET", "/openapi.json", openapi_json)  # its route table: http/openapi.py
    for prefix in ("", "/v1"):
        add("POST", prefix + "/tokenize", tokenize)
        add("POST", prefix + "/detokenize", detokenize)
    if runtime_updates_allowed():
        log.warning("VLLM_ALLOW_RUNTIME_LORA_UPDATING: POST /v1/load_lora_adapter and /v1/unload_lora_adapter are on "
                    "(vLLM: 'This should ONLY be used for local development!')")
        add("POST", "/v1/load_lora_adapter", load_lora_adapter)
        add("POST", "/v1/unload_lora_adapter", unload_lora_adapter)
        app[LORA_ROUTES_KEY] = True
    if settings.enable_tokenizer_info_endpoint:
        add("GET", "/tokenizer_info", tokenizer_info)
        app[TOKENIZER_INFO_KEY] = True
    for method, path, why in unsupported.UNSUPPORTED:
        if path == "/tokenizer_info" and settings.enable_tokenizer_info_endpoint:
            continue
        add(method, path, unsupported.handler(method, path, why))
