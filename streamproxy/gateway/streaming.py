"""Relaying a stream: headers once a replica answered, whole events, heartbeats, in-band errors.

The client's response is an `http.body.RelayBody`. Nothing is sent before a replica answered 200
(failover stays possible) unless that takes a heartbeat interval: the heartbeat then sends the headers
(`begun()`: later errors go in-band). The held head leaves in one write with the events that came with
the replica's (`Exchange.take`); after that events are written from the replica connection's data
callback while the client keeps up (`RelayBody.relay`), and when it falls behind reading pauses while
the handler writes what is held (`RelayBody.follow`). The last read goes out with the terminating chunk
(`Body.finish`): one client write per replica read. A replica that breaks off ends the stream with an
in-band `upstream_unavailable`.
A replica that breaks off a stream that may migrate (`call.resume`, resume.py) hands it to another
replica through the same body.
"""

from __future__ import annotations

import logging
from functools import partial
from typing import Any

from aiohttp import web

from streamproxy.apis.spec import Usage
from streamproxy.errors import APIError, ServiceUnavailable
from streamproxy.gateway import metrics as M
from streamproxy.gateway.call import BROKEN, Attempt, Call
from streamproxy.gateway.exchange import Exchange, UpstreamClosed
from streamproxy.gateway.relay import SSERelay
from streamproxy.gateway.resume import (
    COMPLETIONS,
    CONTINUE,
    CONTINUES,
    EXHAUSTED,
    FINISH_MARKER,
    FINISHED,
    NO_IDS,
    REFUSED,
    RESPONSES_KIND,
    Stream,
)
from streamproxy.gateway.upstream import UpstreamError
from streamproxy.http.body import RelayBody, WriteStalled, sse_response
from streamproxy.http.writer import client_gone

log = logging.getLogger("streamproxy.gateway")

# -- streaming ----------------------------------------------------------------------


class _Run:
    """The attempt a stream is on now, and its relay (a migration moves both on)."""

    __slots__ = ("attempt", "relay", "continued", "migrated")

    def __init__(self, attempt: Attempt, relay_: SSERelay) -> None:
        self.attempt: Attempt | None = attempt
        self.relay = relay_
        self.continued = False  # a continuation's usage is the stream record's (`Stream.totals`)
        self.migrated = False


def _relay(call: Call, kept: list[dict[str, Any]] | None = None) -> SSERelay:
    """The relay of an attempt; a migrating Responses stream's keeps the events its record lets through
    (`_Feed`), and a continuation's those of the attempts before (`kept`: its in-band error's response)."""
    responses = call.resume is not None and call.resume.blocks == RESPONSES_KIND
    relay_ = SSERelay(call.route.api, served=call.pool.deployment.upstream_model, public=call.public_model, strip_usage=call.strip_usage,
                      finishes=call.finishes, keep=not responses)
    if kept is not None:
        relay_.kept = kept
    return relay_


async def stream(request: web.Request, call: Call) -> web.StreamResponse:
    settings = call.state.settings
    api = call.route.api
    body = RelayBody(request, sse_response(request), api.keepalive, heartbeat=settings.sse_heartbeat,
                     stall=settings.write_stall_timeout)
    relay_ = _relay(call)
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
            run = _Run(attempt, relay_)
            try:
                ended, tail = await _pump(call, run, body)
            finally:
                attempt, relay_ = run.attempt, run.relay
                if run.migrated:
                    outcome = 200
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


async def _pump(call: Call, run: _Run, body: RelayBody) -> tuple[bool, bytes]:
    """Relay until the stream ends: (False, ...) when it broke off for good; and the bytes the
    response ends with (`Body.finish`): the last events, or after a break the error event.

    A replica that breaks off a stream that may migrate (`call.resume`) is left (its attempt ended
    as broken) and the stream goes on with another's answer (`_migrate`), through the same body."""
    resume = call.resume
    body.on_first = partial(_first_event, call, run)
    try:
        await body.open()
        while True:
            ended, tail, reason = await _follow(call, run, body)
            if resume is not None and resume.why is NO_IDS and run.attempt is not None:
                call.pool.without_token_ids(run.attempt.replica)
            if ended:
                return True, tail
            if resume is None:
                return False, _broken(call, run, reason)
            action, why = resume.plan()
            name = call.pool.deployment.name
            if action == FINISHED:  # the finish went out: the stream is whole but for its usage and [DONE]
                M.MIGRATIONS.labels(name, "finished").inc()
                return True, resume.ending()
            if action == REFUSED:
                M.MIGRATIONS.labels(name, "exhausted" if why == EXHAUSTED else "refused").inc()
                log.info("deployment %s: a stream broke off (%s) and is not migrated: %s", name, reason, why)
                return False, _broken(call, run, reason)
            if not await _migrate(call, run, body, action, reason):
                M.MIGRATIONS.labels(name, "failed").inc()
                return False, _broken(call, run, reason)
            M.MIGRATIONS.labels(name, "continued" if action == CONTINUE else "resent").inc()
    finally:
        _usage(call, run)


async def _follow(call: Call, run: _Run, body: RelayBody) -> tuple[bool, bytes, str]:
    """One attempt's stream: (True, its last events) when it ended, else (False, b"", why it broke off),
    what came before the break written.

    What came with the replica's head is written first (with the headers, the first time: one
    write). Then `body.follow` relays the replica's reads (`RelayBody.relay`) and, when the client
    falls behind, writes what is held; a replica silent past the read timeout is `wire`'s."""
    assert run.attempt is not None
    exchange = run.attempt.exchange
    relay_, resume = run.relay, call.resume
    if resume is not None and not resume.continuing:  # a `streamproxy serve` replica says so (resume.py)
        resume.replica(CONTINUES in exchange.headers)
    # The idle bound is for streams that can move on (a continuable one; else the read timeout's as before).
    idle = call.pool.deployment.migration.stream_idle_timeout if resume is not None and resume.why is None else 0.0
    body.feed = relay_.feed if resume is None else _Feed(relay_, resume, exchange, idle)
    tail = b""
    try:
        came = exchange.take()
        tail = body.feed(came) if came else b""
        if not exchange.complete:  # (complete: the whole answer came at once; it is all the tail)
            await body.write(tail)  # the headers, with the first events if they came
            if tail:
                body.wrote()
            tail = b""  # written: should `follow` raise, the break's handler has nothing left to send
            tail = await body.follow(exchange, exchange.parser)
        if resume is not None and resume.failed is not None:
            reason = f"the replica's stream ended with an error ({resume.failed.get('message', 'no message')})"
        elif relay_.done:
            if tail:
                body.wrote()
            return True, tail, ""
        else:
            reason = "the replica ended the stream before its end"
    except UpstreamClosed as exc:
        reason = f"the replica's stream broke off: {exc}"
    tail = b"".join(body.held) + tail  # the events that came before the break, in their own chunk as they came
    body.held.clear()
    if tail:
        await body.write(tail)
        body.wrote()
    return False, b"", reason


async def _migrate(call: Call, run: _Run, body: RelayBody, action: str, reason: str) -> bool:
    """The broken attempt ended, the stream's continuation (or the request itself: RESEND) sent to another
    replica; True when one answered 200 (then `run` is on it)."""
    resume = call.resume
    assert resume is not None and run.attempt is not None
    broken, run.attempt = run.attempt, None
    call.done(broken, BROKEN)
    log.info("deployment %s: %s broke off a stream (%s); %s", call.pool.deployment.name, broken.replica.url, reason,
             "continuing it on another replica" if action == CONTINUE else "sending it again (nothing had gone out)")
    serve = action == CONTINUE and resume.serve  # the same request with `continue_token_ids`, on a serve replica
    try:
        if action == CONTINUE:
            attempt = await call.open(call.route.upstream_path if serve else COMPLETIONS, resume.continuation(),
                                      migration="continue")
        else:
            attempt = await call.open(migration="resend")
    except APIError:
        return False
    exchange = attempt.exchange
    if exchange.status != 200 or (serve and CONTINUES not in exchange.headers):
        # (A replica that is not serve's would have answered the whole request again: not relayed.)
        if exchange.status != 200:
            await _error_body(exchange)
        else:
            exchange.finish(reuse=False)
        call.done(attempt, exchange.status if exchange.status != 200 else BROKEN)
        return False
    resume.migrating(action)
    call.ctx.migrated()
    run.attempt, run.relay, run.migrated = attempt, _relay(call, run.relay.kept if action == CONTINUE else None), True
    run.continued = run.continued or action == CONTINUE
    return True


def _broken(call: Call, run: _Run, reason: str) -> bytes:
    error = ServiceUnavailable(f"{reason}; the answer is incomplete", code="upstream_unavailable")
    call.ctx.fail(error.code)
    return run.relay.error(error, call.resume.client_sequence() if call.resume is not None else None)


def _usage(call: Call, run: _Run) -> None:
    """The call's usage: the last attempt's relay's (a resent request's is whole), or after a continuation
    (or a finish without usage) the stream record's: prompt tokens once, completion tokens all the client got."""
    resume, relay_ = call.resume, run.relay
    if resume is not None and (run.continued or (resume.finished and not relay_.usage.billed and resume.prompt is not None)):
        prompt, completion, cached = resume.totals()
        call.usage = Usage(prompt, completion, cached, billed=True)
        return
    if not relay_.usage.billed:
        relay_.counted()
    call.usage = relay_.usage


class _Feed:
    """A read's whole events (`SSERelay.feed`) through the stream's record (`Stream.feed`); the
    first events bound the replica's silence from then on (`stream_idle_timeout`)."""

    __slots__ = ("relay", "resume", "exchange", "idle", "keep")

    def __init__(self, relay_: SSERelay, resume: Stream, exchange: Exchange, idle: float) -> None:
        self.relay, self.resume, self.exchange, self.idle = relay_, resume, exchange, idle
        self.keep = resume.blocks == RESPONSES_KIND  # its relay keeps what the record lets through (`_relay`)

    def __call__(self, data: bytes) -> bytes:
        out = self.relay.feed(data)
        resume = self.resume
        # Per read: a passive stream's block skips the record until its finish chunk (two calls fewer).
        if not (resume.passive and not resume.finished and FINISH_MARKER not in out):
            out = resume.feed(out)
        if self.keep and out:
            self.relay.keep(out)
        if self.idle and out:
            self.exchange.bound_silence(self.idle)
            self.idle = 0.0
        return out


def _first_event(call: Call, run: _Run, now: float) -> None:
    call.ctx.first_token(now)
    if run.attempt is not None:
        call.pool.series.ttft.observe(now - run.attempt.sent_at)


async def _error_body(exchange: Any) -> bytes:
    try:
        return await exchange.read()
    except UpstreamClosed:
        return b""
