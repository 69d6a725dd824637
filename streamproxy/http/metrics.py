"""Prometheus metrics: vLLM's own (`vllm:*`) plus `streamproxy_*` measured at the client edge.

vLLM registers its families in the default REGISTRY, so one `generate_latest(REGISTRY)` serves both and
vLLM's dashboards work. Hot-path cost is per write, not per token: inter-token latency is observed once
per write (gap / tokens) in a `FastHistogram` (one `bisect`, no locks). With `--api-server-count` the
values live in `PROMETHEUS_MULTIPROC_DIR` files read by `MultiProcessCollector` (gauges `livesum`);
`publish`, once a second per worker, flushes the `FastHistogram` to a file-backed twin and sets
`streamproxy_engine_requests`.
"""

from __future__ import annotations

import asyncio
import os
import time
import weakref
from bisect import bisect_left
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client import multiprocess as prometheus_multiprocess
from prometheus_client import values as prometheus_values
from prometheus_client.metrics_core import HistogramMetricFamily, Metric
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

from engine_adapter.base import Engine

if TYPE_CHECKING:
    from streamproxy.http.context import RequestContext

# Set by the parent of --api-server-count workers before they start (prometheus_client reads it at import).
MULTIPROCESS = bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))
# Seconds between two `publish` passes in a worker.
PUBLISH_INTERVAL = 1.0


class FastHistogram:
    """A label-less histogram for one thread's hot path; same exposition as `Histogram`."""

    __slots__ = ("name", "documentation", "_bounds", "_counts", "_sum", "_created", "_twin", "_flushed")

    def __init__(self, name: str, documentation: str, buckets: Sequence[float], registry: CollectorRegistry = REGISTRY) -> None:
        self.name = name
        self.documentation = documentation
        self._bounds = tuple(float(b) for b in buckets)
        self._counts = [0] * (len(self._bounds) + 1)  # the last one is +Inf
        self._sum = 0.0
        self._created = time.time()
        # Multiprocess mode: the file-backed values `flush` brings up to date.
        self._twin: FileHistogram | None = None
        self._flushed = ([0] * len(self._counts), 0.0)
        if MULTIPROCESS:
            self._twin = FileHistogram(name, documentation, self._bounds)
        elif registry is not None:
            registry.register(self)

    def flush(self) -> None:
        """Add what was observed since the last flush to the file-backed twin (multiprocess mode)."""
        twin = self._twin
        if twin is None:
            return
        counts, total = list(self._counts), self._sum
        before, before_sum = self._flushed
        for i, (now, then) in enumerate(zip(counts, before)):
            if now != then:
                twin.buckets[i].inc(now - then)
        if total != before_sum:
            twin.sum.inc(total - before_sum)
        self._flushed = (counts, total)

    def observe(self, amount: float) -> None:
        self._counts[bisect_left(self._bounds, amount)] += 1
        self._sum += amount

    def describe(self) -> list[Metric]:
        return [HistogramMetricFamily(self.name, self.documentation)]

    def collect(self) -> Iterator[Metric]:
        counts = list(self._counts)
        total = 0
        buckets = []
        for bound, count in zip((*self._bounds, float("inf")), counts):
            total += count
            buckets.append((floatToGoString(bound), total))
        family = HistogramMetricFamily(self.name, self.documentation)
        family.add_metric([], buckets, self._sum)
        family.samples.append(Sample(self.name + "_created", {}, self._created, None, None))
        yield family


class FileHistogram:
    """A label-less histogram's values in prometheus_client's per-process files, made as its
    `Histogram` makes them (`values.ValueClass`, one per bucket, not cumulative, and one for the
    sum; `MultiProcessCollector` adds them up and derives `_count`), but taking counts in bulk: a
    `Histogram` only takes one observation at a time."""

    __slots__ = ("buckets", "sum")

    def __init__(self, name: str, documentation: str, bounds: Sequence[float]) -> None:
        def value(suffix: str, labelnames: tuple[str, ...], labelvalues: tuple[str, ...]) -> Any:
            return prometheus_values.ValueClass("histogram", name, name + suffix, labelnames, labelvalues, documentation)

        self.buckets = [value("_bucket", ("le",), (floatToGoString(b),)) for b in (*bounds, float("inf"))]
        self.sum = value("_sum", (), ())


# Latency buckets in seconds: vLLM's own, plus finer steps at the fast end
# (the front end itself adds well under a millisecond).
_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0)
_ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0)
_DURATION_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0, 640.0, 1280.0)

TIME_TO_FIRST_BYTE = Histogram(
    "streamproxy_time_to_first_byte_seconds",
    "From request received to the response headers on the wire",
    buckets=_TTFT_BUCKETS,
)
TIME_TO_FIRST_TOKEN = Histogram(
    "streamproxy_time_to_first_token_seconds",
    "From request received to the first generated text written to the client",
    buckets=_TTFT_BUCKETS,
)
INTER_TOKEN_LATENCY = FastHistogram(
    "streamproxy_inter_token_latency_seconds",
    "Gap between writes of generated text divided by the tokens in the write (one observation per write)",
    buckets=_ITL_BUCKETS,
)
REQUEST_DURATION = Histogram(
    "streamproxy_request_duration_seconds",
    "From request received to the end of the response (generation routes)",
    buckets=_DURATION_BUCKETS,
)
ACTIVE_STREAMS = Gauge("streamproxy_active_streams", "Streaming responses being written right now", multiprocess_mode="livesum")
REQUESTS_RUNNING = Gauge("streamproxy_requests_running", "Requests holding a generation slot (admission)", multiprocess_mode="livesum")
REQUESTS_QUEUED = Gauge("streamproxy_requests_queued", "Requests waiting for a generation slot (admission)", multiprocess_mode="livesum")
RESPONSES = Counter(
    "streamproxy_responses",
    "Responses by route, HTTP status and error code (in-band stream errors keep status 200 and carry their code)",
    ["route", "status", "code"],
)
CLIENT_DISCONNECTS = Counter("streamproxy_client_disconnects", "Requests whose client went away before the response ended")
HEARTBEATS = Counter("streamproxy_heartbeats", "Keepalives sent: SSE comments, or newlines before a slow JSON body", ["kind"])
SSE_HEARTBEATS = HEARTBEATS.labels("sse")
NONSTREAM_HEARTBEATS = HEARTBEATS.labels("nonstream")
WRITE_STALLS = Counter("streamproxy_write_stalls", "Streams ended because the client stopped reading (--write-stall-timeout)")
ADMISSION_REJECTIONS = Counter("streamproxy_admission_rejections", "Requests answered 429 at once: no slot and no room to wait")
OPEN_CONNECTIONS = Gauge("streamproxy_open_connections", "Client connections open right now (those over --max-connections not counted)", multiprocess_mode="livesum")
CONNECTIONS_CLOSED = Counter(
    "streamproxy_connections_closed",
    "Client connections the server closed on its own: header_timeout, body_timeout, keepalive_timeout (idle), "
    "over_limit (past --max-connections)",
    ["reason"],
)
CLOSED_HEADER_TIMEOUT = CONNECTIONS_CLOSED.labels("header_timeout")
CLOSED_BODY_TIMEOUT = CONNECTIONS_CLOSED.labels("body_timeout")
CLOSED_KEEPALIVE_TIMEOUT = CONNECTIONS_CLOSED.labels("keepalive_timeout")
CLOSED_OVER_LIMIT = CONNECTIONS_CLOSED.labels("over_limit")
ENGINE_REQUESTS = Gauge(
    "streamproxy_engine_requests",
    "Requests the engine holds for this server (in vLLM's output path or the direct route): 0 when idle, or requests leak",
    multiprocess_mode="livesum",
)
ENGINE_ABORTS = Counter(
    "streamproxy_engine_aborts",
    "Engine requests aborted because the response ended early (client gone, write stall, timeout, drain)",
)


def finished(ctx: RequestContext) -> None:
    """A request's response metrics (a finish subscriber, context.py)."""
    if ctx.disconnected:
        CLIENT_DISCONNECTS.inc()
    key = (ctx.route, ctx.status, ctx.code)
    child = _RESPONSE_SERIES.get(key)
    if child is None:  # looked up once per (route, status, code), not per request
        child = _RESPONSE_SERIES[key] = RESPONSES.labels(ctx.route, str(ctx.status), ctx.code)
    child.inc()
    if ctx.generation:
        REQUEST_DURATION.observe(ctx.duration)
        if ctx.ttfb is not None:
            TIME_TO_FIRST_BYTE.observe(ctx.ttfb)


_RESPONSE_SERIES: dict[tuple[str, int, str], Any] = {}


async def metrics(request: web.Request) -> web.Response:
    return web.Response(body=exposition(), headers={"Content-Type": CONTENT_TYPE_LATEST})


def exposition() -> bytes:
    """This process's registry; in multiprocess mode the sum over every worker's files (as vLLM's /metrics)."""
    if not MULTIPROCESS:
        return generate_latest(REGISTRY)
    publish_now()
    registry = CollectorRegistry()
    prometheus_multiprocess.MultiProcessCollector(registry)
    return generate_latest(registry)


_engine_ref: weakref.ref[Engine] | None = None


def watch_engine(engine: Engine) -> None:
    """`streamproxy_engine_requests` reads this engine's `num_running` (weakly: an old app's engine can go)."""
    global _engine_ref
    ref = _engine_ref = weakref.ref(engine)

    def held() -> float:
        current = ref()
        return float(current.num_running) if current is not None else 0.0

    if not MULTIPROCESS:
        ENGINE_REQUESTS.set_function(held)


def publish_now() -> None:
    """Multiprocess mode: this worker's values that live outside prometheus_client's files, into them."""
    INTER_TOKEN_LATENCY.flush()
    engine = _engine_ref() if _engine_ref is not None else None
    ENGINE_REQUESTS.set(float(engine.num_running) if engine is not None else 0.0)


async def publish(interval: float = PUBLISH_INTERVAL) -> None:
    """Multiprocess mode: `publish_now` every `interval` s (a task per worker, app.py)."""
    while True:
        publish_now()
        await asyncio.sleep(interval)
