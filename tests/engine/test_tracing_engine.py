"""--otlp-traces-endpoint on the real engine: vLLM's own `llm_request` span joins the request's trace,
as the child of serve's span (the context reaches vLLM's engine through `trace_headers`), and the traced
request leaves the direct route for vLLM's output path, whose OutputProcessor makes that span.

The server is the session's `traced_server` (tests/conftest.py), which test_real_engine.py's route
comparison shares."""

from __future__ import annotations

import pytest
import requests

from harness.waiting import wait_until_sync
from tests.engine.test_real_engine import _metric
from tests.gateway.test_tracing import CLIENT_SPAN, CLIENT_TRACE

pytestmark = pytest.mark.engine


def test_vllms_span_joins_the_trace_under_serves_span(traced_server, model_name):
    base, receiver = traced_server.base, traced_server.receiver
    assert receiver.trace(CLIENT_TRACE) == []  # no other test sends the client's trace id
    direct = _metric(base, "streamproxy_direct_requests_total")
    answer = requests.post(base + "/v1/chat/completions", timeout=120,
                           headers={"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"},
                           json={"model": model_name, "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]})
    assert answer.status_code == 200, answer.text
    assert _metric(base, "streamproxy_direct_requests_total") == direct  # vLLM's path, not the direct route
    # Both processes export in batches, each on its own schedule: either span may come first.
    assert wait_until_sync(lambda: {s.name for s in receiver.trace(CLIENT_TRACE)} >= {"llm_request"}
                           and any(s.parent == CLIENT_SPAN for s in receiver.trace(CLIENT_TRACE)), timeout=30), \
        [(s.name, s.parent) for s in receiver.trace(CLIENT_TRACE)]
    spans = receiver.trace(CLIENT_TRACE)
    ours = [s for s in spans if s.parent == CLIENT_SPAN]
    assert len(ours) == 1, [(s.name, s.parent) for s in spans]
    [engine] = [s for s in spans if s.name == "llm_request"]
    assert engine.parent == ours[0].span_id
    assert ours[0].attrs["gen_ai.usage.output_tokens"] == answer.json()["usage"]["completion_tokens"]
