"""POST /v1/responses: decode -> plan (chat request -> prepare) -> generation.run with Responses events.

`convert_responses.to_chat` translates, `core.prepare` builds as for chat, and a `ResponsesEncoder`
renders (with `emit=False`, the non-stream sink whose `Response` is the body). With `--responses-store`
a finished response made with `store` (default true) is kept and `GET /v1/responses/{id}` answers it.
`background: true`, cancel and `?stream=true&starting_after=N` replays are background.py's.
A stream's `return_token_ids` and `continue_token_ids` are chat's (generation.blocks); its item and
call ids follow from its response's id (`seed_of`), so a continuation's equal the broken stream's.
"""

from __future__ import annotations

import time

from aiohttp import web

from streamproxy.apis.responses import convert as C
from streamproxy.apis.responses.protocol import (
    ReasoningEcho,
    Response,
    ResponsesRequest,
    TextEcho,
    TextFormat,
    decode_request,
    encode,
)
from streamproxy.apis.responses.stream import ResponsesEncoder
from streamproxy.core.blockstream import seed_of
from streamproxy.core.prepare import prepare, renamed
from streamproxy.errors import InvalidRequest
from streamproxy.http.context import CONTEXT
from streamproxy.http.routes import background, generation
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
    store = state.responses if state.responses.enabled and req.store is not False else None
    shell = _shell(req, "resp_" + request[CONTEXT].request_id, req.model or engine.info.name)
    shell.store = store is not None
    filters = prep.filters
    if req.background:
        if req.return_token_ids or req.continue_token_ids is not None:
            param = "return_token_ids" if req.return_token_ids else "continue_token_ids"
            raise InvalidRequest(f"'{param}' cannot be combined with 'background'", param=param)
        return await background.start(request, state, engine, prep, shell, store, bool(req.stream))
    engine_prompt, pieces = generation.block_continuation(req, prep.params, engine, prep.prompt_ids)
    work = generation.Work(engine, [engine_prompt], [prep.params], continued=len(req.continue_token_ids or ()))
    made: list[ResponsesEncoder] = []
    seed = seed_of(shell.id)

    def encoder(emit: bool) -> ResponsesEncoder:
        enc = ResponsesEncoder(shell, filters, emit=emit, id_seed=seed)
        if store is not None:
            made.append(enc)
        return enc

    answer = generation.blocks(encoder, ResponsesEncoder.final_json, req, prep.prompt_ids, pieces)
    try:
        return await generation.run(request, work, answer, bool(req.stream))
    finally:
        if store is not None and made and made[0].response().status != "in_progress":
            store.keep(shell.id, encode(made[0].response()))


async def get_response(request: web.Request) -> web.StreamResponse:
    store = app_state(request).responses
    response_id = request.match_info["response_id"]
    if request.query.get("stream", "").lower() == "true":
        entry = store.entry(response_id)
        if not isinstance(entry, background.Background) or entry.frames is None:
            raise InvalidRequest("only a response created with background and stream can be streamed; GET it without stream",
                                 param="stream")
        after = request.query.get("starting_after", "-1")
        try:
            start_at = int(after) + 1
        except ValueError:
            raise InvalidRequest(f"starting_after must be an integer, not {after!r}", param="starting_after") from None
        return await background.follow(request, entry, start_at)
    return web.Response(body=store.get(response_id), content_type="application/json")


async def cancel_response(request: web.Request) -> web.Response:
    store = app_state(request).responses
    response_id = request.match_info["response_id"]
    live = store.cancellable(response_id)
    assert isinstance(live, background.Background)
    await live.cancel()
    return web.Response(body=store.get(response_id), content_type="application/json")
