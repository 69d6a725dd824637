"""POST /v1/responses: decode -> chat request -> prepare -> generation.run with Responses events.

`convert_responses.to_chat` translates the request, `core.prepare`
builds prompt, params and filter chain exactly as chat does, and
`generation.run` runs the shared life cycle. What differs from chat is only
the rendering: a `ResponsesEncoder` streams the Responses events, and the
same class (with `emit=False`) is the non-stream sink whose final `Response`
is the body. Errors keep the OpenAI shape (the default).
"""

from __future__ import annotations

import time

from aiohttp import web

from streamproxy.apis.responses import convert as C
from streamproxy.apis.responses.protocol import ReasoningEcho, Response, ResponsesRequest, TextEcho, TextFormat, decode_request
from streamproxy.apis.responses.stream import ResponsesEncoder
from streamproxy.core.prepare import prepare, renamed
from streamproxy.http.accesslog import REQUEST_ID
from streamproxy.http.routes import generation
from streamproxy.http.routes.body import decode_body
from streamproxy.http.state import app_state


def _shell(req: ResponsesRequest, response_id: str, model: str) -> Response:
    """Everything of the Response the request decides, echoed as OpenAI echoes it."""
    fmt = req.text.format if req.text is not None and req.text.format is not None else TextFormat(type="text")
    return Response(
        id=response_id,
        created_at=int(time.time()),
        status="in_progress",
        instructions=req.instructions,
        max_output_tokens=req.max_output_tokens,
        model=model,
        output=[],
        parallel_tool_calls=req.parallel_tool_calls is not False,
        reasoning=ReasoningEcho(effort=req.reasoning.effort, summary=req.reasoning.summary) if req.reasoning else ReasoningEcho(),
        temperature=req.temperature,
        text=TextEcho(format=fmt),
        tool_choice=req.tool_choice if req.tool_choice is not None else "auto",
        tools=req.tools or [],
        top_p=req.top_p,
        user=req.user,
        metadata=req.metadata or {},
    )


async def responses(request: web.Request) -> web.StreamResponse:
    state = app_state(request)
    req = await decode_body(request, decode_request)
    engine = state.require_engine(req.model)
    with renamed(C.CHAT_NAMES):
        chat = C.to_chat(req)
        prep = prepare(state.settings, engine, chat)
    prep.params.adapter = state.adapter(req.model)
    shell = _shell(req, "resp_" + request[REQUEST_ID], req.model or engine.info.name)
    filters = prep.filters

    def encoder(emit: bool) -> ResponsesEncoder:
        return ResponsesEncoder(shell, filters, emit=emit)

    return await generation.run_blocks(request, state, engine, prep, stream=bool(req.stream), make=encoder, render=ResponsesEncoder.final_json)
