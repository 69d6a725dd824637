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
What is submitted is a `Work`: one engine request (`Generation`), or a
`Batch` of them (a completions request with several prompts, or with echo:
one engine request per prompt, merged into one stream by `merge.py`; its
ticket counts one slot per prompt, and an abort reaches every one of them).
Each request runs inside a `Lifetime` (drain.py): a drain deadline ends a
stream with an in-band `server_shutting_down` event, a request timeout ends
a non-streaming request with `generation_timeout`. Whatever happened goes
into the request's access-log record.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, Protocol, TypeVar

import msgspec
from aiohttp import web

from engine_adapter.base import Engine, EngineFailure, EngineRejected, GenerationParams, OutputStream, TokenLogprob
from streamproxy.core.accumulate import Accumulator
from streamproxy.core.blockstream import BlockEncoder
from streamproxy.core.output_tap import AccumulatorTap, EncoderTap
from streamproxy.core.prepare import Prepared
from streamproxy.core.stream import StreamEncoder
from streamproxy.errors import APIError, GenerationTimeout, InvalidRequest, QueueTimeout, ServiceUnavailable
from streamproxy.http.accesslog import REQUEST_ID, Record, record
from streamproxy.http.admission import Ticket
from streamproxy.http.merge import MergedStream, Part, Transform
from streamproxy.http.metrics import ACTIVE_STREAMS, ENGINE_ABORTS
from streamproxy.http.nonstream import answer_nonstream, collect
from streamproxy.http.state import AppState, engine_dead
from streamproxy.http.body import SSE_HEADERS, StreamBody, WriteStalled, sse_response
from streamproxy.http.writer import StreamOutcome, client_gone, pump_sse

log = logging.getLogger("streamproxy.generation")

# The route's non-stream sink: what its `accumulator` makes, its `render` reads.
A = TypeVar("A", bound=Accumulator)


class Work(Protocol):
    """What `run_work` submits and, if it is left unfinished, aborts."""

    @property
    def weight(self) -> int:
        """Admission slots it takes: one per engine request."""
        ...

    @property
    def engine_ids(self) -> list[str]:
        """Its engine request ids (claimed from the state; released when the request ends)."""
        ...

    async def submit(self) -> OutputStream: ...

    async def abort_if_running(self) -> None: ...


class Generation:
    """One engine request: submit it, and abort it if it is left unfinished."""

    __slots__ = ("engine", "request_id", "prompt_ids", "params", "out")

    weight = 1

    def __init__(self, engine: Engine, request_id: str, prompt_ids: list[int], params: GenerationParams) -> None:
        self.engine = engine
        self.request_id = request_id
        self.prompt_ids: list[int] | None = prompt_ids
        self.params = params
        self.out: OutputStream | None = None

    @property
    def engine_ids(self) -> list[str]:
        return [self.request_id]

    def prompt_logprobs(self, i: int = 0) -> list[TokenLogprob] | None:
        """The prompt's logprobs, once the engine has sent them (when asked for); `i` is
        the prompt's number, always 0 here (the signature `Batch.prompt_logprobs` has)."""
        return None if self.out is None else self.out.prompt_logprobs

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
            raise ServiceUnavailable(str(exc), code=exc.code) from exc
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


class Batch:
    """Several engine requests answered as one: submitted in order, merged, aborted together.

    Part i's choices are numbered from i × n; `transforms[i]` (e.g. echo) is
    applied to its Deltas first.
    """

    __slots__ = ("parts", "n", "transforms", "merged")

    def __init__(self, parts: list[Generation], n: int, transforms: Sequence[Transform | None]) -> None:
        self.parts = parts
        self.n = n
        self.transforms = transforms
        self.merged: MergedStream | None = None

    @property
    def weight(self) -> int:
        return len(self.parts)

    @property
    def engine_ids(self) -> list[str]:
        return [part.request_id for part in self.parts]

    def prompt_logprobs(self, i: int) -> list[TokenLogprob] | None:
        return self.parts[i].prompt_logprobs()

    async def submit(self) -> OutputStream:
        streams = [await part.submit() for part in self.parts]  # a refusal aborts those before it (abort_if_running)
        self.merged = MergedStream([Part(out, i * self.n, t) for i, (out, t) in enumerate(zip(streams, self.transforms))])
        return self.merged

    async def abort_if_running(self) -> None:
        if self.merged is not None:
            self.merged.close()
        for part in self.parts:
            await part.abort_if_running()


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
    gen = Generation(engine, state.claim_engine_id(request[REQUEST_ID]), prompt_ids, params)
    del prompt_ids  # `gen` hands them to the engine; this frame lives as long as the stream
    return await run_work(request, state, gen, stream=stream, encoder=encoder, render=render, accumulator=accumulator)


def _trace(gen: Work, rec: Record) -> Work:
    """--otlp-traces-endpoint: each engine request carries the request's span as its parent
    (vLLM's `trace_headers`), so the engine's spans join the trace; the span gets an
    `engine.submit` event when the work goes to the engine (after its wait for a slot)."""
    from streamproxy.http import tracing

    if tracing.TRACER is None:
        return gen
    headers = tracing.TRACER.headers(rec.span)
    parts = gen.parts if isinstance(gen, Batch) else [gen] if isinstance(gen, Generation) else []
    for part in parts:
        part.params = msgspec.structs.replace(part.params, trace_headers=headers)
        if rec.max_tokens is None:
            rec.max_tokens = part.params.max_tokens
    return _Traced(gen, rec.span)


class _Traced:
    """A `Work` whose submit is an event on the request's span (only made when tracing)."""

    __slots__ = ("_work", "_span")

    def __init__(self, work: Work, span: Any) -> None:
        self._work = work
        self._span = span

    @property
    def weight(self) -> int:
        return self._work.weight

    @property
    def engine_ids(self) -> list[str]:
        return self._work.engine_ids

    async def submit(self) -> OutputStream:
        self._span.add_event("engine.submit")
        return await self._work.submit()

    async def abort_if_running(self) -> None:
        await self._work.abort_if_running()


async def run_work(
    request: web.Request,
    state: AppState,
    gen: Work,
    *,
    stream: bool,
    encoder: Callable[[], StreamEncoder],
    render: Callable[[A], bytes],
    accumulator: Callable[[], A],
) -> web.StreamResponse:
    """`run` for work the route built itself (a `Batch`, or a `Generation` its answer reads from);
    its engine ids are released here."""
    rec = record(request)
    rec.generation = True
    rec.stream = stream
    if rec.span is not None:
        gen = _trace(gen, rec)
    ticket: Ticket | None = None
    work: asyncio.Task[bytes] | None = None
    settings = state.settings
    tap: EncoderTap | AccumulatorTap | None = None
    try:
        ticket = state.admission.enter(gen.weight)
        if rec.span is not None and not ticket.granted:
            rec.span.add_event("queued")  # no slot free: waits in the admission queue
        if stream:
            enc = encoder()
            if settings.enable_log_outputs:
                enc = tap = EncoderTap(enc)
            return await _stream(request, state, gen, ticket, enc, rec)
        acc = accumulator()
        if settings.enable_log_outputs:
            tap = AccumulatorTap(acc)
            work = asyncio.ensure_future(_finish(gen, ticket, tap, rec, partial(_render_inner, render)))
        else:
            work = asyncio.ensure_future(_finish(gen, ticket, acc, rec, render))
        try:
            life = state.inflight.lifetime(settings.request_timeout, partial(_timed_out, ticket, settings.request_timeout))
            return await answer_nonstream(request, work, settings, life, rec)
        finally:
            rec.usage(acc.prompt_tokens, acc.completion_tokens, acc.cached_tokens, acc.finish_reasons)
    finally:
        if tap is not None:
            rec.outputs = tap.outputs(settings.max_log_len)
        if work is not None and not work.done():
            work.cancel()
        if ticket is not None:
            ticket.release()
        try:
            await gen.abort_if_running()
        finally:
            for engine_id in gen.engine_ids:
                state.release_engine_id(engine_id)


def _render_inner(render: Callable[[A], bytes], tap: AccumulatorTap) -> bytes:
    return render(tap.inner)  # type: ignore[arg-type]  # the tap holds the route's own accumulator


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
async def _finish(gen: Work, ticket: Ticket, acc: A, rec: Record, render: Callable[[A], bytes]) -> bytes:
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
    request: web.Request, state: AppState, gen: Work, ticket: Ticket, encoder: StreamEncoder, rec: Record
) -> web.StreamResponse:
    settings = state.settings
    out = await gen.submit() if ticket.granted else None
    # Admitted at once: the headers leave with the first frame (`sse_response`). Queued: now.
    response = sse_response(request) if out is not None else web.StreamResponse(headers=SSE_HEADERS)
    body = StreamBody(request, response, encoder, heartbeat=settings.sse_heartbeat, stall=settings.write_stall_timeout, record=rec)
    outcome = StreamOutcome()
    life = state.inflight.lifetime()
    ACTIVE_STREAMS.inc()
    try:
        try:
            async with life:
                await body.open()
                if out is None:
                    # Queued: the headers are out, the body keeps the connection warm until a slot frees.
                    out = await _wait_for_slot(gen, ticket, settings.request_timeout)
                await pump_sse(body, out, outcome, push=settings.stream_push)
        except TimeoutError:
            if not life.expired:
                raise
            reason = life.reason
            assert reason is not None
            if not response.prepared:
                raise reason from None
            outcome.error = reason
            await body.write(encoder.error(reason))
        except APIError as exc:
            # After the headers (a queued request's submit, or its wait timed out).
            outcome.error = exc
            await body.write(encoder.error(exc))
        await body.finish(outcome.tail)
    except (WriteStalled, ConnectionResetError) as exc:
        client_gone(request, exc, rec)
    finally:
        body.close()
        ACTIVE_STREAMS.dec()
        if outcome.error is not None and rec.error_code is None:
            rec.error_code = outcome.error.code
        rec.usage(encoder.prompt_tokens, encoder.completion_tokens, encoder.cached_tokens, encoder.finish_reasons)
    return response


async def _wait_for_slot(gen: Work, ticket: Ticket, limit: float) -> OutputStream:
    try:
        async with asyncio.timeout(limit if limit > 0 else None):
            await ticket.wait()
    except TimeoutError:
        raise QueueTimeout(f"no generation slot became free within {limit:g} seconds; retry later") from None
    return await gen.submit()


async def run_detached(state: AppState, gen: Work, ticket: Ticket, acc: A, rec: Record, started: Callable[[], None]) -> None:
    """The life cycle of a background request (Responses' `background: true`): like the
    non-streaming path, but in a task of the server, not of a connection, so a client that
    leaves does not end it. The caller entered `ticket` (a 429 belongs on the create) and
    owns the task; `started()` runs once the engine took the work. No request timeout (vLLM
    has none for these); a drain ends it at the drain deadline (TimeoutError, see drain.py),
    and a cancel of its task (CancelledError) ends it at once. Either way the engine request
    is aborted here before the exception goes on."""
    life = state.inflight.lifetime()
    try:
        async with life:
            await ticket.wait()
            out = await gen.submit()
            started()
            await collect(out, acc, rec)
    except TimeoutError:
        reason = life.reason
        if not life.expired or reason is None:
            raise
        raise reason from None
    finally:
        ticket.release()
        # The abort finishes even if the task is cancelled meanwhile (shutdown cancels what is left).
        ending = asyncio.ensure_future(_end_detached(state, gen))
        try:
            await asyncio.shield(ending)
        except asyncio.CancelledError:
            await ending
            raise


async def _end_detached(state: AppState, gen: Work) -> None:
    try:
        await gen.abort_if_running()
    finally:
        for engine_id in gen.engine_ids:
            state.release_engine_id(engine_id)
