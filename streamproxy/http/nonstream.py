"""The non-streaming answer: collect a generation, then one JSON body, kept alive if slow.

`collect` drives a non-streaming request to its end into an accumulator;
`answer_nonstream` turns the result into a JSON response, or, when the
answer takes long, sends the 200 early and keeps the connection alive with
newlines (JSON allows leading whitespace; the `body.Body`'s heartbeat) until the JSON is ready; an error
after that 200 is written into the body in the route's error shape. Neither
aborts the engine request: the route does that in a `finally`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from time import perf_counter
from typing import TYPE_CHECKING

from aiohttp import web

from engine_adapter.base import EngineFailure, EngineRejected, OutputStream
from streamproxy.config import Settings
from streamproxy.core.accumulate import Accumulator
from streamproxy.errors import APIError, InternalError
from streamproxy.http.body import NEWLINE, Body, WriteStalled
from streamproxy.http.error_shapes import error_json
from streamproxy.http.metrics import NONSTREAM_HEARTBEATS
from streamproxy.http.writer import client_gone, engine_error

if TYPE_CHECKING:
    from streamproxy.http.context import RequestContext
    from streamproxy.http.drain import Lifetime

log = logging.getLogger("streamproxy.writer")


async def collect(out: OutputStream, sink: Accumulator, record: RequestContext | None = None) -> None:
    """Feed every step into `sink.step(deltas)` until the engine is done."""
    try:
        while True:
            deltas = out.get_nowait()
            if deltas is None:
                deltas = await out.get()
            if record is not None and record.ttft is None:
                record.first_token(perf_counter())
            sink.step(deltas)
    except StopAsyncIteration:
        sink.prompt_tokens = out.prompt_tokens
        sink.cached_tokens = out.cached_tokens
    except (EngineFailure, EngineRejected) as exc:
        raise engine_error(exc) from exc


async def answer_nonstream(
    request: web.Request, work: asyncio.Future[bytes], settings: Settings, life: Lifetime, record: RequestContext
) -> web.StreamResponse:
    """Answer with the JSON `work` resolves to, inside `life`; keep the connection alive if it is slow.

    Before --nonstream-keepalive-after s (<= 0: never) an error is an ordinary error response. After it the
    200 is out, a newline goes every --nonstream-keepalive-interval s, and an error is written into the body
    in the route's shape. A client gone after the early 200 ends it quietly.
    """
    error_body = error_json(request)
    keepalive_after = settings.nonstream_keepalive_after
    body: Body | None = None
    try:
        try:
            try:
                async with life:
                    try:
                        async with asyncio.timeout(keepalive_after if keepalive_after > 0 else None):
                            answer = await asyncio.shield(work)
                    except TimeoutError:
                        pass
                    else:
                        return web.Response(body=answer, content_type="application/json")
                    response = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
                    body = Body(request, response, NEWLINE, heartbeat=settings.nonstream_keepalive_interval,
                                stall=settings.write_stall_timeout, counter=NONSTREAM_HEARTBEATS)
                    await body.open()
                    await asyncio.wait((work,))  # the body's heartbeat meanwhile
                    try:
                        answer = work.result()
                    except APIError as exc:
                        answer = _body_error(exc, record, error_body)
                    except Exception:
                        log.exception("non-streaming request %s failed after the early 200", record.request_id)
                        answer = _body_error(InternalError("the server failed to handle this request"), record, error_body)
            except TimeoutError:
                if not life.expired:
                    raise
                work.cancel()
                reason = life.reason or InternalError("the request ended early")
                if body is None:
                    raise reason from None
                answer = _body_error(reason, record, error_body)
            assert body is not None
            await body.finish(answer)  # the JSON and the terminating chunk in one write
            return body.response
        finally:
            if body is not None:
                body.close()
    except (WriteStalled, ConnectionResetError) as exc:
        if body is None:
            raise
        client_gone(request, exc, record)
        return body.response


def _body_error(exc: APIError, record: RequestContext, error_body: Callable[[APIError], bytes]) -> bytes:
    record.fail(exc.code)
    return error_body(exc)
