"""The shared tail of every generating route: submit -> stream or collect -> abort.

A route decodes its own request shape and builds the prompt and params; from
there this module runs the same life cycle for all of them:

    out = await engine.generate(...)        engine errors here are 400/503
    stream:   prepare SSE response, pump_sse(out, encoder)
    else:     collect(out, accumulator) in the background, respond_nonstream
    finally:  if the engine is not done (disconnect, error, timeout) -> abort

so there is exactly one place where an engine request can be left behind.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from aiohttp import web

from engine_adapter.base import Engine, EngineFailure, EngineRejected, GenerationParams, OutputStream

from ..accumulate import Accumulator
from ..errors import APIError, InvalidRequest, ServiceUnavailable
from ..metrics import ACTIVE_STREAMS, ENGINE_ABORTS, HEARTBEATS
from ..state import AppState
from ..stream import StreamEncoder
from ..writer import SSE_HEADERS, collect, pump_sse, respond_nonstream

log = logging.getLogger("streamproxy.generation")


async def submit(engine: Engine, request_id: str, prompt_ids: list[int], params: GenerationParams) -> OutputStream:
    try:
        return await engine.generate(request_id, prompt_ids, params)
    except APIError:
        raise
    except EngineFailure as exc:
        raise ServiceUnavailable(str(exc)) from exc
    except EngineRejected as exc:
        # The engine's own validation of sampling parameters.
        raise InvalidRequest(str(exc), param=exc.param) from exc


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
    request_id: str = request["request_id"]
    settings = state.settings
    out = await submit(engine, request_id, prompt_ids, params)
    work: asyncio.Task[bytes] | None = None
    try:
        if stream:
            response = web.StreamResponse(headers=SSE_HEADERS)
            ACTIVE_STREAMS.inc()
            try:
                await response.prepare(request)
                outcome = request["outcome"] = await pump_sse(
                    request,
                    response,
                    out,
                    encoder(),
                    heartbeat=settings.sse_heartbeat,
                    stall_timeout=settings.write_stall_timeout,
                )
                await response.write_eof()
            finally:
                ACTIVE_STREAMS.dec()
            if outcome.heartbeats:
                HEARTBEATS.inc(outcome.heartbeats)
            return response

        acc = Accumulator(params.n)

        async def finish() -> bytes:
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
        if not out.finished:
            ENGINE_ABORTS.inc()
            try:
                await engine.abort(request_id)
            except Exception:  # the engine may already be gone
                log.debug("abort of %s failed", request_id, exc_info=True)
