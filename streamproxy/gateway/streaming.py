"""Relaying a stream: headers once a replica answered, whole events, heartbeats, in-band errors.

The client's response is an `http.body.RelayBody`. Nothing is sent before a replica answered 200
(failover stays possible) unless that takes a heartbeat interval: the heartbeat then sends the headers
(`begun()`: later errors go in-band). The held head leaves in one write with the events that came with
the replica's (`Exchange.take`); after that events are written from the replica connection's data
callback while the client keeps up (`RelayBody.relay`), and when it falls behind reading pauses while
the handler writes what is held (`RelayBody.follow`). The last read goes out with the terminating chunk
(`Body.finish`): one client write per replica read. A replica that breaks off ends the stream with an
in-band `upstream_unavailable`.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from aiohttp import web

from streamproxy.errors import APIError, ServiceUnavailable
from streamproxy.gateway.call import BROKEN, Attempt, Call
from streamproxy.gateway.relay import SSERelay
from streamproxy.gateway.upstream import UpstreamError
from streamproxy.gateway.wire import UpstreamClosed
from streamproxy.http.body import RelayBody, WriteStalled, sse_response
from streamproxy.http.writer import client_gone

# -- streaming ----------------------------------------------------------------------


async def stream(request: web.Request, call: Call) -> web.StreamResponse:
    settings = call.state.settings
    api = call.route.api
    body = RelayBody(request, sse_response(request), api.keepalive, heartbeat=settings.sse_heartbeat,
                     stall=settings.write_stall_timeout)
    relay_ = SSERelay(api, served=call.pool.deployment.upstream_model, public=call.public_model, strip_usage=call.strip_usage)
    response = body.response
    attempt: Attempt | None = None
    outcome: int | None = None
    try:
        async with call.state.inflight.lifetime():
            try:
                attempt = await call.open()
            except APIError as exc:
                if not await body.begun():
                    raise  # a status of its own: nothing was sent yet
                await body.finish(relay_.error(exc))
                return response
            upstream = attempt.exchange
            outcome = upstream.status
            if upstream.status != 200:
                refused = UpstreamError(upstream.status, call.renamed(await _error_body(upstream)), upstream.headers.get("retry-after"))
                if not await body.begun():
                    raise refused
                await body.finish(relay_.error(refused))
                return response
            ended, tail = await _pump(call, attempt, relay_, body)
            if not ended:
                outcome = BROKEN
        await body.finish(tail)
    except (WriteStalled, ConnectionResetError) as exc:
        client_gone(request, exc, call.ctx)
    except TimeoutError:  # the drain deadline (the Lifetime)
        if not await body.begun():
            raise ServiceUnavailable("the gateway is shutting down; retry on another instance", code="server_shutting_down") from None
        await body.finish(relay_.error(ServiceUnavailable("the gateway is shutting down", code="server_shutting_down")))
    finally:
        body.close()
        if attempt is not None:
            call.done(attempt, outcome)
    return response


async def _pump(call: Call, attempt: Attempt, relay_: SSERelay, body: RelayBody) -> tuple[bool, bytes]:
    """Relay until the replica's stream ends: (False, ...) when it broke off; and the bytes
    the response ends with (`Body.finish`): the last events, or after a break the error event.

    What came with the replica's head is written first, with the headers (one write). Then
    `body.follow` relays the replica's reads (`RelayBody.relay`) and, when the client falls
    behind, writes what is held; a replica silent past the read timeout is `wire`'s."""
    call.usage = relay_.usage
    exchange = attempt.exchange
    body.feed = relay_.feed
    body.on_first = partial(_first_event, call, attempt)
    tail = b""
    try:
        await body.open()
        came = exchange.take()
        tail = relay_.feed(came) if came else b""
        if not exchange.complete:  # (complete: the whole answer came at once; it is all the tail)
            await body.write(tail)  # the headers, with the first events if they came
            if tail:
                body.wrote()
            tail = b""  # written: should `follow` raise, the break's handler has nothing left to send
            tail = await body.follow(exchange, exchange.parser)
        if tail:
            body.wrote()
        if relay_.done:
            return True, tail
        raise _Broken("the replica ended the stream before its end")
    except (_Broken, UpstreamClosed) as exc:
        reason = str(exc) if isinstance(exc, _Broken) else f"the replica's stream broke off: {exc}"
        error = ServiceUnavailable(f"{reason}; the answer is incomplete", code="upstream_unavailable")
        call.ctx.fail(error.code)
        if tail:  # the events that came before the break, in their own chunk as they came
            await body.write(tail)
            body.wrote()
        return False, relay_.error(error)
    finally:
        if not relay_.usage.billed:
            relay_.counted()


def _first_event(call: Call, attempt: Attempt, now: float) -> None:
    call.ctx.first_token(now)
    call.pool.series.ttft.observe(now - attempt.sent_at)


async def _error_body(exchange: Any) -> bytes:
    try:
        return await exchange.read()
    except UpstreamClosed:
        return b""


class _Broken(Exception):
    pass
