"""The non-streaming answer: collect a generation, then one JSON body, kept alive if slow.

`collect` drives a non-streaming request to its end into an accumulator;
`respond_nonstream` turns the result into a JSON response, or, when the
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


async def respond_nonstream(
    request: web.Request,
    work: asyncio.Future[bytes],
    *,
    keepalive_after: float,
    keepalive_interval: float,
    life: Lifetime,
    stall_timeout: float,
    headers: dict[str, str] | None = None,
    record: RequestContext | None = None,
    error_body: Callable[[APIError], bytes] | None = None,
) -> web.StreamResponse:
    """Answer with the JSON `work` resolves to, inside `life`; keep the connection alive if it is slow.

    Before `keepalive_after` s (<= 0: never) an error is an ordinary error response. After it the 200 is
    out, a newline goes every `keepalive_interval` s, and an error is written into the body in the route's
    shape (`error_body`, OpenAI's by default). A client gone after the early 200 ends it quietly.
    """
    early: list[web.StreamResponse] = []
    try:
        return await _respond_nonstream(
            request, work, early, keepalive_after, keepalive_interval, life, stall_timeout, headers, record, error_body
        )
    except (WriteStalled, ConnectionResetError) as exc:
        if not early:
            raise
        client_gone(request, exc, record)
        return early[0]


async def answer_nonstream(
    request: web.Request, work: asyncio.Future[bytes], settings: Settings, life: Lifetime, record: RequestContext
) -> web.StreamResponse:
    """`respond_nonstream` with the server's keepalive and stall settings and the route's error shape."""
    return await respond_nonstream(
        request,
        work,
        keepalive_after=settings.nonstream_keepalive_after,
        keepalive_interval=settings.nonstream_keepalive_interval,
        life=life,
        stall_timeout=settings.write_stall_timeout,
        record=record,
        error_body=error_json(request),
    )


async def _respond_nonstream(
    request: web.Request,
    work: asyncio.Future[bytes],
    early: list[web.StreamResponse],
    keepalive_after: float,
    keepalive_interval: float,
    life: Lifetime,
    stall_timeout: float,
    headers: dict[str, str] | None,
    record: RequestContext | None,
    error_body: Callable[[APIError], bytes] | None,
) -> web.StreamResponse:
    body: Body | None = None
    try:
        try:
            async with life:
                try:
                    async with asyncio.timeout(keepalive_after if keepalive_after > 0 else None):
                        answer = await asyncio.shield(work)
                except TimeoutError:
                    pass
                else:
                    return web.Response(body=answer, content_type="application/json", headers=headers)
                response = web.StreamResponse(status=200, headers={**(headers or {}), "Content-Type": "application/json"})
                early.append(response)
                body = Body(request, response, NEWLINE, heartbeat=keepalive_interval, stall=stall_timeout,
                            counter=NONSTREAM_HEARTBEATS)
                await body.open()
                await asyncio.wait((work,))  # the body's heartbeat meanwhile
                try:
                    answer = work.result()
                except APIError as exc:
                    answer = _body_error(exc, record, error_body)
                except Exception:
                    log.exception("non-streaming request %s failed after the early 200", record and record.request_id)
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


def _body_error(exc: APIError, record: RequestContext | None, error_body: Callable[[APIError], bytes] | None) -> bytes:
    if record is not None:
        record.fail(exc.code)
    return exc.to_json() if error_body is None else error_body(exc)
