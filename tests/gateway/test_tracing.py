"""--otlp-traces-endpoint end to end: a client's request through a `streamproxy gateway` process
to a `serve --engine fake` replica, both exporting spans (OTLP/HTTP) to a receiver here, is one
trace: the client's span -> the gateway's request span -> its upstream attempt -> serve's span,
with the GenAI attributes carrying the token counts the client saw in `usage`. A request without
`traceparent` gets a new trace, the same shape. With no endpoint neither process imports
OpenTelemetry (tracing.py's promise that it then costs nothing).
"""

from __future__ import annotations

import gzip
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import requests
import yaml
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from harness.process import ROOT, ServerProcess, free_port
from harness.server import FAKE_ARGS, serve_process, start_gateway, start_server
from harness.waiting import wait_until_sync
from tests.gateway.gateway_support import DEPLOYMENT, DEPLOYMENT_ID, SERVED, chat
from tests.support import sse

CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
OTLP_HTTP = {"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf", "OTEL_BSP_SCHEDULE_DELAY": "20"}


class Span:
    def __init__(self, service: str, raw: Any) -> None:
        self.service = service
        self.name: str = raw.name
        self.trace_id = raw.trace_id.hex()
        self.span_id = raw.span_id.hex()
        self.parent = raw.parent_span_id.hex() or None
        self.attrs = {kv.key: _value(kv.value) for kv in raw.attributes}
        self.events = [e.name for e in raw.events]


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    return getattr(v, kind)


class Receiver:
    """An OTLP/HTTP trace receiver on loopback: every exported span, decoded."""

    def __init__(self) -> None:
        self.spans: list[Span] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                ok = self.path == "/v1/traces"
                if ok:
                    export = ExportTraceServiceRequest.FromString(body)
                    for rs in export.resource_spans:
                        service = next(kv.value.string_value for kv in rs.resource.attributes if kv.key == "service.name")
                        receiver.spans.extend(Span(service, s) for ss in rs.scope_spans for s in ss.spans)
                self.send_response(200 if ok else 404)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def trace(self, trace_id: str) -> list[Span]:
        return [s for s in list(self.spans) if s.trace_id == trace_id]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


@contextmanager
def _traced(tmp_path: Path, receiver: Receiver, *, dead_first: bool = False) -> Iterator[ServerProcess]:
    """A gateway and its fake replica, both tracing to `receiver`; `dead_first`: the deployment's first
    upstream (round robin: the first request's first try) is a port nothing listens on."""
    flags = ["--otlp-traces-endpoint", receiver.url]
    replica = start_server([*FAKE_ARGS, "--served-model-name", SERVED, *flags], tmp_path, name="replica", env=OTLP_HTTP)
    gateway: ServerProcess | None = None
    try:
        upstreams = [f"http://127.0.0.1:{free_port()}", replica.base] if dead_first else [replica.base]
        config: dict[str, Any] = {"access_log": "off",
                                  "deployments": [{"name": DEPLOYMENT, "id": DEPLOYMENT_ID, "served_model": SERVED, "upstreams": upstreams}]}
        if dead_first:
            config["upstream"] = {"policy": "round_robin", "health_check_interval": 60.0}
        gateway = start_gateway(config, tmp_path, flags=flags, env=OTLP_HTTP)
        yield gateway
    finally:
        if gateway is not None:
            gateway.stop()
        replica.stop()


class Traced(NamedTuple):
    gateway: ServerProcess
    receiver: Receiver


@pytest.fixture(scope="module")
def traced(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Traced]:
    """One gateway and replica for the tests that each find their own trace in the receiver (by the
    client's trace id, or the request's id): two processes started once, not once a test."""
    receiver = Receiver()
    try:
        with _traced(tmp_path_factory.mktemp("traced"), receiver) as gateway:
            yield Traced(gateway, receiver)
    finally:
        receiver.close()


def _root(receiver: Receiver, request_id: str) -> Span:
    """The gateway's span of the request `request_id` (it has no parent: the client sent no valid
    `traceparent`), once it has arrived."""
    def roots() -> list[Span]:
        return [s for s in list(receiver.spans) if s.service == "streamproxy-gateway" and s.parent is None
                and s.attrs.get("streamproxy.request_id") == request_id]

    assert wait_until_sync(lambda: roots() != [], 20.0), [vars(s) for s in receiver.spans]
    (root,) = roots()
    return root


def _stream(gateway: ServerProcess, headers: dict[str, str]) -> dict[str, Any]:
    answer = requests.post(gateway.url("/v1/chat/completions"), headers=headers, timeout=30,
                           json=chat(max_tokens=5, stream=True, stream_options={"include_usage": True}))
    assert answer.status_code == 200, answer.text
    events = sse.payloads(answer.content)
    usage = events[-1]["usage"]
    assert usage["completion_tokens"] > 0 and usage["prompt_tokens"] > 0
    return {"usage": usage, "request_id": answer.headers["X-Request-Id"]}


def _one_trace(receiver: Receiver, trace_id: str) -> tuple[Span, Span, Span]:
    assert wait_until_sync(lambda: len(receiver.trace(trace_id)) >= 3, 20.0), [vars(s) for s in receiver.spans]
    spans = receiver.trace(trace_id)
    assert len(spans) == 3, [vars(s) for s in spans]
    return _shape(spans)


def _shape(spans: list[Span]) -> tuple[Span, Span, Span]:
    """The gateway's span, its (answered) attempt, serve's span; the attempt the gateway's child,
    serve's span the attempt's."""
    (gw,) = [s for s in spans if s.service == "streamproxy-gateway" and "streamproxy.retry" not in s.attrs]
    (attempt,) = [s for s in spans if s.service == "streamproxy-gateway" and s.attrs.get("http.response.status_code") == 200
                  and "streamproxy.retry" in s.attrs]
    (serve,) = [s for s in spans if s.service == "streamproxy"]
    assert attempt.parent == gw.span_id
    assert serve.parent == attempt.span_id
    return gw, attempt, serve


def test_one_trace_through_gateway_and_replica(traced: Traced) -> None:
    got = _stream(traced.gateway, {"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01", "tracestate": "vendor=x"})
    usage = got["usage"]
    gw, attempt, serve = _one_trace(traced.receiver, CLIENT_TRACE)
    assert gw.parent == CLIENT_SPAN  # the client's traceparent honoured

    assert gw.name == f"chat {DEPLOYMENT}"
    assert gw.attrs["gen_ai.operation.name"] == "chat"
    assert gw.attrs["gen_ai.request.model"] == DEPLOYMENT
    assert gw.attrs["gen_ai.usage.input_tokens"] == usage["prompt_tokens"]
    assert gw.attrs["gen_ai.usage.output_tokens"] == usage["completion_tokens"]
    assert gw.attrs["http.response.status_code"] == 200
    assert gw.attrs["streamproxy.deployment"] == DEPLOYMENT
    assert gw.attrs["gen_ai.server.time_to_first_token"] > 0
    assert "first_token" in gw.events

    replica_url = attempt.attrs["server.address"]
    assert replica_url.startswith("http://127.0.0.1:")
    assert attempt.attrs["streamproxy.deployment"] == DEPLOYMENT
    assert attempt.attrs["streamproxy.retry"] == 0
    assert attempt.attrs["http.response.status_code"] == 200

    assert serve.name == f"chat {SERVED}"
    assert serve.attrs["gen_ai.operation.name"] == "chat"
    assert serve.attrs["gen_ai.request.model"] == SERVED
    assert serve.attrs["gen_ai.response.model"] == SERVED
    assert serve.attrs["gen_ai.request.max_tokens"] == 5
    assert serve.attrs["gen_ai.request.stream"] is True
    assert serve.attrs["gen_ai.usage.input_tokens"] == usage["prompt_tokens"]
    assert serve.attrs["gen_ai.usage.output_tokens"] == usage["completion_tokens"]
    assert serve.attrs["gen_ai.response.finish_reasons"] == ["length"]
    assert serve.attrs["gen_ai.server.time_to_first_token"] > 0
    assert serve.events == ["engine.submit", "first_token"]
    assert serve.attrs["streamproxy.request_id"] == got["request_id"]  # the gateway passes its id on


def test_a_trace_is_made_without_traceparent(traced: Traced) -> None:
    got = _stream(traced.gateway, {})
    root = _root(traced.receiver, got["request_id"])
    assert root.trace_id != "0" * 32
    _one_trace(traced.receiver, root.trace_id)


def test_a_malformed_traceparent_starts_a_new_trace(traced: Traced) -> None:
    got = _stream(traced.gateway, {"traceparent": "00-zz-nothex-01"})
    _root(traced.receiver, got["request_id"])


def test_a_failed_attempt_and_its_retry(tmp_path: Path, receiver: Receiver) -> None:
    with _traced(tmp_path, receiver, dead_first=True) as gateway:
        _stream(gateway, {"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"})
        assert wait_until_sync(lambda: len(receiver.trace(CLIENT_TRACE)) >= 4, 20.0), [vars(s) for s in receiver.spans]
    spans = receiver.trace(CLIENT_TRACE)
    assert len(spans) == 4, [vars(s) for s in spans]
    gw, answered, serve = _shape(spans)
    (failed,) = [s for s in spans if s is not answered and "streamproxy.retry" in s.attrs]
    assert failed.parent == gw.span_id
    assert failed.attrs["streamproxy.retry"] == 0 and answered.attrs["streamproxy.retry"] == 1
    assert failed.attrs["error.type"] == "ConnectionRefusedError" and "http.response.status_code" not in failed.attrs
    assert failed.attrs["server.address"] != answered.attrs["server.address"]


# A process of `streamproxy serve` or `gateway` (argv) in this interpreter; a thread sends one
# chat request once /health answers, then prints which OpenTelemetry modules were imported.
_PROBE = """
import os, sys, threading, time, requests
base = sys.argv[1]
def probe():
    for _ in range(600):
        try:
            if requests.get(base + "/health", timeout=1).status_code == 200:
                break
        except requests.RequestException:
            pass
        time.sleep(0.05)
    r = requests.post(base + "/v1/chat/completions", timeout=30,
                      json={"model": sys.argv[2], "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    print("status", r.status_code, flush=True)
    print("otel", sorted(m for m in sys.modules if m.startswith("opentelemetry")), flush=True)
    os._exit(0)
threading.Thread(target=probe, daemon=True).start()
from streamproxy.cli import main
main(sys.argv[3:])
"""


def _probe(base: str, model: str, argv: list[str]) -> str:
    done = subprocess.run([sys.executable, "-c", _PROBE, base, model, *argv], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert "status 200" in done.stdout, done.stdout + done.stderr
    return done.stdout


def test_no_endpoint_no_opentelemetry(tmp_path: Path) -> None:
    port = free_port()
    out = _probe(f"http://127.0.0.1:{port}", "fake", ["serve", *FAKE_ARGS, "--host", "127.0.0.1", "--port", str(port)])
    assert "otel []" in out
    with serve_process([*FAKE_ARGS, "--served-model-name", SERVED]) as replica:
        config = tmp_path / "gateway.yaml"
        config.write_text(yaml.safe_dump({"access_log": "off", "deployments": [
            {"name": DEPLOYMENT, "id": DEPLOYMENT_ID, "served_model": SERVED, "upstreams": [replica.base]}]}))
        port = free_port()
        out = _probe(f"http://127.0.0.1:{port}", DEPLOYMENT,
                     ["gateway", "--config", str(config), "--host", "127.0.0.1", "--port", str(port)])
        assert "otel []" in out
