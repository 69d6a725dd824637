"""One relayed request (`Call`), and what every way of relaying it shares: sending it
(`open_call`: failover before the first byte) and ending it (`done`: the replica's
health and counts, `meter`: the tokens into the access log, the metrics and the key's
limits). The relaying itself is `proxy` (the body) and `streaming` (the stream).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import orjson

from streamproxy.apis.spec import ApiSpec, Usage
from streamproxy.gateway import metrics as M
from streamproxy.gateway.balance import Pool
from streamproxy.gateway.limits import KeyLimiter
from streamproxy.gateway.state import GatewayState
from streamproxy.gateway.upstream import Attempt, open_upstream
from streamproxy.http import tracing
from streamproxy.http.accesslog import Record


@dataclass(frozen=True, slots=True)
class Route:
    upstream_path: str  # the replica's path for it
    api: ApiSpec
    generates: bool  # prefix affinity and token metering apply, and `"stream": true` streams (else the answer is JSON)


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


async def open_call(call: Call) -> Attempt:
    source = call.state.sources[call.pool.deployment.name]
    if not source.serving:
        await source.until_ready(call.state.settings.request_timeout)  # wait_for_wake
    attempt = await open_upstream(call.state, call.pool, call.route.upstream_path, call.body, call.headers, call.keys, call.rec)
    M.ADDED_LATENCY.observe(attempt.sent_at - call.rec.start)
    return attempt


# -- the end of every request ---------------------------------------------------------


BROKEN = 502  # the outcome of a stream the replica broke off


def done(call: Call, attempt: Attempt, outcome: int | None) -> None:
    """`outcome`: the replica's status, `BROKEN`, or None when the client left first."""
    attempt.release(ok=None if outcome is None else outcome < 500)
    if attempt.span is not None and tracing.TRACER is not None:
        tracing.TRACER.end_attempt(attempt.span, attempt.exchange.status, "broken" if outcome == BROKEN else None)
    usage = call.usage
    if usage.billed:
        call.pool.observed_cache(attempt.replica, call.keys, attempt.matched, usage.prompt_tokens, usage.cached_tokens)
    attempt.replica.series.requests(str(outcome) if outcome is not None else "client_gone").inc()


def meter(call: Call) -> None:
    if not call.route.generates:
        return
    usage, rec = call.usage, call.rec
    rec.usage_source = "billed" if usage.billed else "counted"
    rec.prompt_tokens = usage.prompt_tokens if usage.billed else None
    rec.cached_tokens = usage.cached_tokens if usage.billed else None
    rec.completion_tokens = usage.completion_tokens
    series = call.pool.series
    if usage.prompt_tokens:
        series.prompt_tokens.inc(usage.prompt_tokens)
    if usage.cached_tokens:
        series.cached_tokens.inc(usage.cached_tokens)
    if usage.completion_tokens:
        series.completion_tokens.inc(usage.completion_tokens)
    if call.limiter is not None:
        call.limiter.charge(time.monotonic(), usage.prompt_tokens + usage.completion_tokens)
