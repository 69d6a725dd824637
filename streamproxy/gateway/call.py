"""One relayed request (`Call`) and its tries on replicas (`Attempt`): what every way of relaying shares.

`with call:` counts it on the deployment, its source and the retry budget; at its end the tokens go to
the context, the metrics and the key's limit. `open` fails over before the first byte: one replica at a
time (`Pool.choose`, never one tried), moving on after a connect error, a timeout before the headers or
a retryable status while the retry budget and `num_retries` allow; none left: 503
`upstream_unavailable` + Retry-After, or the last replica's own 429/503. An `Attempt`'s `end` is the one
place its outcome is recorded (counts, health, breaker, span, connection reuse or close). The relaying
itself is `proxy` (the body) and `streaming` (the stream).
A migrated stream has more than one answered attempt: `tried` (their replicas) is never chosen again,
and `open(path, body)` sends a stream's continuation instead of the request.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from time import perf_counter
from types import TracebackType
from typing import Any

import orjson

from streamproxy.apis.spec import ApiSpec, Usage
from streamproxy.errors import ServiceUnavailable
from streamproxy.gateway import metrics as M
from streamproxy.gateway.balance import Pool, Replica
from streamproxy.gateway.exchange import Exchange, UpstreamClosed
from streamproxy.gateway.flowcontrol import Ticket
from streamproxy.gateway.kv_index import PromptKeys
from streamproxy.gateway.limits import KeyLimiter
from streamproxy.gateway.resume import Stream
from streamproxy.gateway.state import GatewayState
from streamproxy.gateway.upstream import CONNECT_ERRORS, UpstreamError, ask, read_error
from streamproxy.http import tracing
from streamproxy.http.context import RequestContext

log = logging.getLogger("streamproxy.gateway")

BROKEN = 502  # the outcome of a stream the replica broke off


@dataclass(frozen=True, slots=True)
class Route:
    upstream_path: str  # the replica's path for it
    api: ApiSpec
    generates: bool  # prefix affinity and token metering apply, and `"stream": true` streams (else the answer is JSON)


@dataclass(slots=True)
class Call:
    """One relayed request: what was asked, where it went, what it cost."""

    state: GatewayState
    pool: Pool
    route: Route
    ctx: RequestContext
    limiter: KeyLimiter | None
    body: bytes
    headers: dict[str, str]
    keys: list[int]
    public_model: str
    stream: bool
    strip_usage: bool
    usage: Usage
    finishes: dict[int, str] = field(default_factory=dict)  # why each choice ended, as the replicas said (relay.py)
    resume: Stream | None = None  # a stream that may migrate: its record (resume.py)
    attempts: list[Attempt] = field(default_factory=list)
    tried: set[str] = field(default_factory=set)  # the replicas its attempts went to
    # Issue 35 (scheduler.py): what turns the prompt into token ids, if KV events route it; its ids once known.
    tokenize: bytes | list[int] | None = None
    cache_salt: str | None = None
    prompt: PromptKeys | None = None
    # Flow control: the request's tenant (its key), priority band, weight and estimated cost; its place once admitted.
    tenant: str = "-"
    band: int = 0
    weight: float = 1.0
    cost: float = 1.0
    ticket: Ticket | None = None

    def renamed(self, raw: bytes) -> bytes:
        served, public = self.pool.deployment.upstream_model, self.public_model
        if served == public:
            return raw
        for colon in (b":", b": "):
            raw = raw.replace(b'"model"' + colon + orjson.dumps(served), b'"model"' + colon + orjson.dumps(public))
        return raw

    # -- its life on the deployment -------------------------------------------------------
    def __enter__(self) -> Call:
        self.state.retries.active += 1
        self.pool.active += 1  # no await since `resolve` chose it: a reload sees this request on its deployment
        self.state.sources[self.pool.deployment.name].begin(time.monotonic())
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        state, pool = self.state, self.pool
        state.retries.active -= 1
        state.sources[pool.deployment.name].end(time.monotonic())
        self._meter()
        if self.ticket is not None:
            usage = self.usage
            spent = usage.prompt_tokens + usage.completion_tokens
            state.schedulers[pool.deployment.name].release(self.ticket, float(spent) if spent else None)
        pool.active -= 1
        state.request_ended(pool)  # a deployment a reload removed stops after its last request

    def _meter(self) -> None:
        if not self.route.generates:
            return
        usage, finishes = self.usage, self.finishes
        reasons = [finishes[index] for index in sorted(finishes)] if finishes else ()
        if usage.billed:
            self.ctx.usage(usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens, reasons, source="billed")
        else:
            self.ctx.usage(None, usage.completion_tokens, None, reasons, source="counted")
        series = self.pool.series
        if usage.prompt_tokens:
            series.prompt_tokens.inc(usage.prompt_tokens)
        if usage.cached_tokens:
            series.cached_tokens.inc(usage.cached_tokens)
        if usage.completion_tokens:
            series.completion_tokens.inc(usage.completion_tokens)
        if self.limiter is not None:
            self.limiter.charge(time.monotonic(), usage.prompt_tokens + usage.completion_tokens)

    async def admit(self) -> None:
        """A place on a saturated deployment (flow control), waited for in the request's tenant and band; 429 if refused."""
        if self.route.generates:
            scheduler = self.state.schedulers[self.pool.deployment.name]
            self.ticket = await scheduler.admit(self.tenant, self.band, self.cost, self.weight)

    # -- its attempts -----------------------------------------------------------------------
    async def open(self, path: str | None = None, body: bytes | None = None, migration: str | None = None) -> Attempt:
        """The first answer not retried, open (see the module's comment); `path` and `body`: a stream's
        continuation's (on a replica none of its attempts went to yet), instead of the request's;
        `migration`: the attempt carries a broken stream on (`continue` or `resend`, its span says)."""
        state, pool = self.state, self.pool
        source = state.sources[pool.deployment.name]
        if not source.serving:
            await source.until_ready(state.settings.request_timeout)  # wait_for_wake
        upstreams, budget = state.upstreams, state.retries
        assert upstreams is not None
        tls = state.tls.get(pool.deployment.name)
        scheduler = state.schedulers[pool.deployment.name]
        if self.tokenize is not None and self.prompt is None and scheduler.publishing:
            self.prompt = await scheduler.prompt(upstreams, self.tokenize, self.cache_salt, pool.upstream_headers, tls)
        tried = self.tried
        path = path or self.route.upstream_path
        body = self.body if body is None else body
        last: UpstreamError | None = None
        retrying = False
        try:
            for retry in range(state.policy.num_retries + 1):
                now = time.monotonic()
                replica, matched, predicted = scheduler.choose(self.prompt, self.keys, tried, now)
                if replica is None:
                    break
                if retry:
                    if not budget.allows():
                        break
                    if not retrying:
                        budget.retrying += 1
                        retrying = True
                tried.add(replica.url)
                attempt = Attempt(self, replica, matched, retry, migration)
                attempt.predicted = predicted
                self.attempts.append(attempt)
                scheduler.dispatched(replica, self.prompt, now)
                try:
                    exchange = await ask(upstreams, replica.url, path, body, attempt.headers, tls)
                except CONNECT_ERRORS as exc:
                    attempt.end(False, error=type(exc).__name__)
                    if isinstance(exc, UpstreamClosed) and exc.tls:  # a setting to fix, not a blip: say why
                        log.warning("deployment %s: upstream %s refused: %s; trying another", pool.deployment.name, replica.url, exc)
                    else:
                        log.info("deployment %s: %s did not answer (%s); trying another", pool.deployment.name, replica.url,
                                 type(exc).__name__)
                    pool.series.retries("connect_failure").inc()
                    continue
                except BaseException:
                    attempt.end(None, error="cancelled")
                    raise
                pool.series.ttfb.observe(perf_counter() - attempt.sent_at)
                status = exchange.status
                if status in state.policy.retry_on_status:
                    attempt.end(False if status >= 500 else None, status)
                    pool.series.retries(str(status)).inc()
                    last = UpstreamError(status, await read_error(exchange), exchange.headers.get("retry-after"))
                    continue
                attempt._answer = exchange
                M.ADDED_LATENCY.observe(attempt.sent_at - self.ctx.start)
                return attempt
        finally:
            if retrying:
                budget.retrying -= 1
        if last is not None:
            raise last
        raise ServiceUnavailable(
            f"no replica of deployment `{pool.deployment.name}` can take the request now; retry shortly",
            code="upstream_unavailable",
            retry_after=pool.retry_after(time.monotonic()),
        )

    def done(self, attempt: Attempt, outcome: int | None) -> None:
        """The answered attempt is over. `outcome`: the replica's status, `BROKEN`, or None when the client left first."""
        attempt.end(None if outcome is None else outcome < 500, attempt.status, "broken" if outcome == BROKEN else None)
        usage = self.usage
        if usage.billed:
            self.pool.observed_cache(attempt.replica, self.keys, attempt.matched, usage.prompt_tokens, usage.cached_tokens)
            if attempt.predicted is not None:
                self.state.schedulers[self.pool.deployment.name].observed(attempt.replica, attempt.predicted,
                                                                          usage.prompt_tokens, usage.cached_tokens)
        attempt.replica.series.requests(str(outcome) if outcome is not None else "client_gone").inc()


class Attempt:
    """One try of a call on one replica, counted on it from its start to its `end`."""

    __slots__ = ("pool", "replica", "matched", "predicted", "prompt", "scheduler", "headers", "span", "sent_at", "_answer",
                 "ended")

    def __init__(self, call: Call, replica: Replica, matched: int, retry: int, migration: str | None = None) -> None:
        self.pool, self.replica, self.matched = call.pool, replica, matched  # matched: prefix keys the replica held
        self.predicted: int | None = None  # prompt tokens its KV events said it held (None: not routed by them)
        self.prompt = call.prompt  # (its speculative blocks end with it)
        self.scheduler = call.state.schedulers[call.pool.deployment.name]
        self._answer: Exchange | None = None
        self.ended = False
        call.ctx.tried(replica.url)  # a request abandoned while a replica holds it is logged with that replica
        call.pool.dispatched(replica, call.keys)
        replica.series.in_flight.inc()
        self.headers = call.headers
        self.span: Any = None
        if call.ctx.span is not None and tracing.TRACER is not None:  # the replica's spans are this attempt's children
            self.span = tracing.TRACER.attempt(call.ctx.span, call.pool.deployment.name, replica.url, retry, migration)
            self.headers = {**call.headers, **tracing.TRACER.headers(self.span)}
        self.sent_at = perf_counter()

    @property
    def exchange(self) -> Exchange:
        """The answer (of an attempt `Call.open` returned)."""
        assert self._answer is not None
        return self._answer

    @property
    def status(self) -> int | None:
        return self._answer.status if self._answer is not None else None

    def end(self, ok: bool | None, status: int | None = None, error: str | None = None) -> None:
        """Over on this replica (once): `ok` is what it says of the replica's health (None: nothing);
        `status` its answer's and `error` what went wrong, for the span."""
        if self.ended:
            return
        self.ended = True
        pool, replica = self.pool, self.replica
        pool.completed(replica)
        if self.prompt is not None:
            self.scheduler.ended(replica, self.prompt, time.monotonic())
        series, health = replica.series, replica.health
        series.in_flight.dec()
        if ok:
            health.succeeded()
        elif ok is None:
            health.trial = False
        elif health.failed(time.monotonic()):
            log.warning("deployment %s: upstream %s ejected for %.0f s", pool.deployment.name, replica.url,
                        health.ejected_until - time.monotonic())
            M.EJECTIONS.labels(pool.deployment.name, replica.url).inc()
        series.breaker.set(int(health.breaker))
        if self.span is not None and tracing.TRACER is not None:
            tracing.TRACER.end_attempt(self.span, status, error)
        if self._answer is not None:
            # Read to the end: the connection goes back to the pool (nginx `keepalive`); a stream still
            # open is closed, which is how the replica learns to abort.
            self._answer.finish(reuse=bool(ok))
