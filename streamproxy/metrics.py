"""Prometheus metrics: vLLM's own (`vllm:*`, registered by the in-process
engine in the default registry) plus `streamproxy_*` measured at the client edge.

Exposed as text at GET /metrics. Metric objects are module-level, created once.
"""

from __future__ import annotations

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, Counter, Gauge, generate_latest

ACTIVE_STREAMS = Gauge("streamproxy_active_streams", "Streaming responses being written right now")
REQUESTS = Counter("streamproxy_requests", "Generation requests answered, by route and outcome", ["route", "outcome"])
ENGINE_ABORTS = Counter("streamproxy_engine_aborts", "Engine requests aborted because the response ended early (client gone, write stall, timeout)")
HEARTBEATS = Counter("streamproxy_heartbeats", "SSE keepalive comments sent")


async def metrics(request: web.Request) -> web.Response:
    return web.Response(body=generate_latest(REGISTRY), headers={"Content-Type": CONTENT_TYPE_LATEST})
