"""The shared tail of every generating route: admit -> submit -> stream or collect -> abort.

A route decodes its own request shape and builds the prompt and params; from
there this module runs the same life cycle for all of them:

    ticket = admission.enter()              429 at once when over capacity
    stream:   headers out (submitting first when a slot is free, so engine
              rejections are still HTTP 400s), the encoder's keepalives while
              queued (at most --request-timeout), pump_sse(out, encoder)
    else:     wait for a slot + submit + collect in one background task, and
              respond_nonstream (keepalive newlines if slow, request timeout;
              an error after the early 200 in the route's error shape)
    finally:  release the slot; if the engine is not done (disconnect, error,
              timeout, write stall, drain) -> abort

so there is exactly one place where an engine request can be left behind.
Each request runs inside a `Lifetime` (drain.py): a drain deadline ends a
stream with an in-band `server_shutting_down` event, a request timeout ends
a non-streaming request with `generation_timeout`. Whatever happened goes
into the request's access-log record.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from functools import partial
from typing import TypeVar

from aiohttp import web

from engine_adapter.base import Engine, EngineFailure, EngineRejected, GenerationParams, OutputStream
from streamproxy.core.accumulate import Accumulator
from streamproxy.core.blockstream import BlockEncoder
from streamproxy.core.prepare import Prepared
from streamproxy.core.stream import StreamEncoder
from streamproxy.errors import APIError, GenerationTimeout, InvalidRequest, QueueTimeout, ServiceUnavailable
from streamproxy.http.accesslog import Record, record
from streamproxy.http.admission import Ticket
from streamproxy.http.metrics import ACTIVE_STREAMS, ENGINE_ABORTS
from streamproxy.http.nonstream import answer_nonstream, collect
from streamproxy.http.state import AppState, engine_dead
from streamproxy.http.writer import (
    SSE_HEADERS,
    SSEResponse,
    StreamOutcome,
    WriteStalled,
    client_gone,
    finish_response,
    pump_sse,
    wait_with_heartbeat,
    write,
)

log = logging.getLogger("streamproxy.generation")

# The route's non-stream sink: what its `accumulator` makes, its `render` reads.
A = TypeVar("A", bound=Accumulator)


class Generation:
    """One engine request: submit it, and abort it if it is left unfinished."""

    __slots__ = ("engine", "request_id", "prompt_ids", "params", "out")

    def __init__(self, engine: Engine, request_id: str, prompt_ids: list[int], params: GenerationParams) -> None:
        self.engine = engine
        self.request_id = request_id
        self.prompt_ids: list[int] | None = prompt_ids
        self.params = params
        self.out: OutputStream | None = None

    async def submit(self) -> OutputStream:
        prompt_ids, self.prompt_ids = self.prompt_ids, None  # the engine's now: not kept for the stream's life
        assert prompt_ids is not None, "a generation is submitted once"
        try:
            self.out = await self.engine.generate(self.request_id, prompt_ids, self.params)
        except APIError:
            raise
        except EngineFailure as exc:
            if self.engine.state == "dead":
                raise engine_dead() from exc
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
    render: Callable[[A], bytes],
    accumulator: Callable[[], A],
) -> web.StreamResponse:
    rec = record(request)
    rec.generation = True
    rec.stream = stream
    gen = Generation(engine, state.claim_engine_id(request["request_id"]), prompt_ids, params)
    del prompt_ids  # `gen` hands them to the engine; this frame lives as long as the stream
    ticket = state.admission.enter()
    work: asyncio.Task[bytes] | None = None
    try:
        if stream:
            return await _stream(request, state, gen, ticket, encoder(), rec)
        settings = state.settings
        acc = accumulator()
        work = asyncio.ensure_future(_finish(gen, ticket, acc, rec, render))
        try:
            life = state.inflight.lifetime(settings.request_timeout, partial(_timed_out, ticket, settings.request_timeout))
            return await answer_nonstream(request, work, settings, life, rec)
        finally:
            rec.usage(acc.prompt_tokens, acc.completion_tokens, acc.cached_tokens, acc.finish_reasons)
    finally:
        if work is not None and not work.done():
            work.cancel()
        ticket.release()
        try:
            await gen.abort_if_running()
        finally:
            state.release_engine_id(gen.request_id)


B = TypeVar("B", bound=BlockEncoder)


async def run_blocks(
    request: web.Request, state: AppState, engine: Engine, prep: Prepared, *, stream: bool, make: Callable[[bool], B], render: Callable[[B], bytes]
) -> web.StreamResponse:
    """`run` for the APIs whose one encoder class (`make(emit)`) is both the stream's
    encoder (emit=True) and the non-stream answer's sink (emit=False): Responses, Anthropic."""
    return await run(
        request, state, engine, prompt_ids=prep.prompt_ids, params=prep.params, stream=stream,
        encoder=partial(make, True), render=render, accumulator=partial(make, False),
    )


# The non-streaming path's pieces are module functions, not closures in `run`:
# a closure's cells would be made for every request, a stream's included, and
# kept as long as it runs.
async def _finish(gen: Generation, ticket: Ticket, acc: A, rec: Record, render: Callable[[A], bytes]) -> bytes:
    await ticket.wait()
    out = await gen.submit()
    await collect(out, acc, rec)
    return render(acc)


def _timed_out(ticket: Ticket, timeout: float) -> APIError:
    limit = f"{timeout:g} seconds"
    if not ticket.granted:
        return QueueTimeout(f"no generation slot became free within {limit}; retry later")
    return GenerationTimeout(f"generation did not finish within {limit}")


async def _stream(
    request: web.Request, state: AppState, gen: Generation, ticket: Ticket, encoder: StreamEncoder, rec: Record
) -> web.StreamResponse:
    settings = state.settings
    heartbeat, stall = settings.sse_heartbeat, settings.write_stall_timeout
    out = await gen.submit() if ticket.granted else None
    # Admitted at once: the headers leave with the first frame. Queued: now.
    response = SSEResponse(headers=SSE_HEADERS) if out is not None else web.StreamResponse(headers=SSE_HEADERS)
    transport = request.transport
    outcome = StreamOutcome()
    life = state.inflight.lifetime()
    ACTIVE_STREAMS.inc()
    try:
        try:
            async with life:
                await response.prepare(request)
                if out is None:
                    # Queued: the headers are out, keep the connection warm until a slot frees.
                    out = await _wait_for_slot(
                        response, transport, gen, ticket, outcome, settings.request_timeout, heartbeat, stall, encoder.keepalive
                    )
                await pump_sse(
                    request, response, out, encoder, heartbeat=heartbeat, stall_timeout=stall, outcome=outcome, record=rec,
                    push=settings.stream_push,
                )
        except TimeoutError:
            if not life.expired:
                raise
            reason = life.reason
            assert reason is not None
            if not response.prepared:
                raise reason from None
            outcome.error = reason
            await write(response, transport, encoder.error(reason), stall)
        except APIError as exc:
            # After the headers (a queued request's submit, or its wait timed out).
            outcome.error = exc
            await write(response, transport, encoder.error(exc), stall)
        await finish_response(response, outcome.tail, stall)
    except (WriteStalled, ConnectionResetError) as exc:
        client_gone(request, exc, rec)
    finally:
        ACTIVE_STREAMS.dec()
        if outcome.error is not None and rec.error_code is None:
            rec.error_code = outcome.error.code
        rec.usage(encoder.prompt_tokens, encoder.completion_tokens, encoder.cached_tokens, encoder.finish_reasons)
    return response


async def _wait_for_slot(
    response: web.StreamResponse,
    transport: asyncio.Transport | None,
    gen: Generation,
    ticket: Ticket,
    outcome: StreamOutcome,
    limit: float,
    heartbeat: float,
    stall: float,
    keepalive: bytes,
) -> OutputStream:
    try:
        async with asyncio.timeout(limit if limit > 0 else None):
            outcome.heartbeats += await wait_with_heartbeat(response, transport, ticket.wait(), heartbeat, stall, keepalive)
    except TimeoutError:
        raise QueueTimeout(f"no generation slot became free within {limit:g} seconds; retry later") from None
    return await gen.submit()
