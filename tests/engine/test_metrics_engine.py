"""/metrics with the real engine: vLLM's own `vllm:` families (registered by the
in-process AsyncLLM in prometheus_client's default registry) next to ours."""

from __future__ import annotations

import time

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.engine

VLLM_FAMILIES = {
    "vllm:num_requests_running": "gauge",
    "vllm:num_requests_waiting": "gauge",
    "vllm:prompt_tokens": "counter",
    "vllm:generation_tokens": "counter",
    "vllm:time_to_first_token_seconds": "histogram",
    "vllm:inter_token_latency_seconds": "histogram",
    "vllm:e2e_request_latency_seconds": "histogram",
    "vllm:request_success": "counter",
}
OUR_FAMILIES = {
    "streamproxy_time_to_first_token_seconds": "histogram",
    "streamproxy_inter_token_latency_seconds": "histogram",
    "streamproxy_active_streams": "gauge",
    "streamproxy_responses": "counter",
}


def _scrape(base: str) -> tuple[dict[str, str], dict[str, list]]:
    resp = requests.get(base + "/metrics", timeout=10)
    assert resp.status_code == 200
    assert resp.headers["Content-Type"].startswith("text/plain")
    types: dict[str, str] = {}
    samples: dict[str, list] = {}
    for fam in text_string_to_metric_families(resp.text):
        assert fam.name not in types, f"family {fam.name} exposed twice"
        types[fam.name] = fam.type
        for s in fam.samples:
            samples.setdefault(s.name, []).append(s)
    return types, samples


def _sum(samples: dict[str, list], name: str, **labels: str) -> float:
    return sum(s.value for s in samples.get(name, []) if all(s.labels.get(k) == v for k, v in labels.items()))


def test_vllm_and_streamproxy_families(engine_server, model_name):
    types, before = _scrape(engine_server)
    for name, kind in {**VLLM_FAMILIES, **OUR_FAMILIES}.items():
        assert types.get(name) == kind, (name, types.get(name))
    # vLLM labels its series with the served model name: its dashboards filter on it.
    assert {s.labels.get("model_name") for s in before["vllm:num_requests_running"]} == {model_name}

    r = requests.post(
        engine_server + "/v1/completions",
        json={"model": model_name, "prompt": "The capital of France is", "max_tokens": 8, "temperature": 0, "ignore_eos": True},
        timeout=120,
    )
    assert r.status_code == 200
    usage = r.json()["usage"]
    _, after = _scrape(engine_server)
    generated = _sum(after, "vllm:generation_tokens_total") - _sum(before, "vllm:generation_tokens_total")
    assert generated == usage["completion_tokens"] == 8
    prompt = _sum(after, "vllm:prompt_tokens_total") - _sum(before, "vllm:prompt_tokens_total")
    assert prompt == usage["prompt_tokens"]
    ok = _sum(after, "streamproxy_responses_total", route="/v1/completions", status="200", code="")
    assert ok - _sum(before, "streamproxy_responses_total", route="/v1/completions", status="200", code="") == 1


def test_running_gauges_follow_a_stream(engine_server, model_name):
    with requests.post(
        engine_server + "/v1/chat/completions",
        json={"model": model_name, "messages": [{"role": "user", "content": "Count to one hundred."}], "stream": True, "max_tokens": 1000, "ignore_eos": True},
        stream=True,
        timeout=120,
    ) as r:
        # Keep a reference to the iterator: closing it would close the connection.
        lines = r.iter_lines()
        for line in lines:
            if b'"content":"' in line and b'"content":""' not in line:
                break  # the first token is out
        _, during = _scrape(engine_server)
        assert _sum(during, "vllm:num_requests_running") >= 1
        assert _sum(during, "streamproxy_active_streams") >= 1
    # The client left: the engine request is aborted and the gauges fall back.
    deadline = time.monotonic() + 10
    while True:
        _, after = _scrape(engine_server)
        if _sum(after, "vllm:num_requests_running") == 0 and _sum(after, "streamproxy_active_streams") == 0:
            break
        assert time.monotonic() < deadline, "the aborted request still counts as running"
        time.sleep(0.1)
