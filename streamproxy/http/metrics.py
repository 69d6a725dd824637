"""Prometheus metrics: vLLM's own (`vllm:*`) plus `streamproxy_*` measured at the client edge.

vLLM's in-process engine registers its `vllm:` families in prometheus_client's
default REGISTRY, so one `generate_latest(REGISTRY)` serves both, and vLLM's
Grafana dashboards work unchanged. Our families are created once at import.

Cost on the hot path is bounded per write, not per token: inter-token latency
is observed once per write (the gap since the previous write divided by the
tokens it carries), everything else once per request or per event. The
per-write histogram is a `FastHistogram`: one `bisect` and two additions on
the event loop's thread, instead of prometheus_client's two locks and a
Python walk over the buckets, exposed in the same text format.
"""

from __future__ import annotations

import time
import weakref
from bisect import bisect_left
from collections.abc import Iterator, Sequence

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics_core import HistogramMetricFamily, Metric
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

from engine_adapter.base import Engine


class FastHistogram:
    """A label-less histogram for one thread's hot path; same exposition as `Histogram`."""

    __slots__ = ("name", "documentation", "_bounds", "_counts", "_sum", "_created")

    def __init__(self, name: str, documentation: str, buckets: Sequence[float], registry: CollectorRegistry = REGISTRY) -> None:
        self.name = name
        self.documentation = documentation
        self._bounds = tuple(float(b) for b in buckets)
        self._counts = [0] * (len(self._bounds) + 1)  # the last one is +Inf
        self._sum = 0.0
        self._created = time.time()
        if registry is not None:
            registry.register(self)

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
ACTIVE_STREAMS = Gauge("streamproxy_active_streams", "Streaming responses being written right now")
REQUESTS_RUNNING = Gauge("streamproxy_requests_running", "Requests holding a generation slot (admission)")
REQUESTS_QUEUED = Gauge("streamproxy_requests_queued", "Requests waiting for a generation slot (admission)")
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
OPEN_CONNECTIONS = Gauge("streamproxy_open_connections", "Client connections open right now (those over --max-connections not counted)")
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
)
ENGINE_ABORTS = Counter(
    "streamproxy_engine_aborts",
    "Engine requests aborted because the response ended early (client gone, write stall, timeout, drain)",
)


async def metrics(request: web.Request) -> web.Response:
    return web.Response(body=generate_latest(REGISTRY), headers={"Content-Type": CONTENT_TYPE_LATEST})


def watch_engine(engine: Engine) -> None:
    """`streamproxy_engine_requests` reads this engine's `num_running` (weakly: an old app's engine can go)."""
    ref = weakref.ref(engine)

    def held() -> float:
        current = ref()
        return float(current.num_running) if current is not None else 0.0

    ENGINE_REQUESTS.set_function(held)
