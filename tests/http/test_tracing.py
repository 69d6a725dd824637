"""serve's request span (streamproxy/http/tracing.py) in-process, spans kept in memory: the
client's `traceparent` honoured, the span's context handed to the engine in
`GenerationParams.trace_headers`, the GenAI attributes from the access log's record, its
events; no span and no trace headers when tracing is off. (End to end through a gateway and
an OTLP receiver: tests/gateway/test_tracing.py.)
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from engine_adapter.fake import FakeScript
from streamproxy.http import tracing
from tests.http.conftest import Serve
from tests.support.fake import USER_HI, USER_HI_PROMPT_TOKENS
from tests.support.spans import recorded_spans

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    with recorded_spans("streamproxy") as exporter:
        yield exporter


def _attrs(span: Any) -> dict[str, Any]:
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in span.attributes.items()}


async def test_request_span_child_of_traceparent_and_parent_of_engine(serve: Serve, spans: InMemorySpanExporter) -> None:
    client, engine = await serve(FakeScript(tokens=["Hel", "lo", " world"]))
    resp = await client.post("/v1/chat/completions", json={"model": "fake", "messages": USER_HI, "max_tokens": 7},
                             headers={"traceparent": f"00-{TRACE}-{PARENT}-01", "tracestate": "vendor=x"})
    assert resp.status == 200
    usage = (await resp.json())["usage"]
    (span,) = spans.get_finished_spans()
    ctx = span.get_span_context()
    assert ctx is not None
    assert f"{ctx.trace_id:032x}" == TRACE
    assert span.parent is not None and f"{span.parent.span_id:016x}" == PARENT
    assert span.name == "chat fake"
    assert _attrs(span) | {"gen_ai.server.time_to_first_token": 0, "streamproxy.time_to_first_byte": 0} == {
        "http.request.method": "POST",
        "url.path": "/v1/chat/completions",
        "http.response.status_code": 200,
        "streamproxy.request_id": resp.headers["X-Request-Id"],
        "gen_ai.operation.name": "chat",
        "gen_ai.request.model": "fake",
        "gen_ai.response.model": "fake",
        "gen_ai.request.max_tokens": 7,
        "gen_ai.request.stream": False,
        "gen_ai.usage.input_tokens": USER_HI_PROMPT_TOKENS,
        "gen_ai.usage.output_tokens": 3,
        "gen_ai.response.finish_reasons": ["stop"],
        "gen_ai.server.time_to_first_token": 0,
        "streamproxy.time_to_first_byte": 0,
    }
    assert usage["prompt_tokens"] == USER_HI_PROMPT_TOKENS and usage["completion_tokens"] == 3
    assert [e.name for e in span.events] == ["engine.submit", "first_token"]
    # The engine got the span's own context (vLLM's trace_headers), the client's tracestate kept.
    params = engine.submitted[-1][2]
    assert params.trace_headers == {"traceparent": f"00-{TRACE}-{ctx.span_id:016x}-01", "tracestate": "vendor=x"}


async def test_no_traceparent_a_new_trace(serve: Serve, spans: InMemorySpanExporter) -> None:
    client, engine = await serve()
    resp = await client.post("/v1/chat/completions", json={"model": "fake", "messages": USER_HI, "stream": True},
                             headers={"traceparent": "00-not-a-trace-01"})
    assert resp.status == 200
    await resp.read()
    (span,) = spans.get_finished_spans()
    ctx = span.get_span_context()
    assert span.parent is None and ctx is not None and ctx.trace_id != 0
    headers = engine.submitted[-1][2].trace_headers
    assert headers is not None and headers["traceparent"].split("-")[1] == f"{ctx.trace_id:032x}"


async def test_gets_and_errors(serve: Serve, spans: InMemorySpanExporter) -> None:
    client, _ = await serve()
    assert (await client.get("/v1/models")).status == 200  # no span for a GET
    resp = await client.post("/v1/chat/completions", json={"model": "nope", "messages": USER_HI})
    assert resp.status == 404
    (span,) = spans.get_finished_spans()
    attrs = _attrs(span)
    assert attrs["http.response.status_code"] == 404 and attrs["error.type"] == "model_not_found"
    assert "gen_ai.response.model" not in attrs


async def test_off_no_span_no_headers(serve: Serve) -> None:
    assert tracing.TRACER is None
    client, engine = await serve()
    assert (await client.post("/v1/chat/completions", json={"model": "fake", "messages": USER_HI})).status == 200
    assert engine.submitted[-1][2].trace_headers is None
