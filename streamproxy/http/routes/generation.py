"""serve's one generation runner: a route decodes its request, plans it, and `run`s the plan.

A plan is a `Work` (the engine requests to make: one, or one per prompt merged by merge.py) and an
`Answer` (the stream encoder, or the accumulator and the JSON body). `run`: `admission.enter()` (429
over capacity); `work.claim()` the engine ids; streaming: headers out (submitting first when a slot is
free, so engine rejections are still 400s), keep-alives while queued, `pump_sse`; otherwise a background
task waits, submits and collects while `answer_nonstream` keeps the client; finally the usage and
outcome into the request's context, the slot released and `work.end()` aborts whatever is not done.
One place makes an engine request and one can leave it behind. Each request runs inside a `Lifetime`
(drain.py); `detach` runs a work from a server task (Responses' `background: true`). Tracing and
--enable-log-outputs cost the stream path nothing when off. A continuation's work (`continued`: the
earlier ids are the end of its engine prompt) reports the client's prompt, not the engine's.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from time import perf_counter
from typing import Any, Generic, TypeVar

import msgspec
from aiohttp import web

from engine_adapter.base import Delta, Engine, EngineFailure, EngineRejected, GenerationParams, OutputStream, Sink, TokenLogprob
from streamproxy.core import continuation
from streamproxy.core.accumulate import Accumulator
from streamproxy.core.blockstream import BlockEncoder
from streamproxy.core.continuation import PARAM as CONTINUE_PARAM
from streamproxy.core.event_ids import BlockStream
from streamproxy.core.stream import StreamEncoder
from streamproxy.errors import APIError, GenerationTimeout, InvalidRequest, QueueTimeout, ServiceUnavailable
from streamproxy.http import tracing
from streamproxy.http.admission import Ticket
from streamproxy.http.body import SSE_HEADERS, StreamBody, WriteStalled, sse_response
from streamproxy.http.context import CONTEXT, RequestContext
from streamproxy.http.merge import MergedStream, Part, Transform
from streamproxy.http.metrics import ACTIVE_STREAMS, ENGINE_ABORTS
from streamproxy.http.nonstream import answer_nonstream, collect
from streamproxy.http.state import STATE_KEY, AppState, engine_dead
from streamproxy.http.writer import StreamOutcome, client_gone, pump_sse

log = logging.getLogger("streamproxy.generation")

# The route's non-stream sink: what its `accumulator` makes, its `render` reads.
A = TypeVar("A", bound=Accumulator)
B = TypeVar("B", bound=BlockEncoder)


@dataclass(frozen=True, slots=True)
class Answer(Generic[A]):
    """How a route answers: its stream encoder, or its accumulator and the JSON rendered from it."""

    encoder: Callable[[], StreamEncoder]
    accumulator: Callable[[], A]
    render: Callable[[A], bytes]
    headers: dict[str, str] | None = None  # a stream's own response headers


# A stream that asked for its token ids says that this server takes `continue_token_ids` (a gateway reads it).
CONTINUES = {"Streamproxy-Continuation": CONTINUE_PARAM}


def headers_for(req: Any) -> dict[str, str] | None:
    """A chat or completions request's stream headers."""
    return CONTINUES if req.return_token_ids and req.stream else None


def blocks(make: Callable[[bool], B], render: Callable[[B], bytes], req: Any = None, prompt_ids: list[int] | None = None,
           pieces: list[tuple[str, int]] | None = None) -> Answer[B]:
    """The answer of the APIs whose one encoder class (`make(emit)`) is both the stream's encoder
    (emit=True) and the non-stream answer's sink (emit=False): Responses, Anthropic. `req` asked
    `return_token_ids` (its events carry `prompt_ids` and each step's, event_ids.py) or continues a
    stream (`pieces`: the earlier tokens, `prime`d)."""
    if req is None or (not req.return_token_ids and pieces is None):
        return Answer(partial(make, True), partial(make, False), render)
    stream = BlockStream(make, prompt_ids if req.return_token_ids else None, pieces)
    return Answer(stream, partial(make, False), render, headers_for(req))


def block_continuation(req: Any, params: GenerationParams, engine: Engine, prompt_ids: list[int]) -> tuple[list[int], list[tuple[str, int]] | None]:
    """A block API's request (Responses, Anthropic): the engine's prompt, and the earlier tokens of a
    continuation (`continue_token_ids`, checked: a 400 naming it), as chat's; ids only on streams."""
    if req.return_token_ids and not req.stream:
        raise InvalidRequest("'return_token_ids' is for streams on this route (their events carry the ids)", param="return_token_ids")
    ids = req.continue_token_ids
    if ids is None:
        return prompt_ids, None
    continuation.check(ids, params, stream=bool(req.stream), vocab_size=engine.info.vocab_size)
    return continuation.apply(prompt_ids, params, ids), continuation.pieces(engine.decode, prompt_ids, ids)


class Work:
    """One answer's engine requests: submitted in order, merged into one stream when there are
    several (or a part has a transform: echo), aborted together. Part i's choices are numbered
    from i × n, and `transforms[i]` is applied to its Deltas first."""

    __slots__ = ("engine", "prompts", "params", "n", "transforms", "ids", "outs", "merged", "span", "continued")

    def __init__(self, engine: Engine, prompts: list[list[int]], params: list[GenerationParams], n: int = 1,
                 transforms: Sequence[Transform | None] | None = None, continued: int = 0) -> None:
        self.engine = engine
        self.prompts = prompts  # the engine's once submitted: not kept for the stream's life
        self.params = params
        self.n = n
        self.transforms = transforms
        self.ids: list[str] = []  # the engine request ids (`claim`, released by `end`)
        self.outs: list[OutputStream] = []
        self.merged: MergedStream | None = None
        self.span: Any = None  # --otlp-traces-endpoint: the request's span (`_trace`)
        self.continued = continued  # continue_token_ids: how many of the prompt's ids are earlier output

    @property
    def weight(self) -> int:
        """Admission slots it takes: one per engine request."""
        return len(self.params)

    def prompt_logprobs(self, i: int = 0) -> list[TokenLogprob] | None:
        """Prompt i's logprobs, once the engine has sent them (when asked for)."""
        return self.outs[i].prompt_logprobs if i < len(self.outs) else None

    def claim(self, state: AppState, request_id: str) -> None:
        """The engine request ids: the request's id (`-<i>` per prompt of a batch), made unique among
        the requests in flight (two clients may send the same X-Request-Id, and an abort must never
        reach the other one's request)."""
        taken, many = state.engine_ids, len(self.params) > 1
        for i in range(len(self.params)):
            engine_id = base = f"{request_id}-{i}" if many else request_id
            n = 1
            while engine_id in taken:
                n += 1
                engine_id = f"{base}-{n}"
            taken.add(engine_id)
            self.ids.append(engine_id)

    async def submit(self) -> OutputStream:
        if self.span is not None:
            self.span.add_event("engine.submit")  # after the wait for a slot
        prompts, self.prompts = self.prompts, []
        for engine_id, prompt_ids, params in zip(self.ids, prompts, self.params):  # a refusal: `end` aborts those before it
            self.outs.append(await _generate(self.engine, engine_id, prompt_ids, params))
        if self.transforms is None and len(self.outs) == 1:
            return self.outs[0] if not self.continued else _Continued(self.outs[0], self.continued)
        transforms = self.transforms or [None] * len(self.outs)
        self.merged = MergedStream([Part(out, i * self.n, t) for i, (out, t) in enumerate(zip(self.outs, transforms))])
        return self.merged

    async def end(self, state: AppState) -> None:
        """Abort what the engine still runs (the client gone, an error, a timeout, a drain), and
        release the ids."""
        try:
            if self.merged is not None:
                self.merged.close()
            for engine_id, out in zip(self.ids, self.outs):
                if out.finished:
                    continue
                ENGINE_ABORTS.inc()
                try:
                    await self.engine.abort(engine_id)
                except Exception:  # the engine may already be gone
                    log.debug("abort of %s failed", engine_id, exc_info=True)
        finally:
            state.engine_ids.difference_update(self.ids)


class _Continued:
    """A continuation's output: the engine's, with the client's prompt count (the engine's less the earlier ids)."""

    __slots__ = ("out", "earlier")

    def __init__(self, out: OutputStream, earlier: int) -> None:
        self.out, self.earlier = out, earlier

    @property
    def prompt_tokens(self) -> int:
        return max(0, self.out.prompt_tokens - self.earlier)

    @prompt_tokens.setter
    def prompt_tokens(self, value: int) -> None:
        self.out.prompt_tokens = value + self.earlier

    @property
    def cached_tokens(self) -> int:
        return min(self.out.cached_tokens, self.prompt_tokens)

    @cached_tokens.setter
    def cached_tokens(self, value: int) -> None:
        self.out.cached_tokens = value

    @property
    def prompt_logprobs(self) -> list[TokenLogprob] | None:
        return None  # (refused with a continuation)

    @prompt_logprobs.setter
    def prompt_logprobs(self, value: list[TokenLogprob] | None) -> None:
        self.out.prompt_logprobs = value

    @property
    def finished(self) -> bool:
        return self.out.finished

    def arm(self, sink: Sink) -> bool:
        return self.out.arm(sink)

    def disarm(self) -> None:
        self.out.disarm()

    def get_nowait(self) -> list[Delta] | None:
        return self.out.get_nowait()

    async def get(self) -> list[Delta]:
        return await self.out.get()

    async def wait(self, timeout: float) -> None:
        await self.out.wait(timeout)


async def _generate(engine: Engine, engine_id: str, prompt_ids: list[int], params: GenerationParams) -> OutputStream:
    try:
        return await engine.generate(engine_id, prompt_ids, params)
    except APIError:
        raise
    except EngineFailure as exc:
        if engine.state == "dead":
            raise engine_dead() from exc
        raise ServiceUnavailable(str(exc), code=exc.code) from exc
    except EngineRejected as exc:
        # The engine's own validation of sampling parameters.
        raise InvalidRequest(str(exc), param=exc.param) from exc


async def run(request: web.Request, work: Work, answer: Answer[A], stream: bool) -> web.StreamResponse:
    state, ctx = request.app[STATE_KEY], request[CONTEXT]
    settings = state.settings
    ctx.generating(stream)
    if ctx.span is not None:
        _trace(work, ctx)
    ticket = state.admission.enter(work.weight)
    job: asyncio.Future[bytes] | None = None
    outputs: _Outputs | None = None
    sink: StreamEncoder | A | None = None
    try:
        if ctx.span is not None and not ticket.granted:
            ctx.span.add_event("queued")  # no slot free: waits in the admission queue
        work.claim(state, ctx.request_id)
        if settings.enable_log_outputs:
            outputs = _Outputs(work)
        if stream:
            sink = answer.encoder()
            return await _stream(request, state, work, ticket, sink, ctx, answer.headers)
        sink = acc = answer.accumulator()
        job = asyncio.ensure_future(_collect(work, ticket, acc, ctx, answer.render))
        life = state.inflight.lifetime(settings.request_timeout, partial(_timed_out, ticket, settings.request_timeout))
        return await answer_nonstream(request, job, settings, life, ctx)
    finally:
        if sink is not None:
            ctx.usage(sink.prompt_tokens, sink.completion_tokens, sink.cached_tokens, sink.finish_reasons)
        if outputs is not None:
            ctx.outputs = outputs.cut(settings.max_log_len)
        if job is not None and not job.done():
            job.cancel()
        ticket.release()
        await work.end(state)


def _trace(work: Work, ctx: RequestContext) -> None:
    """--otlp-traces-endpoint: the engine requests are the span's children (and its `engine.submit` event)."""
    if tracing.TRACER is None:
        return
    headers = tracing.TRACER.headers(ctx.span)
    work.params = [msgspec.structs.replace(params, trace_headers=headers) for params in work.params]
    work.span = ctx.span
    if ctx.max_tokens is None:
        ctx.max_tokens = work.params[0].max_tokens


class _Outputs:
    """--enable-log-outputs: each choice's raw text, kept by a transform on each of the work's parts."""

    __slots__ = ("texts",)

    def __init__(self, work: Work) -> None:
        self.texts: dict[int, list[str | bytes]] = {}
        inner = work.transforms or [None] * work.weight
        work.transforms = [partial(self._keep, i * work.n, t) for i, t in enumerate(inner)]

    def _keep(self, offset: int, inner: Transform | None, deltas: Sequence[Delta], prompt: list[TokenLogprob] | None) -> list[Delta]:
        out = inner(deltas, prompt) if inner is not None else list(deltas)
        for d in out:
            if d.text:
                self.texts.setdefault(offset + d.index, []).append(d.text)
        return out

    def cut(self, limit: int | None) -> list[str]:
        """Each choice's text (in choice order), at most `limit` characters each."""
        out = []
        for index in sorted(self.texts):
            text = b"".join(p if isinstance(p, bytes) else p.encode() for p in self.texts[index]).decode("utf-8", "replace")
            out.append(text if limit is None else text[:limit])
        return out


# The non-streaming path's pieces are module functions, not closures in `run`:
# a closure's cells would be made for every request, a stream's included, and
# kept as long as it runs.
async def _collect(work: Work, ticket: Ticket, acc: A, ctx: RequestContext, render: Callable[[A], bytes]) -> bytes:
    await ticket.wait()
    await collect(await work.submit(), acc, ctx)
    return render(acc)


def _timed_out(ticket: Ticket, timeout: float) -> APIError:
    limit = f"{timeout:g} seconds"
    if not ticket.granted:
        return QueueTimeout(f"no generation slot became free within {limit}; retry later")
    return GenerationTimeout(f"generation did not finish within {limit}")


async def _stream(
    request: web.Request, state: AppState, work: Work, ticket: Ticket, encoder: StreamEncoder, ctx: RequestContext,
    headers: dict[str, str] | None = None,
) -> web.StreamResponse:
    settings = state.settings
    out = await work.submit() if ticket.granted else None
    # Admitted at once: the headers leave with the first frame (`sse_response`). Queued: now.
    response = sse_response(request) if out is not None else web.StreamResponse(headers=SSE_HEADERS)
    if headers:
        response.headers.update(headers)
    body = StreamBody(request, response, encoder, heartbeat=settings.sse_heartbeat, stall=settings.write_stall_timeout, record=ctx)
    outcome = StreamOutcome()
    life = state.inflight.lifetime()
    ACTIVE_STREAMS.inc()
    try:
        try:
            async with life:
                await body.open()
                if out is None:
                    # Queued: the headers are out, the body keeps the connection warm until a slot frees.
                    out = await _wait_for_slot(work, ticket, settings.request_timeout)
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
        client_gone(request, exc, ctx)
    finally:
        body.close()
        ACTIVE_STREAMS.dec()
        if outcome.error is not None and ctx.error_code is None:
            ctx.fail(outcome.error.code)
    return response


async def _wait_for_slot(work: Work, ticket: Ticket, limit: float) -> OutputStream:
    try:
        async with asyncio.timeout(limit if limit > 0 else None):
            await ticket.wait()
    except TimeoutError:
        raise _timed_out(ticket, limit) from None  # (not granted: a QueueTimeout)
    return await work.submit()


async def detach(state: AppState, work: Work, ticket: Ticket, acc: Accumulator, request_id: str, started: Callable[[], None]) -> None:
    """A background request's life cycle (Responses' `background: true`): like the non-streaming
    path, but in a task of the server, not of a connection, so a client that leaves does not end
    it. The caller entered `ticket` (a 429 belongs on the create) and owns the task; `started()`
    runs once the engine took the work. No request timeout (vLLM has none for these); a drain ends
    it at the drain deadline (TimeoutError, see drain.py), and a cancel of its task
    (CancelledError) ends it at once. Either way the engine request is aborted here before the
    exception goes on."""
    life = state.inflight.lifetime()
    try:
        work.claim(state, request_id)
        async with life:
            await ticket.wait()
            out = await work.submit()
            started()
            await collect(out, acc, RequestContext(request_id, perf_counter()))  # (its time to first token counted)
    except TimeoutError:
        reason = life.reason
        if not life.expired or reason is None:
            raise
        raise reason from None
    finally:
        ticket.release()
        # The abort finishes even if the task is cancelled meanwhile (shutdown cancels what is left).
        ending = asyncio.ensure_future(work.end(state))
        try:
            await asyncio.shield(ending)
        except asyncio.CancelledError:
            await ending
            raise
