"""The shared tail of every generating route: admit -> submit -> stream or collect -> abort.

A route decodes its own request shape and builds the prompt and params; from
there this module runs the same life cycle for all of them:

    ticket = admission.enter()              429 at once when over capacity
    stream:   headers out (submitting first when a slot is free, so engine
              rejections are still HTTP 400s), keepalives while queued,
              pump_sse(out, encoder)
    else:     wait for a slot + submit + collect in one background task, and
              respond_nonstream (keepalive newlines if slow, request timeout)
    finally:  release the slot; if the engine is not done (disconnect, error,
              timeout, write stall) -> abort

so there is exactly one place where an engine request can be left behind.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from aiohttp import web

from engine_adapter.base import Engine, EngineFailure, EngineRejected, GenerationParams, OutputStream

from ..accumulate import Accumulator
from ..admission import Ticket
from ..errors import APIError, InvalidRequest, ServiceUnavailable
from ..metrics import ACTIVE_STREAMS, ENGINE_ABORTS, HEARTBEATS
from ..state import AppState
from ..stream import StreamEncoder
from ..writer import SSE_HEADERS, collect, pump_sse, respond_nonstream, wait_with_heartbeat

log = logging.getLogger("streamproxy.generation")


class Generation:
    """One engine request: submit it, and abort it if it is left unfinished."""

    __slots__ = ("engine", "request_id", "prompt_ids", "params", "out")

    def __init__(self, engine: Engine, request_id: str, prompt_ids: list[int], params: GenerationParams) -> None:
        self.engine = engine
        self.request_id = request_id
        self.prompt_ids = prompt_ids
        self.params = params
        self.out: OutputStream | None = None

    async def submit(self) -> OutputStream:
        try:
            self.out = await self.engine.generate(self.request_id, self.prompt_ids, self.params)
        except APIError:
            raise
        except EngineFailure as exc:
            raise ServiceUnavailable(str(exc)) from exc
        except EngineRejected as exc:
            # The engine's own validation of sampling parameters.
            raise InvalidRequest(str(exc), param=exc.param) from exc
        return self.out

    async def abort_if_running(self) -> None:
        if self.out is None or self.out.finished:
            return
        ENGINE_ABORTS.inc()
        try:
            await self.engine.abort(self.request_id)
        except Exception:  # the engine may already be gone
            log.debug("abort of %s failed", self.request_id, exc_info=True)


async def run(
    request: web.Request,
    state: AppState,
    engine: Engine,
    *,
    prompt_ids: list[int],
    params: GenerationParams,
    stream: bool,
    encoder: Callable[[], StreamEncoder],
    render: Callable[[Accumulator], bytes],
) -> web.StreamResponse:
    gen = Generation(engine, request["request_id"], prompt_ids, params)
    ticket = state.admission.enter()
    work: asyncio.Task[bytes] | None = None
    try:
        if stream:
            return await _stream(request, state, gen, ticket, encoder())
        settings = state.settings

        async def finish() -> bytes:
            await ticket.wait()
            out = await gen.submit()
            acc = Accumulator(params.n)
            await collect(out, acc)
            return render(acc)

        work = asyncio.ensure_future(finish())
        return await respond_nonstream(
            request,
            work,
            keepalive_after=settings.nonstream_keepalive_after,
            keepalive_interval=settings.nonstream_keepalive_interval,
            request_timeout=settings.request_timeout,
            headers={},
        )
    finally:
        if work is not None and not work.done():
            work.cancel()
        ticket.release()
        await gen.abort_if_running()


async def _stream(
    request: web.Request, state: AppState, gen: Generation, ticket: Ticket, encoder: StreamEncoder
) -> web.StreamResponse:
    settings = state.settings
    out = await gen.submit() if ticket.granted else None
    response = web.StreamResponse(headers=SSE_HEADERS)
    ACTIVE_STREAMS.inc()
    try:
        await response.prepare(request)
        if out is None:
            # Queued: the headers are out, keep the connection warm until a slot frees.
            HEARTBEATS.inc(await wait_with_heartbeat(response, ticket.wait(), settings.sse_heartbeat))
            try:
                out = await gen.submit()
            except APIError as exc:
                await response.write(encoder.error(exc))
                await response.write_eof()
                return response
        outcome = request["outcome"] = await pump_sse(
            request,
            response,
            out,
            encoder,
            heartbeat=settings.sse_heartbeat,
            stall_timeout=settings.write_stall_timeout,
        )
        await response.write_eof()
    finally:
        ACTIVE_STREAMS.dec()
    if outcome.heartbeats:
        HEARTBEATS.inc(outcome.heartbeats)
    return response
