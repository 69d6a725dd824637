"""The relaying handlers: one request in, one replica's answer out, metered.

    read the body (413 over the cap)  ->  find the deployment (model or path id)
    ->  the key may use it (401/429)  ->  model renamed, usage asked for
    ->  open_upstream (failover before the first byte)  ->  stream or body

A stream's headers go out once a replica answered 200 (or after one
heartbeat interval of waiting, so the client hears something); from then on
`SSERelay` passes whole events, the gateway's heartbeat fills the replica's
silences, and a replica that breaks off mid-stream ends the client's stream
with an in-band `upstream_unavailable` event. A non-streaming answer goes
through the edge's `respond_nonstream` (early 200 and newlines when slow,
late errors in the body). Whatever way the request ends, `finally` closes
the upstream response, which is what makes the replica abort, meters the
tokens (the replica's usage, or the events counted when it sent none) and
charges the key.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from functools import partial
from time import perf_counter
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from streamproxy.errors import APIError, GenerationTimeout, InvalidJSON, InvalidRequest, ServiceUnavailable
from streamproxy.gateway import metrics as M
from streamproxy.gateway.balance import Pool
from streamproxy.gateway.limits import KeyLimiter
from streamproxy.gateway.prefix import prefix_keys
from streamproxy.gateway.relay import Api, SSERelay, Usage, error_event, keepalive
from streamproxy.gateway.state import GatewayState, gateway_state
from streamproxy.gateway.upstream import _CONNECT_ERRORS, Attempt, UpstreamError, open_upstream
from streamproxy.http.accesslog import Record, record
from streamproxy.http.nonstream import answer_nonstream
from streamproxy.http.routes.body import read_body
from streamproxy.http.writer import SSE_HEADERS, WriteStalled, client_gone, write

# Request headers passed to the replica (the rest are the client's business with the gateway).
_FORWARD = ("anthropic-version", "anthropic-beta", "OpenAI-Beta")


@dataclass(frozen=True, slots=True)
class Route:
    upstream_path: str  # the replica's path for it
    api: Api
    generates: bool  # prefix affinity and token metering apply


@dataclass(slots=True)
class Call:
    """One relayed request: what was asked and where it went."""

    state: GatewayState
    pool: Pool
    route: Route
    rec: Record
    limiter: KeyLimiter | None
    body: bytes
    headers: dict[str, str]
    keys: list[int]
    public_model: str
    stream: bool
    strip_usage: bool
    usage: Usage

    def renamed(self, raw: bytes) -> bytes:
        served, public = self.pool.deployment.upstream_model, self.public_model
        if served == public:
            return raw
        for colon in (b":", b": "):
            raw = raw.replace(b'"model"' + colon + orjson.dumps(served), b'"model"' + colon + orjson.dumps(public))
        return raw


async def relay(request: web.Request, route: Route) -> web.StreamResponse:
    call = await _prepare(request, route)
    state = call.state
    state.retries.active += 1
    try:
        if call.stream:
            return await _stream(request, call)
        return await _nonstream(request, call)
    finally:
        state.retries.active -= 1
        _meter(call)


async def _prepare(request: web.Request, route: Route) -> Call:
    state = gateway_state(request)
    rec = record(request)
    rec.generation = route.generates
    body = await read_body(request)
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidJSON(f"the request body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise InvalidRequest("the request body must be a JSON object")
    pool = state.resolve(data.get("model"), request.match_info.get("deployment"))
    deployment = pool.deployment
    rec.deployment = rec.model = deployment.name
    limiter = state.authorize(request, deployment)
    model = data.get("model")
    public = model if isinstance(model, str) else deployment.name
    data["model"] = deployment.upstream_model
    stream = data.get("stream") is True
    rec.stream = stream
    strip = False
    if stream and route.api is Api.OPENAI and route.generates:
        options = data.get("stream_options")
        options = options if isinstance(options, dict) else {}
        if not options.get("include_usage"):
            data["stream_options"] = {**options, "include_usage": True}
            strip = True
    policy = state.policy
    keys = prefix_keys(data, policy.prefix_block_bytes) if route.generates and policy.prefix_affinity else []
    # Plain bytes from the replica: the gateway edits what it relays (renames, the usage chunk) and
    # passes bodies on without their Content-Encoding, so a compressed answer would reach the client garbled.
    headers = {"Content-Type": "application/json", "Accept-Encoding": "identity", "X-Request-Id": rec.request_id, **pool.upstream_headers}
    for name in _FORWARD:
        if name in request.headers:
            headers[name] = request.headers[name]
    return Call(state, pool, route, rec, limiter, orjson.dumps(data), headers, keys, public, stream, strip, Usage())


async def _open(call: Call) -> Attempt:
    attempt = await open_upstream(call.state, call.pool, call.route.upstream_path, call.body, call.headers, call.keys, call.rec)
    M.ADDED_LATENCY.observe(attempt.sent_at - call.rec.start)
    return attempt


# -- non-streaming --------------------------------------------------------------------


async def _nonstream(request: web.Request, call: Call) -> web.StreamResponse:
    settings = call.state.settings
    work = asyncio.ensure_future(_fetch(call))
    try:
        life = call.state.inflight.lifetime(settings.request_timeout, partial(_timed_out, settings.request_timeout))
        return await answer_nonstream(request, work, settings, life, call.rec)
    finally:
        if not work.done():
            work.cancel()


def _timed_out(limit: float) -> APIError:
    return GenerationTimeout(f"the request did not finish within {limit:g} seconds")


async def _fetch(call: Call) -> bytes:
    attempt = await _open(call)
    outcome: int | None = None
    try:
        response = attempt.response
        raw = await response.read()
        outcome = response.status
        if response.status != 200:
            raise UpstreamError(response.status, call.renamed(raw), response.headers.get("Retry-After"))
        if call.route.generates:
            call.usage.take_body(raw)
            call.rec.first_token(perf_counter())
        return call.renamed(raw)
    except _CONNECT_ERRORS:
        outcome = _BROKEN
        raise ServiceUnavailable("the replica failed before it answered; retry", code="upstream_unavailable", retry_after=1) from None
    finally:
        _done(call, attempt, outcome)


# -- streaming ----------------------------------------------------------------------


async def _stream(request: web.Request, call: Call) -> web.StreamResponse:
    settings = call.state.settings
    api = call.route.api
    heartbeat = settings.sse_heartbeat if settings.sse_heartbeat > 0 else None
    stall = settings.write_stall_timeout
    response = web.StreamResponse(headers=SSE_HEADERS)
    transport = request.transport
    opening = asyncio.ensure_future(_open(call))
    attempt: Attempt | None = None
    outcome: int | None = None
    try:
        async with call.state.inflight.lifetime():
            try:
                attempt = await _answer(request, opening, response, transport, api, heartbeat, stall)
            except APIError as exc:
                if not response.prepared:
                    raise  # a status of its own: nothing was sent yet
                await _end_with(response, transport, api, exc, stall)
                return response
            upstream = attempt.response
            outcome = upstream.status
            if upstream.status != 200:
                refused = UpstreamError(upstream.status, call.renamed(await upstream.read()), upstream.headers.get("Retry-After"))
                if not response.prepared:
                    raise refused
                await _end_with(response, transport, api, refused, stall)
                return response
            if not response.prepared:
                await response.prepare(request)
            if not await _pump(call, attempt, response, transport, heartbeat, stall):
                outcome = _BROKEN
        await response.write_eof()
    except (WriteStalled, ConnectionResetError) as exc:
        client_gone(request, exc, call.rec)
    except TimeoutError:  # the drain deadline (the Lifetime)
        if not response.prepared:
            raise ServiceUnavailable("the gateway is shutting down; retry on another instance", code="server_shutting_down") from None
        await _end_with(response, transport, api, ServiceUnavailable("the gateway is shutting down", code="server_shutting_down"), stall)
    finally:
        if attempt is None:
            attempt = _abandon(opening)
        if attempt is not None:
            _done(call, attempt, outcome)
    return response


async def _answer(
    request: web.Request, opening: asyncio.Future[Attempt], response: web.StreamResponse, transport: Any, api: Api,
    heartbeat: float | None, stall: float,
) -> Attempt:
    """The replica's answer. Nothing is sent before it (failover stays possible), unless it
    takes longer than a heartbeat interval: then the headers go out, and heartbeats meanwhile."""
    try:
        return await asyncio.wait_for(asyncio.shield(opening), heartbeat)
    except TimeoutError:
        pass
    await response.prepare(request)
    while True:
        await write(response, transport, keepalive(api), stall)
        try:
            return await asyncio.wait_for(asyncio.shield(opening), heartbeat)
        except TimeoutError:
            continue


def _abandon(opening: asyncio.Future[Attempt]) -> Attempt | None:
    """The handler is leaving before it took the replica's answer: stop waiting, or take it to close it."""
    if not opening.done():
        opening.cancel()
        return None
    if opening.cancelled() or opening.exception() is not None:
        return None
    return opening.result()


async def _pump(call: Call, attempt: Attempt, response: web.StreamResponse, transport: Any, heartbeat: float | None, stall: float) -> bool:
    """Relay until the replica's stream ends; False when it broke off (an error event is sent)."""
    api = call.route.api
    relay_ = SSERelay(api, served=call.pool.deployment.upstream_model, public=call.public_model, strip_usage=call.strip_usage)
    call.usage = relay_.usage
    reader = attempt.response.content
    read_timeout = call.state.policy.read_timeout or call.state.settings.request_timeout
    silent = 0.0
    first = True
    beat = keepalive(api)
    try:
        while True:
            try:
                async with asyncio.timeout(heartbeat):
                    chunk = await reader.readany()
            except TimeoutError:
                silent += heartbeat or 0.0
                if silent >= read_timeout:
                    raise _Broken("the replica was silent for longer than the read timeout") from None
                await write(response, transport, beat, stall)
                continue
            if not chunk:
                break
            silent = 0.0
            if first:
                first = False
                now = perf_counter()
                call.rec.first_token(now)
                M.UPSTREAM_TTFT.labels(call.pool.deployment.name).observe(now - attempt.sent_at)
            out = relay_.feed(chunk)
            if out:
                await write(response, transport, out, stall)
        if relay_.done:
            return True
        raise _Broken("the replica ended the stream before its end")
    except (_Broken, aiohttp.ClientPayloadError, aiohttp.ClientConnectionError, OSError) as exc:
        if isinstance(exc, ConnectionResetError) and _client_closed(transport):
            raise
        reason = str(exc) if isinstance(exc, _Broken) else f"the replica's stream broke off ({type(exc).__name__})"
        error = ServiceUnavailable(f"{reason}; the answer is incomplete", code="upstream_unavailable")
        call.rec.error_code = error.code
        await write(response, transport, error_event(api, error, relay_.events), stall)
        return False
    finally:
        if not relay_.usage.billed:
            relay_.counted()


class _Broken(Exception):
    pass


def _client_closed(transport: Any) -> bool:
    return transport is None or transport.is_closing()


async def _end_with(response: web.StreamResponse, transport: Any, api: Api, exc: APIError, stall: float) -> None:
    await write(response, transport, error_event(api, exc), stall)
    await response.write_eof()


# -- the end of every request ---------------------------------------------------------


_BROKEN = 502  # the outcome of a stream the replica broke off


def _done(call: Call, attempt: Attempt, outcome: int | None) -> None:
    """`outcome`: the replica's status, `_BROKEN`, or None when the client left first."""
    attempt.release(ok=None if outcome is None else outcome < 500)
    usage = call.usage
    if usage.billed:
        call.pool.observed_cache(attempt.replica, call.keys, attempt.matched, usage.prompt_tokens, usage.cached_tokens)
    M.REQUESTS.labels(call.pool.deployment.name, attempt.replica.url, str(outcome) if outcome is not None else "client_gone").inc()


def _meter(call: Call) -> None:
    if not call.route.generates:
        return
    usage, rec = call.usage, call.rec
    rec.usage_source = "billed" if usage.billed else "counted"
    rec.prompt_tokens = usage.prompt_tokens if usage.billed else None
    rec.cached_tokens = usage.cached_tokens if usage.billed else None
    rec.completion_tokens = usage.completion_tokens
    name = call.pool.deployment.name
    if usage.prompt_tokens:
        M.TOKENS.labels(name, "prompt").inc(usage.prompt_tokens)
    if usage.cached_tokens:
        M.TOKENS.labels(name, "cached").inc(usage.cached_tokens)
    if usage.completion_tokens:
        M.TOKENS.labels(name, "completion").inc(usage.completion_tokens)
    if call.limiter is not None:
        call.limiter.charge(time.monotonic(), usage.prompt_tokens + usage.completion_tokens)
