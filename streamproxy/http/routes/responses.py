"""POST /v1/responses: decode -> chat request -> prepare -> generation.run with Responses events.

`convert_responses.to_chat` translates the request, `core.prepare`
builds prompt, params and filter chain exactly as chat does, and
`generation.run` runs the shared life cycle. What differs from chat is only
the rendering: a `ResponsesEncoder` streams the Responses events, and the
same class (with `emit=False`) is the non-stream sink whose final `Response`
is the body. Errors keep the OpenAI shape (the default).

With the server's response store on (`--responses-store`), a finished
response made with `store` (OpenAI's default: true) is kept as its final JSON,
and `GET /v1/responses/{id}` answers it.

`background: true` (vLLM's background mode; needs the store, and `store`):
the create enters admission (its 429s apply) and the store (at most N
running: 429), answers at once with the response `queued`, and a task of the
server runs `generation.run_detached` (not the connection's: a client that
leaves does not end it). GET shows it `queued`, then `in_progress` with the
output so far, then its final state. `POST /v1/responses/{id}/cancel` cancels
that task, which aborts the engine request, and answers the response
`cancelled` once nothing runs; for a finished response it is vLLM's 400, for
an id not kept its 404. A drain lets background responses finish until the
drain deadline and ends the rest then (`failed`, engine requests aborted);
shutdown cancels any left. `background` with `stream` is refused (a 400:
vLLM's resumable event replay is not built here).
"""

from __future__ import annotations

import asyncio
import logging
import time
from time import perf_counter

import msgspec
from aiohttp import web

from engine_adapter.base import Engine
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
from streamproxy.apis.responses.store import ResponseStore
from streamproxy.apis.responses.stream import ResponsesEncoder
from streamproxy.core.prepare import Prepared, prepare, renamed
from streamproxy.errors import APIError, InternalError, InvalidRequest
from streamproxy.http.accesslog import REQUEST_ID, Record
from streamproxy.http.admission import Ticket
from streamproxy.http.routes import generation
from streamproxy.http.routes.body import decode_body
from streamproxy.http.state import STATE_KEY, AppState, app_state

log = logging.getLogger("streamproxy.responses")

# vLLM's 400 for `background` when its store is off (VLLM_ENABLE_RESPONSES_API_STORE unset).
NO_STORE = (
    "This vLLM engine does not support `store=True` and therefore does not support the background mode. "
    "To enable these features, set the environment variable `VLLM_ENABLE_RESPONSES_API_STORE=1` when "
    "launching the vLLM server."
)


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
    shell = _shell(req, "resp_" + request[REQUEST_ID], req.model or engine.info.name)
    shell.store = store is not None
    filters = prep.filters
    if req.background:
        return _start_background(request, state, engine, prep, shell, store, bool(req.stream))
    made: list[ResponsesEncoder] = []

    def encoder(emit: bool) -> ResponsesEncoder:
        enc = ResponsesEncoder(shell, filters, emit=emit)
        if store is not None:
            made.append(enc)
        return enc

    try:
        return await generation.run_blocks(request, state, engine, prep, stream=bool(req.stream), make=encoder,
                                           render=ResponsesEncoder.final_json)
    finally:
        if store is not None and made and made[0].response().status != "in_progress":
            store.keep(shell.id, encode(made[0].response()))


class _Background:
    """One background response while it runs (the store's `Live` entry)."""

    __slots__ = ("shell", "enc", "status", "task")

    def __init__(self, shell: Response, enc: ResponsesEncoder) -> None:
        self.shell = shell
        self.enc = enc
        self.status = "queued"
        self.task: asyncio.Task[None] | None = None

    def snapshot(self) -> bytes:
        if self.status == "queued":
            return encode(msgspec.structs.replace(self.shell, status="queued"))
        return encode(self.enc.response())

    def started(self) -> None:
        self.status = "in_progress"
        self.enc.start()  # (emit=False: no bytes) its response() now shows the output so far

    async def cancel(self) -> None:
        """Cancel its task and wait until it ended (its engine request aborted)."""
        task = self.task
        assert task is not None
        task.cancel()
        await asyncio.wait([task])


def _start_background(
    request: web.Request, state: AppState, engine: Engine, prep: Prepared, shell: Response, store: ResponseStore | None,
    stream: bool,
) -> web.Response:
    if store is None:  # `store: false` with background is convert's 400; here the server keeps nothing
        raise InvalidRequest(NO_STORE, param="background")
    if stream:
        raise InvalidRequest(
            "background with stream is not supported here: create it without stream and poll GET /v1/responses/{id}",
            param="stream",
        )
    shell.background = True
    gen = generation.Generation(engine, state.claim_engine_id(request[REQUEST_ID]), prep.prompt_ids, prep.params)
    bg = _Background(shell, ResponsesEncoder(shell, prep.filters, emit=False))
    try:
        ticket = state.admission.enter(gen.weight)
        try:
            store.start(shell.id, bg)
        except APIError:
            ticket.release()
            raise
    except APIError:
        state.release_engine_id(gen.request_id)
        raise
    task = asyncio.get_running_loop().create_task(_run_background(state, store, bg, gen, ticket))
    bg.task = task
    state.background.add(task)
    task.add_done_callback(state.background.discard)
    return web.Response(body=bg.snapshot(), content_type="application/json")


async def _run_background(
    state: AppState, store: ResponseStore, bg: _Background, gen: generation.Generation, ticket: Ticket
) -> None:
    enc = bg.enc
    final: Response
    try:
        await generation.run_detached(state, gen, ticket, enc, Record(bg.shell.id, perf_counter()), bg.started)
        enc.finish()
        final = enc.response()
    except asyncio.CancelledError:  # a cancel (or shutdown): vLLM's `cancelled`, with the output so far
        enc.finish()
        final = msgspec.structs.replace(enc.response(), status="cancelled")
    except APIError as exc:
        enc.error(exc)
        final = enc.response()
    except Exception:
        log.exception("background response %s failed", bg.shell.id)
        enc.error(InternalError("the background response failed"))
        final = enc.response()
    store.keep(bg.shell.id, encode(final))


async def stop_background(app: web.Application) -> None:
    """on_shutdown: cancel the background responses still running (each aborts its engine request)."""
    tasks = list(app[STATE_KEY].background)
    for task in tasks:
        task.cancel()
    if tasks:
        await asyncio.wait(tasks)


async def get_response(request: web.Request) -> web.Response:
    if request.query.get("stream", "").lower() == "true":
        raise InvalidRequest("streaming a stored response is not supported (it is finished: GET it without stream)",
                             param="stream")
    body = app_state(request).responses.get(request.match_info["response_id"])
    return web.Response(body=body, content_type="application/json")


async def cancel_response(request: web.Request) -> web.Response:
    store = app_state(request).responses
    response_id = request.match_info["response_id"]
    live = store.cancellable(response_id)
    assert isinstance(live, _Background)
    await live.cancel()
    return web.Response(body=store.get(response_id), content_type="application/json")
