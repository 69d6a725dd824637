"""serve's stream: `pump_sse` writes one request's engine output through its `body.StreamBody`.

The headers go out before anything is asked of the engine (in `open()`, or with the first frame of an
`SSEResponse`), then one write per engine step, everything pending at once. The body keeps the
connection alive and bounds every write that could block (`WriteStalled`), so a client that stops
reading pins at most the transport buffer plus what the engine makes during the stall timeout.
Push, the common path: while nothing is pending and the buffer is small the stream is armed with
`StreamBody.push`, and the engine's step encodes and writes its frame in one `transport.write`: no task,
future or timer per token. A refused push (buffer above `PUSH_BUFFER_LIMIT`, closing) falls back to the
pull loop until caught up; a raising one ends the stream with an in-band error. Every other exit goes
through the handler, whose route aborts the engine request in a `finally`.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from aiohttp import web

from engine_adapter.base import EngineFailure, EngineRejected, OutputStream, PushFailed
from streamproxy.errors import APIError, EngineError, InternalError, InvalidRequest, ServiceUnavailable
from streamproxy.http.body import StreamBody, WriteStalled
from streamproxy.http.metrics import WRITE_STALLS

if TYPE_CHECKING:
    from streamproxy.http.context import RequestContext

log = logging.getLogger("streamproxy.writer")


class StreamOutcome:
    __slots__ = ("finished", "error", "tail")

    def __init__(self) -> None:
        self.finished = False
        self.error: APIError | None = None
        # The stream's last frames (usage, [DONE]): they go out with the
        # terminating chunk in one write (`Body.finish`).
        self.tail = b""


def engine_error(exc: BaseException) -> APIError:
    """What the client is told of an engine's error for one request (as vLLM's error handler maps
    its exceptions): its refusal of the request a 400, a failure it asks to retry a 503, else a 500."""
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, EngineRejected):
        return InvalidRequest(str(exc), param=exc.param)
    if isinstance(exc, EngineFailure):
        if exc.retryable:
            return ServiceUnavailable(f"generation failed: {exc}", code=exc.code or "engine_unavailable", should_retry=True)
        return EngineError(f"generation failed: {exc}")
    return EngineError("generation failed")


async def pump_sse(body: StreamBody, out: OutputStream, outcome: StreamOutcome | None = None, *,
                   push: bool = True) -> StreamOutcome:
    """Write the stream until the engine is done: the caller has opened the body (`open()`) and
    ends it (`body.finish(outcome.tail)`).

    `outcome` (made here when not given) is filled in as the stream goes, so a caller whose
    lifetime ends the pump early still knows what happened. With `push`, whenever nothing is
    pending and the socket keeps up, the stream is armed with the sink (`StreamBody.push`) and
    this task sleeps until the end or a fallback; otherwise it pulls.
    """
    if outcome is None:
        outcome = StreamOutcome()
    encoder = body.encoder
    body.out = out
    encoder.prompt_tokens = out.prompt_tokens
    # The headers leave now (an `SSEResponse` holds them for its first write): with the first
    # frame, or alone (an empty write; nothing at all once they are out).
    await body.write(encoder.start())
    # Push only onto a transport that takes our chunked frames as they are.
    push = push and body.direct
    try:
        while True:
            deltas = out.get_nowait()
            if deltas is None:
                if push and body.writable():
                    out.arm(body.push)
                deltas = await out.get()
            # Pull: the sink is disarmed (or was never armed); everything pending at once.
            encoder.prompt_tokens = out.prompt_tokens
            data = encoder.step(deltas)
            if data:
                await body.write(data)
                body.wrote(deltas)
    except StopAsyncIteration:
        encoder.prompt_tokens = out.prompt_tokens
        encoder.cached_tokens = out.cached_tokens
        outcome.finished = True
        outcome.tail = encoder.finish()
    except (EngineFailure, EngineRejected, APIError) as exc:
        outcome.error = engine_error(exc)
        await body.write(encoder.error(outcome.error))
    except PushFailed as exc:
        record = body.record
        log.error("request %s: writing a step failed", record and record.request_id, exc_info=exc.__cause__)
        outcome.error = InternalError("the server failed while streaming this response")
        await body.write(encoder.error(outcome.error))
    finally:
        if push:
            out.disarm()
    return outcome


def client_gone(request: web.Request, exc: BaseException, record: RequestContext | None) -> None:
    """After the headers: the client stopped reading (drop the connection and what is
    buffered for it) or went away. Either way the route's `finally` aborts the engine."""
    if isinstance(exc, WriteStalled):
        WRITE_STALLS.inc()
        if record is not None:
            record.fail("write_stalled")
        log.info("request %s: the client stopped reading; response ended", record and record.request_id)
        if request.transport is not None:
            request.transport.abort()
    elif record is not None:
        record.gone()
