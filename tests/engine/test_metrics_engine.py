"""/metrics with the real engine: vLLM's own `vllm:` families (registered by the
in-process AsyncLLM in prometheus_client's default registry) next to ours."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from tests.support import sse

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
    "streamproxy_direct_requests": "counter",
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


# Every request counts in vLLM's per-request series: the direct route (every generation request:
# one choice or n, logprobs, prompt logprobs, stop) as vLLM's own path did, streams and not.
N = 3
PER_REQUEST = (  # histograms with one observation per finished request (per choice)
    "vllm:e2e_request_latency_seconds", "vllm:time_to_first_token_seconds", "vllm:request_queue_time_seconds",
    "vllm:request_prefill_time_seconds", "vllm:request_decode_time_seconds", "vllm:request_inference_time_seconds",
    "vllm:request_time_per_output_token_seconds", "vllm:request_prompt_tokens", "vllm:request_generation_tokens",
    "vllm:request_params_max_tokens", "vllm:request_num_preemptions", "vllm:request_prefill_kv_computed_tokens",
)
PER_PARENT = ("vllm:request_params_n", "vllm:request_max_num_generation_tokens")  # one per request, whatever its n
CHAT = [{"role": "user", "content": "Say something."}]
# A regex constraint makes any model end with EOS after "Yes.": finish_reason "stop", whatever the model.
STOPS = {"structured_outputs": {"regex": r"Yes\."}}
KINDS = {  # name: (path, body, expected finish_reason, choices)
    "chat direct": ("/v1/chat/completions", {"messages": CHAT, "max_tokens": 6, "ignore_eos": True}, "length", 1),
    "chat direct stream": ("/v1/chat/completions", {"messages": CHAT, "max_tokens": 7, "ignore_eos": True, "stream": True}, "length", 1),
    "chat direct stop": ("/v1/chat/completions", {"messages": CHAT, "max_tokens": 20, **STOPS}, "stop", 1),
    "completion direct": ("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 5, "ignore_eos": True}, "length", 1),
    "completion direct stream": ("/v1/completions", {"prompt": "Once upon", "max_tokens": 4, "ignore_eos": True, "stream": True}, "length", 1),
    "chat logprobs": ("/v1/chat/completions", {"messages": CHAT, "max_tokens": 6, "ignore_eos": True, "logprobs": True}, "length", 1),
    "chat logprobs stream": ("/v1/chat/completions", {"messages": CHAT, "max_tokens": 5, "ignore_eos": True, "logprobs": True, "top_logprobs": 2, "stream": True}, "length", 1),
    "chat logprobs stop": ("/v1/chat/completions", {"messages": CHAT, "max_tokens": 20, "logprobs": True, **STOPS}, "stop", 1),
    "chat n=2": ("/v1/chat/completions", {"messages": CHAT, "max_tokens": 4, "ignore_eos": True, "n": 2, "temperature": 0.8, "seed": 1}, "length", 2),
    "chat n=2 logprobs stop stream": ("/v1/chat/completions", {"messages": CHAT, "max_tokens": 20, "n": 2, "temperature": 0.8, "logprobs": True, "stream": True, **STOPS}, "stop", 2),
    "completion prompt_logprobs": ("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 3, "ignore_eos": True, "logprobs": 2, "prompt_logprobs": 2}, "length", 1),
}


def _idle(base: str) -> bool:
    _, now = _scrape(base)
    return all(_sum(now, name) == 0 for name in ("vllm:num_requests_running", "vllm:num_requests_waiting",
                                                  "streamproxy_engine_requests", "streamproxy_active_streams"))


def _wait_idle(base: str) -> None:
    deadline = time.monotonic() + 60
    while not _idle(base):
        assert time.monotonic() < deadline, "the engine is still busy"
        time.sleep(0.2)


def _send(base: str, model: str, kind: str) -> tuple[list[str], dict]:
    """One request of `kind`: its choices' finish reasons and its usage."""
    path, kind_body, _, _ = KINDS[kind]
    body: dict[str, Any] = {"model": model, "temperature": 0, **kind_body}  # n=2 brings its own temperature
    if body.get("stream"):
        body["stream_options"] = {"include_usage": True}
    r = requests.post(base + path, json=body, timeout=300)
    assert r.status_code == 200, r.text
    if not body.get("stream"):
        out = r.json()
        return [c["finish_reason"] for c in out["choices"]], out["usage"]
    chunks = sse.payloads(r.content)
    reasons = [c["finish_reason"] for chunk in chunks for c in chunk["choices"] if c.get("finish_reason")]
    return reasons, chunks[-1]["usage"]


def _delta(before: dict, after: dict, name: str, **labels: str) -> float:
    return _sum(after, name, **labels) - _sum(before, name, **labels)


def test_vllm_request_series_count_every_route(engine_server, model_name):
    _wait_idle(engine_server)
    _, before = _scrape(engine_server)
    jobs = [kind for kind in KINDS for _ in range(N)]
    with ThreadPoolExecutor(8) as pool:  # concurrent: direct and vLLM-path requests share engine steps
        results = list(pool.map(lambda kind: _send(engine_server, model_name, kind), jobs))
    _wait_idle(engine_server)
    _, after = _scrape(engine_server)

    for kind, (reasons, _) in zip(jobs, results, strict=True):
        _, _, reason, choices = KINDS[kind]
        assert reasons == [reason] * choices, kind
    finished = sum(KINDS[kind][3] for kind in jobs)
    stopped = sum(KINDS[kind][3] for kind in jobs if KINDS[kind][2] == "stop")
    completion = sum(usage["completion_tokens"] for _, usage in results)
    # vLLM prefills each of a request's n choices: its prompt counts n times.
    prompt = sum(usage["prompt_tokens"] * KINDS[kind][3] for kind, (_, usage) in zip(jobs, results, strict=True))
    expected = {
        "vllm:request_success_total": finished,
        "vllm:request_success_total{stop}": stopped,
        "vllm:request_success_total{length}": finished - stopped,
        **{name + "_count": finished for name in PER_REQUEST},
        **{name + "_count": len(jobs) for name in PER_PARENT},
        "vllm:request_params_n_sum": finished,  # n summed over requests
        "vllm:generation_tokens_total": completion,
        "vllm:request_generation_tokens_sum": completion,
        "vllm:prompt_tokens_total": prompt,
        "vllm:request_prompt_tokens_sum": prompt,
        # One token per engine step (no speculative decoding): a gap per token after each choice's first.
        "vllm:inter_token_latency_seconds_count": completion - finished,
        # Every kind took the direct route (one count per request, whatever its n).
        "streamproxy_direct_requests_total": len(jobs),
    }
    got = {}
    for key in expected:
        name, _, reason = key.partition("{")
        labels = {"finished_reason": reason.rstrip("}")} if reason else {}
        got[key] = _delta(before, after, name, **labels)
    assert got == expected


def _stream_then_leave(base: str, model: str, body: dict) -> None:
    """A stream left (connection closed) once content arrived for every choice (with n > 1 the
    children may have their first tokens in different engine steps)."""
    body = {"model": model, "messages": CHAT, "stream": True, "max_tokens": 1500, "ignore_eos": True, **body}
    waiting = set(range(body.get("n", 1)))
    with requests.post(base + "/v1/chat/completions", json=body, stream=True, timeout=120) as r:
        for line in r.iter_lines():
            if not line.startswith(b"data: {"):
                continue
            for choice in json.loads(line[6:]).get("choices", []):
                if choice.get("delta", {}).get("content"):
                    waiting.discard(choice["index"])
            if not waiting:
                break


def test_client_aborts_count_as_vllm_counts_them(engine_server, model_name):
    """A client gone mid-stream: the direct route's request counts in vLLM's series as one on vLLM's
    own path does (vLLM's abort_requests records no finished request; the first token and the
    tokens made so far count), with one choice or two (each child's first token counts)."""
    deltas = {}
    for route, extra in (("n=1", {}), ("n=2", {"n": 2, "logprobs": True})):
        _wait_idle(engine_server)
        _, before = _scrape(engine_server)
        _stream_then_leave(engine_server, model_name, extra)
        _wait_idle(engine_server)
        _, after = _scrape(engine_server)
        deltas[route] = {name: _delta(before, after, name) for name in (
            "vllm:request_success_total", "vllm:e2e_request_latency_seconds_count",
            "vllm:request_params_n_count", "vllm:time_to_first_token_seconds_count")}
        assert _delta(before, after, "vllm:generation_tokens_total") >= 1
    for route, first_tokens in (("n=1", 1), ("n=2", 2)):
        assert deltas[route] == {
            "vllm:request_success_total": 0, "vllm:e2e_request_latency_seconds_count": 0,
            "vllm:request_params_n_count": 0, "vllm:time_to_first_token_seconds_count": first_tokens}, route


def test_the_serve_dashboard_queries_what_the_real_server_exposes(engine_server: str, model_name: str) -> None:
    """configs/grafana/serve.json against the real engine's /metrics, after one request: the check
    tests/production/test_dashboards.py makes with vLLM's families read from its source, here with
    the families and labels the running engine registered (labels only from samples: another process)."""
    from tests.support import dashboards as D

    resp = requests.post(engine_server + "/v1/chat/completions", timeout=120,
                         json={"model": model_name, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "stream": True})
    assert resp.status_code == 200
    text = requests.get(engine_server + "/metrics", timeout=10).text
    assert D.problems(D.load("serve.json"), D.exposed(text)) == []
