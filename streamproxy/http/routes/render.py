"""`POST /v1/chat/completions/render` and `/v1/completions/render` (vLLM's): what a request
would generate from, without generating.

The request is prepared exactly as its generating route prepares it (chat
template, tools, sampling checks: the same 400s), and the answer is vLLM's
`GenerateRequest` shape: `request_id`, the prompt's `token_ids`, the
`sampling_params` the engine would get (ours, named as vLLM names them),
`model`, `stream` and `stream_options`. A completions request answers a list,
one entry per prompt (`cmpl-<id>-<i>` when there are several), as vLLM's.
Nothing reaches the engine but its tokenizer.
"""

from __future__ import annotations

from typing import Any

import msgspec
from aiohttp import web

from engine_adapter.base import GenerationParams
from streamproxy.core import completion as C
from streamproxy.core.prepare import prepare
from streamproxy.http.context import CONTEXT
from streamproxy.http.routes.body import decode_body
from streamproxy.http.state import app_state
from streamproxy.protocol import openai_chat, openai_completions
from streamproxy.protocol.render import RenderedRequest


def _entry(request_id: str, ids: list[int], params: GenerationParams, req: Any) -> RenderedRequest:
    sampling = msgspec.to_builtins(params)
    sampling.pop("adapter", None)
    sampling.pop("template_kwargs", None)
    return RenderedRequest(request_id, ids, sampling, req.model, bool(req.stream), req.stream_options if req.stream else None)


def _json(obj: object) -> web.Response:
    return web.Response(body=msgspec.json.encode(obj), content_type="application/json")


async def render_chat(request: web.Request) -> web.Response:
    state = app_state(request)
    req = await decode_body(request, openai_chat.decode_request)
    engine = state.require_engine(req.model)
    prep = prepare(state.settings, engine, req)
    return _json(_entry("chatcmpl-" + request[CONTEXT].request_id, prep.prompt_ids, prep.params, req))


async def render_completion(request: web.Request) -> web.Response:
    state = app_state(request)
    req = await decode_body(request, openai_completions.decode_request)
    engine = state.require_engine(req.model)
    plan = C.plan(engine, req, max_n=state.settings.max_n)
    base = "cmpl-" + request[CONTEXT].request_id
    many = len(plan.prompts) > 1
    return _json([
        _entry(f"{base}-{i}" if many else base, ids, params, req)
        for i, (ids, params) in enumerate(zip(plan.prompts, plan.params))
    ])
