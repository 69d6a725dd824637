"""--otlp-traces-endpoint on the real engine: vLLM's own `llm_request` span joins the request's trace,
as the child of serve's span (the context reaches vLLM's engine through `trace_headers`)."""

from __future__ import annotations

import pytest
import requests

from harness.server import ENGINE_ARGS
from harness.waiting import wait_until_sync
from tests.gateway.test_tracing import CLIENT_SPAN, CLIENT_TRACE, OTLP_HTTP, Receiver

pytestmark = pytest.mark.engine


def test_vllms_span_joins_the_trace_under_serves_span(launch_server, model_name, monkeypatch):
    receiver = Receiver()
    for key, value in OTLP_HTTP.items():  # the server and its engine core inherit them
        monkeypatch.setenv(key, value)
    try:
        with launch_server("traced", [*ENGINE_ARGS, "--otlp-traces-endpoint", receiver.url]) as base:
            answer = requests.post(base + "/v1/chat/completions", timeout=120,
                                   headers={"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"},
                                   json={"model": model_name, "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]})
            assert answer.status_code == 200, answer.text
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
    finally:
        receiver.close()
