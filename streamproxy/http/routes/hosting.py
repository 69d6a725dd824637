"""vLLM's hosting routes: `/ping` (GET and POST), `POST /invocations`, `GET /load`.

`/ping` is `/health` under SageMaker's name: 200 with an empty body while serving, else 503.
`/invocations` dispatches by the body's shape as vLLM does: `messages` -> chat, any other object ->
completion (`{}` is its 400), on an embedding model `input` -> embedding; anything else is vLLM's 400
"Cannot find suitable handler". The body is read once (`body.PRELOADED`). `/load` is
`{"server_load": N}`: generation requests in flight with `--enable-server-load-tracking`, else 0.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import msgspec
from aiohttp import web

from streamproxy.errors import InvalidJSON, InvalidRequest
from streamproxy.http.routes.body import PRELOADED, read_body
from streamproxy.http.routes.chat import chat_completions
from streamproxy.http.routes.completions import completions
from streamproxy.http.routes.embeddings import embeddings
from streamproxy.http.state import app_state
from streamproxy.protocol.render import ServerLoad


async def ping(request: web.Request) -> web.Response:
    return web.Response(status=200 if app_state(request).engine.state == "ready" else 503, content_type="text/plain")


async def load(request: web.Request) -> web.Response:
    state = app_state(request)
    count = len(state.inflight) if state.settings.enable_server_load_tracking else 0
    return web.Response(body=msgspec.json.encode(ServerLoad(server_load=count)), content_type="application/json")


async def invocations(request: web.Request) -> web.StreamResponse:
    body = await read_body(request)
    try:
        shape = msgspec.json.decode(body)
    except msgspec.DecodeError as exc:
        raise InvalidJSON(f"JSON decode error: {exc}") from None
    state = app_state(request)
    pooling = state.engine.info.runner == "pooling"
    kinds = ["EmbeddingRequest"] if pooling else ["ChatCompletionRequest", "CompletionRequest"]
    if isinstance(shape, dict):
        handler: Callable[[web.Request], Awaitable[web.StreamResponse]] | None = None
        if pooling and "input" in shape:
            handler = embeddings
        elif not pooling and "messages" in shape:
            handler = chat_completions
        elif not pooling:
            handler = completions
        if handler is not None:
            request[PRELOADED] = body
            return await handler(request)
    raise InvalidRequest(f"Cannot find suitable handler for request. Expected one of: {kinds}")
