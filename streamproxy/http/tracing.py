"""OpenTelemetry traces (`--otlp-traces-endpoint`), for serve and the gateway alike.

With no endpoint `TRACER` stays None and OpenTelemetry is never imported (one check per request). With
one, `configure` sets up the SDK's OTLP exporter (gRPC or HTTP, as vLLM picks); the edge opens a SERVER
span per POST (child of the client's `traceparent`), serve passes `headers(span)` to the engine, the
gateway opens a CLIENT span per attempt (`attempt`/`end_attempt`), and `finished` (a finish subscriber)
sets the GenAI attributes from the context and ends the span. Nothing runs per token.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from aiohttp import web

    from streamproxy.http.context import RequestContext

# Which GenAI operation each route is (gen_ai.operation.name), by the path's end.
_OPERATIONS = (
    ("/chat/completions", "chat"),
    ("/completions", "text_completion"),
    ("/embeddings", "embeddings"),
    ("/responses", "chat"),
    ("/messages", "chat"),
    ("/invocations", "chat"),
)


def operation(path: str) -> str | None:
    for end, name in _OPERATIONS:
        if path.endswith(end):
            return name
    return None


class Tracer:
    """The SDK's tracer, its provider and the W3C propagator, made once by `configure`."""

    def __init__(self, endpoint: str, service: str, exporter: Any = None) -> None:
        """`exporter` (tests): spans go to it one by one, not batched to `endpoint`."""
        from opentelemetry import trace
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self._trace = trace
        self.provider = TracerProvider(resource=Resource.create({"service.name": service}))
        processor = BatchSpanProcessor(_exporter(endpoint)) if exporter is None else SimpleSpanProcessor(exporter)
        self.provider.add_span_processor(processor)
        self.tracer = self.provider.get_tracer("streamproxy")
        self.propagator = TraceContextTextMapPropagator()
        self._server = trace.SpanKind.SERVER
        self._client = trace.SpanKind.CLIENT

    # -- the request's span ----------------------------------------------------------
    def start(self, request: web.Request) -> Any:
        """The request's span, the child of the client's `traceparent` when valid."""
        context = self.propagator.extract(request.headers) if "traceparent" in request.headers else None
        return self.tracer.start_span(
            f"{request.method} {request.path}", context=context, kind=self._server,
            attributes={"http.request.method": request.method, "url.path": request.path},
        )

    def headers(self, span: Any) -> dict[str, str]:
        """`traceparent` (and `tracestate`) naming `span` as the parent."""
        carrier: dict[str, str] = {}
        self.propagator.inject(carrier, context=self._trace.set_span_in_context(span))
        return carrier

    def end(self, ctx: RequestContext) -> None:
        span, status = ctx.span, ctx.status
        attrs: dict[str, Any] = {"http.response.status_code": status, "streamproxy.request_id": ctx.request_id}
        op = operation(ctx.path) if ctx.generation else None
        if op is not None:
            attrs["gen_ai.operation.name"] = op
            span.update_name(f"{op} {ctx.model}" if ctx.model else op)
        reason = ctx.finish_reason
        for name, value in (
            ("gen_ai.request.model", ctx.model), ("gen_ai.response.model", ctx.model if status < 400 else None),
            ("gen_ai.request.max_tokens", ctx.max_tokens), ("gen_ai.request.stream", ctx.stream),
            ("gen_ai.usage.input_tokens", ctx.prompt_tokens), ("gen_ai.usage.output_tokens", ctx.completion_tokens),
            ("gen_ai.usage.cache_read.input_tokens", ctx.cached_tokens or None),
            ("gen_ai.response.finish_reasons", None if reason is None else [reason] if isinstance(reason, str) else [r or "" for r in reason]),
            ("streamproxy.deployment", ctx.deployment), ("error.type", ctx.error_code or None),
            ("streamproxy.client_disconnected", ctx.disconnected or None),
            ("gen_ai.server.time_to_first_token", ctx.ttft), ("streamproxy.time_to_first_byte", ctx.ttfb),
        ):
            if value is not None:
                attrs[name] = value
        if ctx.ttft is not None:
            span.add_event("first_token", timestamp=(span.start_time or time.time_ns()) + int(ctx.ttft * 1e9))
        span.set_attributes(attrs)
        if status >= 500:
            span.set_status(self._trace.Status(self._trace.StatusCode.ERROR, ctx.error_code or str(status)))
        span.end()

    # -- the gateway's attempts ------------------------------------------------------
    def attempt(self, parent: Any, deployment: str, url: str, retry: int, migration: str | None = None) -> Any:
        """`migration`: the attempt carries a broken stream on (`continue`: its continuation; `resend`: the request again)."""
        attributes: dict[str, Any] = {"streamproxy.deployment": deployment, "server.address": url, "streamproxy.retry": retry}
        if migration is not None:
            attributes["streamproxy.migration"] = migration
        return self.tracer.start_span(
            f"upstream {deployment}", context=self._trace.set_span_in_context(parent), kind=self._client, attributes=attributes,
        )

    def end_attempt(self, span: Any, status: int | None, error: str | None = None) -> None:
        """`status`: the replica's, None when it never answered (`error` says why) or the client left."""
        if status is not None:
            span.set_attribute("http.response.status_code", status)
        if error is not None:
            span.set_attribute("error.type", error)
        if error is not None or (status is not None and status >= 500):
            span.set_status(self._trace.Status(self._trace.StatusCode.ERROR, error or str(status)))
        span.end()

    def shutdown(self) -> None:
        """Export what is still batched (at the server's exit)."""
        self.provider.shutdown()


def _exporter(endpoint: str) -> Any:
    """vLLM's choice (vllm/tracing/otel.py): gRPC unless OTEL_EXPORTER_OTLP_TRACES_PROTOCOL says http/protobuf."""
    protocol = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "grpc")
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as Grpc

        return Grpc(endpoint=endpoint, insecure=True)
    if protocol == "http/protobuf":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as Http

        return Http(endpoint=endpoint)
    raise ValueError(f"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL={protocol!r}: expected grpc or http/protobuf")


# None: no --otlp-traces-endpoint (and OpenTelemetry not imported).
TRACER: Tracer | None = None


def finished(ctx: RequestContext) -> None:
    """The request's span ends (a finish subscriber)."""
    if ctx.span is not None and TRACER is not None:
        TRACER.end(ctx)


def configure(endpoint: str | None, service: str) -> Tracer | None:
    """Tracing to `endpoint` (None or "": off)."""
    global TRACER
    if TRACER is not None:
        TRACER.shutdown()
    TRACER = Tracer(endpoint, service) if endpoint else None
    return TRACER
