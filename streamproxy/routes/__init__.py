"""Thin handlers per endpoint: decode -> admit -> generate -> stream -> write."""

from __future__ import annotations

from aiohttp import web

from ..metrics import metrics
from .anthropic import count_tokens, messages
from .chat import chat_completions
from .completions import completions
from .embeddings import embeddings
from .models import get_model, health, list_models, version
from .responses import responses
from .tokens import detokenize, tokenize


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/embeddings", embeddings)
    app.router.add_post("/v1/responses", responses)
    app.router.add_post("/v1/messages", messages)
    app.router.add_post("/v1/messages/count_tokens", count_tokens)
    app.router.add_get("/v1/models", list_models)
    app.router.add_get("/v1/models/{model_id:.+}", get_model)
    app.router.add_get("/health", health)
    app.router.add_get("/version", version)
    app.router.add_get("/metrics", metrics)
    for prefix in ("", "/v1"):
        app.router.add_post(prefix + "/tokenize", tokenize)
        app.router.add_post(prefix + "/detokenize", detokenize)
