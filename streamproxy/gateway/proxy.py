"""The relaying handler: one request in, one replica's answer out, metered.

The key (401) -> the body (413 over the cap; decoded by serve's rules: 400) -> the deployment (404) ->
the key may use it (401/429) -> its budget holds the worst case (429 insufficient_quota) -> model
renamed, usage asked for, priority read -> `Call.admit` (flow control: wait, or 429) -> `Call.open` (failover before the first byte) -> stream
(`streaming.stream`) or body (`answer_nonstream`). The body is re-encoded by msgspec (integers as they
were), with the client's `_FORWARD` headers. However it ends, the upstream response is closed (the
replica aborts) and the tokens are metered and charged (the end of `with call:`).

A request's priority band (vLLM's numbers, lower first) is its `X-Vllm-Priority` header, else its
body's `priority`, else its key's, else the deployment's `flow_control.priority` (400 when not an
integer); its tenant is its key (without keys: llm-d's `X-Gateway-Inference-Fairness-Id` header).
The body's `priority` goes to the replica only under `flow_control.scheduling_priority` (the band's
number); otherwise it is taken out (a replica not scheduling by priority refuses one).
"""

from __future__ import annotations

import asyncio
from functools import partial
from time import perf_counter
from typing import Any

import msgspec
from aiohttp import web

from streamproxy.apis.spec import OPENAI, Usage
from streamproxy.errors import APIError, GenerationTimeout, InvalidRequest, ServiceUnavailable
from streamproxy.gateway.call import BROKEN, Call, Route
from streamproxy.gateway.config import ApiKey, Deployment
from streamproxy.gateway.prefix import prefix_keys
from streamproxy.gateway.relay import meter_body
from streamproxy.gateway.resume import CONTINUED, Stream, parser_refusal, refusal
from streamproxy.gateway.scheduler import tokenize_request
from streamproxy.gateway.state import gateway_state
from streamproxy.gateway.streaming import stream
from streamproxy.gateway.upstream import CONNECT_ERRORS, UpstreamError
from streamproxy.http.context import CONTEXT
from streamproxy.http.nonstream import answer_nonstream
from streamproxy.http.routes.body import decode, read_body

_decode_json = msgspec.json.Decoder().decode
_encode_json = msgspec.json.Encoder().encode
# Request headers passed to the replica (the rest are the client's business with the gateway).
_FORWARD = {name.lower(): name for name in ("anthropic-version", "anthropic-beta", "OpenAI-Beta")}


async def relay(request: web.Request, route: Route) -> web.StreamResponse:
    with await _prepare(request, route) as call:
        await call.admit()
        if call.stream:
            return await stream(request, call)
        return await _nonstream(request, call)


async def _prepare(request: web.Request, route: Route) -> Call:
    state = gateway_state(request)
    ctx = request[CONTEXT]
    ctx.generation = route.generates
    key = state.identify(request)  # 401 before anything else: the body, the deployments
    # serve's decoding rules (its 400s for bodies that are not JSON, or nest too deep); msgspec keeps
    # integers past 64 bits exact (orjson made floats of them) and encodes whatever it decoded.
    raw = await read_body(request)
    data = decode(raw, _decode_json)
    if gateway_state(request) is not state:  # reloaded while the body came in: the new keys and deployments
        state = gateway_state(request)
        key = state.identify(request)
    if not isinstance(data, dict):
        raise InvalidRequest("the request body must be a JSON object")
    pool = state.resolve(data.get("model"), request.match_info.get("deployment"))
    deployment = pool.deployment
    ctx.routed(deployment.name)
    limiter = state.authorize(key, deployment)
    if key is not None and state.keyring:
        # A key's token budget holds this request's worst case until it ends (keyring.release_hold).
        ctx.hold = state.reserve(key, route.api, route.generates, data, len(raw))
    # 503 deployment_waking / deployment_failed / upstream_unavailable (and the wake), unless wait_for_wake
    state.sources[deployment.name].admit()
    model = data.get("model")
    public = model if isinstance(model, str) else deployment.name
    data["model"] = deployment.upstream_model
    # Only a generating route streams: embeddings, count_tokens, tokenize answer JSON whatever `stream` says.
    stream = route.generates and data.get("stream") is True
    ctx.stream = stream
    strip = False
    if stream and route.api is OPENAI and route.generates:
        # Asked for only where the client left it out (absent, null, false): a value the replica
        # refuses (`"stream_options": "x"`, `"include_usage": 0`) goes to it as the client sent it.
        options = data.get("stream_options")
        include = options.get("include_usage") if isinstance(options, dict) else None
        if (options is None or isinstance(options, dict)) and (include is None or include is False):
            data["stream_options"] = {**(options or {}), "include_usage": True}
            strip = True
    band = _priority(request, data, key[0] if key is not None else None, deployment) if route.generates else 0
    if route.generates:
        if deployment.flow_control.scheduling_priority and route.api is OPENAI:
            data["priority"] = band
        else:
            data.pop("priority", None)
    scheduler = state.schedulers[deployment.name]
    tokenize = tokenize_request(route.upstream_path, data) if route.generates and scheduler.subscribers else None
    salt = data.get("cache_salt")
    resume = None
    migration = deployment.migration
    if stream and migration.enabled and pool.token_ids and route.upstream_path in CONTINUED:
        # Stream migration (resume.py): the replica is asked for token ids, stripped unless the client asked.
        asked = data.get("return_token_ids")
        why = refusal(route.upstream_path, data)
        if why is None and asked in (None, False):
            data["return_token_ids"] = True
        resume = Stream(route.upstream_path, data, limit=migration.max_tracked_tokens, migrations=migration.max_migrations,
                        client_ids=asked is True, usage_chunk=not strip, why=why, vllm_why=parser_refusal(route.upstream_path, data))
    policy = state.policy
    keys = prefix_keys(data, policy.prefix_block_bytes) if route.generates and policy.affinity else []
    # Plain bytes from the replica: the gateway edits what it relays (renames, the usage chunk) and
    # passes bodies on without their Content-Encoding, so a compressed answer would reach the client garbled.
    headers = {"Content-Type": "application/json", "Accept-Encoding": "identity", "X-Request-Id": ctx.request_id, **pool.upstream_headers}
    if any(name in request.headers for name in _FORWARD.values()):  # three lookups, not a walk over every header
        _forward(request, headers)
    call = Call(state, pool, route, ctx, limiter, _encode_json(data), headers, keys, public, stream, strip, Usage(),
                resume=resume, tokenize=tokenize, cache_salt=salt if isinstance(salt, str) else None, band=band)
    if key is not None:
        call.tenant, call.weight = key[0].id, key[0].weight
    else:
        call.tenant = request.headers.get("X-Gateway-Inference-Fairness-Id", "-")
    call.cost = len(raw) / state.config.budgets.prompt_bytes_per_token
    return call


def _priority(request: web.Request, data: dict[str, Any], key: ApiKey | None, deployment: Deployment) -> int:
    """The request's priority band (see the module's comment); 400 when it is not an integer."""
    header = request.headers.get("X-Vllm-Priority")
    if header is not None:
        try:
            return int(header.strip())
        except ValueError:
            raise InvalidRequest(f"X-Vllm-Priority must be an integer, not {header!r}", param="priority") from None
    given = data.get("priority")
    if given is not None:
        if type(given) is not int:
            raise InvalidRequest("'priority' must be an integer", param="priority")
        return given
    if key is not None and key.priority is not None:
        return key.priority
    return deployment.flow_control.priority


def _forward(request: web.Request, headers: dict[str, str]) -> None:
    """The client's `_FORWARD` headers (the first of each) into `headers`, as the bytes it sent: latin-1
    maps each byte to one character and back when the request is written (`h1.request_bytes`), where
    the decoded value (UTF-8) could hold characters past Latin-1 and not be written at all."""
    for raw_name, raw_value in request.raw_headers:
        name = _FORWARD.get(raw_name.decode("latin-1").lower())
        if name is not None and name not in headers:
            headers[name] = raw_value.decode("latin-1")


# -- non-streaming --------------------------------------------------------------------


async def _nonstream(request: web.Request, call: Call) -> web.StreamResponse:
    settings = call.state.settings
    work = asyncio.ensure_future(_fetch(call))
    try:
        life = call.state.inflight.lifetime(settings.request_timeout, partial(_timed_out, settings.request_timeout))
        return await answer_nonstream(request, work, settings, life, call.ctx)
    finally:
        if not work.done():
            work.cancel()


def _timed_out(limit: float) -> APIError:
    return GenerationTimeout(f"the request did not finish within {limit:g} seconds")


async def _fetch(call: Call) -> bytes:
    attempt = await call.open()
    outcome: int | None = None
    try:
        exchange = attempt.exchange
        raw = await exchange.read()
        outcome = exchange.status
        if exchange.status != 200:
            raise UpstreamError(exchange.status, call.renamed(raw), exchange.headers.get("retry-after"))
        if call.route.generates:
            meter_body(call.route.api, raw, call.usage, call.finishes)
            call.ctx.first_token(perf_counter())
        return call.renamed(raw)
    except CONNECT_ERRORS:
        outcome = BROKEN
        raise ServiceUnavailable("the replica failed before it answered; retry", code="upstream_unavailable", retry_after=1) from None
    finally:
        call.done(attempt, outcome)
