"""Sending a request to a replica, with failover before the first byte.

`open_upstream` tries replicas one at a time (`Pool.choose`, never one this
request already tried): a connect error, a timeout before the response
headers, or a retryable status (503, 429 by default) moves on to another
replica, while Envoy's retry budget and `num_retries` allow. The first
response that is not retried comes back open, with its replica counted as
busy until `Attempt.release`. When no replica can take the request the
answer is 503 `upstream_unavailable` with a Retry-After, or, if the last
replica answered 429/503 itself, that answer (its Retry-After passed on).

`UpstreamError` carries a replica's own error answer (status, body,
Retry-After) through to the client unchanged: the client's mistakes (400,
404, context too long) come back as the replica said them. The connection
itself is `wire`'s (with the deployment's `tls` for an https:// replica: a
failed handshake is a connect failure, logged as a warning with its reason).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from time import perf_counter
from typing import Any

from streamproxy.errors import APIError, ServiceUnavailable
from streamproxy.gateway import metrics as M
from streamproxy.gateway.balance import Pool, Replica
from streamproxy.gateway.state import GatewayState
from streamproxy.gateway.upstream_tls import ClientTLS
from streamproxy.gateway.wire import Exchange, UpstreamClosed, Upstreams
from streamproxy.http import tracing
from streamproxy.http.accesslog import Record

log = logging.getLogger("streamproxy.gateway")

_CONNECT_ERRORS = (UpstreamClosed, OSError, asyncio.TimeoutError)


class UpstreamError(APIError):
    """A replica's error answer, relayed as it is."""

    def __init__(self, status: int, body: bytes, retry_after: str | None) -> None:
        super().__init__(f"the replica answered {status}", status=status)
        self.raw = body
        self.retry_after_header = retry_after
        self.code = "upstream_error"

    def to_json(self) -> bytes:
        return self.raw

    def headers(self) -> dict[str, str]:
        return {"Retry-After": self.retry_after_header} if self.retry_after_header else {}


@dataclass(eq=False)
class Attempt:
    pool: Pool
    replica: Replica
    exchange: Exchange
    matched: int  # prefix keys the replica held
    sent_at: float
    keys: list[int] = field(default_factory=list)
    released: bool = False
    span: Any = None  # --otlp-traces-endpoint: this attempt's span, ended by `call.done`

    def release(self, *, ok: bool | None, now: float | None = None) -> None:
        """The request is over on this replica: counts, and health (None: says nothing of it)."""
        if self.released:
            return
        self.released = True
        self.pool.completed(self.replica)
        series = self.replica.series
        series.in_flight.dec()
        health = self.replica.health
        if ok:
            health.succeeded()
        elif ok is None:
            health.trial = False
        elif health.failed(time.monotonic() if now is None else now):
            _ejected(self.pool, self.replica)
        series.breaker.set(int(health.breaker))
        # Read to the end: the connection goes back to the pool (nginx `keepalive`); a stream still
        # open is closed, which is how the replica learns to abort.
        self.exchange.finish(reuse=bool(ok))


def _ejected(pool: Pool, replica: Replica) -> None:
    log.warning("deployment %s: upstream %s ejected for %.0f s", pool.deployment.name, replica.url, replica.health.ejected_until - time.monotonic())
    M.EJECTIONS.labels(pool.deployment.name, replica.url).inc()


async def open_upstream(
    state: GatewayState, pool: Pool, path: str, body: bytes, headers: dict[str, str], keys: list[int],
    record: Record | None = None,
) -> Attempt:
    """The first answer not retried, open; `record.upstream` names the replica of each attempt as it is
    sent (so a request abandoned while a replica holds it is logged with that replica)."""
    policy = state.policy
    upstreams = state.upstreams
    assert upstreams is not None
    tried: set[str] = set()
    last: UpstreamError | None = None
    budget = state.retries
    retrying = False
    tls = state.tls.get(pool.deployment.name)
    parent = record.span if record is not None else None
    span: Any = None
    try:
        for attempt in range(policy.num_retries + 1):
            now = time.monotonic()
            replica, matched = pool.choose(keys, tried, now)
            if replica is None:
                break
            if attempt:
                if not budget.allows():
                    break
                if not retrying:
                    budget.retrying += 1
                    retrying = True
            tried.add(replica.url)
            if record is not None:
                record.upstream = replica.url
            pool.dispatched(replica, keys)
            replica.series.in_flight.inc()
            sent = perf_counter()
            sending = headers
            if parent is not None and tracing.TRACER is not None:  # the replica's spans are this attempt's children
                span = tracing.TRACER.attempt(parent, pool.deployment.name, replica.url, attempt)
                sending = {**headers, **tracing.TRACER.headers(span)}
            try:
                exchange = await ask(upstreams, replica.url, path, body, sending, tls)
            except _CONNECT_ERRORS as exc:
                if span is not None:
                    _end_span(span, None, type(exc).__name__)
                    span = None
                _settle(pool, replica, failed=True)
                if isinstance(exc, UpstreamClosed) and exc.tls:  # a setting to fix, not a blip: say why
                    log.warning("deployment %s: upstream %s refused: %s; trying another", pool.deployment.name, replica.url, exc)
                else:
                    log.info("deployment %s: %s did not answer (%s); trying another", pool.deployment.name, replica.url, type(exc).__name__)
                pool.series.retries("connect_failure").inc()
                continue
            except BaseException:
                if span is not None:
                    _end_span(span, None, "cancelled")
                    span = None
                _settle(pool, replica, failed=False)
                raise
            pool.series.ttfb.observe(perf_counter() - sent)
            status = exchange.status
            if status in policy.retry_on_status:
                retry_after = exchange.headers.get("retry-after")
                raw = await _read_error(exchange)
                _settle(pool, replica, failed=status >= 500)
                last = UpstreamError(status, raw, retry_after)
                pool.series.retries(str(status)).inc()
                if span is not None:
                    _end_span(span, status, None)
                    span = None
                continue
            return Attempt(pool, replica, exchange, matched, sent, keys, span=span)
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


def _end_span(span: Any, status: int | None, error: str | None) -> None:
    if tracing.TRACER is not None:
        tracing.TRACER.end_attempt(span, status, error)


def _settle(pool: Pool, replica: Replica, *, failed: bool) -> None:
    pool.completed(replica)
    replica.series.in_flight.dec()
    if failed and replica.health.failed(time.monotonic()):
        _ejected(pool, replica)
    elif not failed:
        replica.health.trial = False
    replica.series.breaker.set(int(replica.health.breaker))


async def ask(upstreams: Upstreams, url: str, path: str, body: bytes, headers: dict[str, str], tls: ClientTLS | None = None) -> Exchange:
    """Send, and wait for the response head; once more on a new connection when a pooled one
    turns out to have been closed by the replica while idle (nothing of the request was read)."""
    for fresh in (False, True):
        exchange = await upstreams.send(url, path, body, headers, fresh=fresh, tls=tls)
        try:
            await exchange.head()
            return exchange
        except UpstreamClosed as exc:
            exchange.finish(reuse=False)
            if not exc.stale or fresh:
                raise
        except BaseException:
            exchange.finish(reuse=False)  # cancelled (the client left): the replica sees the close
            raise
    raise AssertionError("unreachable")


async def _read_error(exchange: Exchange) -> bytes:
    try:
        return await exchange.read()
    except _CONNECT_ERRORS:
        return b""
    finally:
        exchange.finish(reuse=True)
