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
from streamproxy.gateway.push import Push
from streamproxy.gateway.relay import Api, SSERelay, Usage, error_event, keepalive
from streamproxy.gateway.state import GatewayState, gateway_state
from streamproxy.gateway.upstream import _CONNECT_ERRORS, Attempt, UpstreamError, open_upstream
from streamproxy.http.accesslog import Record, record
from streamproxy.http.metrics import SSE_HEARTBEATS
from streamproxy.http.nonstream import answer_nonstream
from streamproxy.http.routes.body import read_body
from streamproxy.http.writer import SSE_HEADERS, WriteStalled, can_write_direct, chunk_frame, client_gone, writable, write

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
    managed = state.managed.get(call.pool.deployment.name)
    if managed is not None:
        managed.lifecycle.begin(time.monotonic())
    try:
        if call.stream:
            return await _stream(request, call)
        return await _nonstream(request, call)
    finally:
        state.retries.active -= 1
        if managed is not None:
            managed.lifecycle.end(time.monotonic())
        _meter(call)


async def _prepare(request: web.Request, route: Route) -> Call:
    state = gateway_state(request)
    rec = record(request)
    rec.generation = route.generates
    key = state.identify(request)  # 401 before anything else: the body, the deployments
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
    limiter = state.authorize(key, deployment)
    managed = state.managed.get(deployment.name)
    if managed is not None:
        managed.admit()  # 503 deployment_waking / deployment_failed (and the wake), unless wait_for_wake
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
    keys = prefix_keys(data, policy.prefix_block_bytes) if route.generates and policy.affinity else []
    # Plain bytes from the replica: the gateway edits what it relays (renames, the usage chunk) and
    # passes bodies on without their Content-Encoding, so a compressed answer would reach the client garbled.
    headers = {"Content-Type": "application/json", "Accept-Encoding": "identity", "X-Request-Id": rec.request_id, **pool.upstream_headers}
    for name in _FORWARD:
        if name in request.headers:
            headers[name] = request.headers[name]
    return Call(state, pool, route, rec, limiter, orjson.dumps(data), headers, keys, public, stream, strip, Usage())


async def _open(call: Call) -> Attempt:
    managed = call.state.managed.get(call.pool.deployment.name)
    if managed is not None and not managed.lifecycle.serving:
        await managed.until_ready(call.state.settings.request_timeout)  # wait_for_wake
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
    warm = _Warmer(request, response, transport, keepalive(api), heartbeat, stall) if heartbeat else None
    attempt: Attempt | None = None
    outcome: int | None = None
    try:
        async with call.state.inflight.lifetime():
            try:
                attempt = await _open(call)
            except APIError as exc:
                if warm is not None:
                    await warm.stop()
                if not response.prepared:
                    raise  # a status of its own: nothing was sent yet
                await _end_with(response, transport, api, exc, stall)
                return response
            if warm is not None:
                await warm.stop()
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
        if warm is not None:
            warm.cancel()
        if attempt is not None:
            _done(call, attempt, outcome)
    return response


class _Warmer:
    """While no replica has answered: after `interval` s the headers go out, then a heartbeat
    every `interval` s, from a task of its own that only a slow answer ever starts. Before
    that nothing is sent, so failover stays possible and an error keeps its own status."""

    __slots__ = ("request", "response", "transport", "frame", "interval", "stall", "_handle", "_task")

    def __init__(self, request: web.Request, response: web.StreamResponse, transport: Any, frame: bytes, interval: float, stall: float) -> None:
        self.request, self.response, self.transport = request, response, transport
        self.frame, self.interval, self.stall = frame, interval, stall
        self._task: asyncio.Task[None] | None = None
        self._handle: asyncio.TimerHandle | None = asyncio.get_running_loop().call_later(interval, self._start)

    def _start(self) -> None:
        self._handle = None
        self._task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        await self.response.prepare(self.request)
        while True:
            await write(self.response, self.transport, self.frame, self.stall)
            await asyncio.sleep(self.interval)

    async def stop(self) -> None:
        """No more heartbeats; a failure while the headers went out (the client gone) is raised."""
        task = self._task
        self.cancel()
        if task is not None:
            await asyncio.wait([task])
            error = None if task.cancelled() else task.exception()
            if error is not None:
                raise error

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        if self._task is not None:
            self._task.cancel()
            self._task = None


async def _pump(call: Call, attempt: Attempt, response: web.StreamResponse, transport: Any, heartbeat: float | None, stall: float) -> bool:
    """Relay until the replica's stream ends; False when it broke off (an error event is sent).

    While the client keeps up, the replica's bytes are relayed from aiohttp's own data
    callback (`push.Push`: no task wake-up, no await, no timer per event). When that
    cannot be, or the client falls behind, this loop pulls with bounded writes. The
    heartbeat is one timer per stream (`_Heartbeat`); a replica silent past the read
    timeout is the client session's `sock_read` timeout."""
    api = call.route.api
    relay_ = SSERelay(api, served=call.pool.deployment.upstream_model, public=call.public_model, strip_usage=call.strip_usage)
    call.usage = relay_.usage
    reader = attempt.response.content
    direct = can_write_direct(response, transport)
    beat = _Heartbeat(transport, keepalive(api), heartbeat) if heartbeat and direct else None
    slow_beat = heartbeat if beat is None else None  # no direct writes: a timer around each read
    wrote = _Wrote(call, attempt, beat)
    try:
        if direct:
            push = Push(reader, relay_, transport, wrote)
            if push.start():
                try:
                    await push.woken
                finally:
                    push.let_go()
        while True:
            if slow_beat is None:
                chunk = await reader.readany()
            else:
                try:
                    async with asyncio.timeout(slow_beat):
                        chunk = await reader.readany()
                except TimeoutError:
                    await write(response, transport, keepalive(api), stall)
                    continue
            if not chunk:
                break
            out = relay_.feed(chunk)
            if out:
                if direct and writable(transport):
                    transport.write(chunk_frame(out))
                else:
                    await write(response, transport, out, stall)
                wrote()
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
        if beat is not None:
            beat.stop()
        if not relay_.usage.billed:
            relay_.counted()


class _Wrote:
    """After each write to the client: the heartbeat deadline, and the first event's times."""

    __slots__ = ("call", "attempt", "beat", "first")

    def __init__(self, call: Call, attempt: Attempt, beat: _Heartbeat | None) -> None:
        self.call, self.attempt, self.beat, self.first = call, attempt, beat, True

    def __call__(self) -> None:
        if self.beat is not None:
            self.beat.last = self.beat.loop.time()
        if self.first:
            self.first = False
            now = perf_counter()
            self.call.rec.first_token(now)
            M.UPSTREAM_TTFT.labels(self.call.pool.deployment.name).observe(now - self.attempt.sent_at)


class _Heartbeat:
    """A keepalive frame after `interval` seconds without a write, from one timer per stream.

    The timer fires once per interval and writes only if the stream was silent that
    long and the transport can take it; the relay loop just notes the time of each write."""

    __slots__ = ("transport", "frame", "interval", "loop", "last", "_handle")

    def __init__(self, transport: Any, frame: bytes, interval: float) -> None:
        self.transport = transport
        self.frame = chunk_frame(frame)
        self.interval = interval
        self.loop = asyncio.get_running_loop()
        self.last = self.loop.time()
        self._handle: asyncio.TimerHandle | None = self.loop.call_at(self.last + interval, self._fire)

    def _fire(self) -> None:
        now = self.loop.time()
        due = self.last + self.interval
        if now >= due and self.transport is not None and writable(self.transport):
            self.transport.write(self.frame)
            SSE_HEARTBEATS.inc()
            self.last, due = now, now + self.interval
        self._handle = self.loop.call_at(max(due, now + 0.001), self._fire)

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None


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
