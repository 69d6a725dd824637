"""/metrics (streamproxy_* families), the JSON access-log line, and Deprecation headers."""

from __future__ import annotations

import asyncio
import json
import re

from prometheus_client.parser import text_string_to_metric_families

from engine_adapter.fake import FakeScript
from tests.production.raw_http import http_request
from tests.support import USER_HI, wait_until

FAMILIES = {
    "streamproxy_time_to_first_byte_seconds": "histogram",
    "streamproxy_time_to_first_token_seconds": "histogram",
    "streamproxy_inter_token_latency_seconds": "histogram",
    "streamproxy_request_duration_seconds": "histogram",
    "streamproxy_active_streams": "gauge",
    "streamproxy_requests_running": "gauge",
    "streamproxy_requests_queued": "gauge",
    "streamproxy_responses": "counter",
    "streamproxy_client_disconnects": "counter",
    "streamproxy_heartbeats": "counter",
    "streamproxy_write_stalls": "counter",
    "streamproxy_admission_rejections": "counter",
    "streamproxy_engine_aborts": "counter",
    "streamproxy_engine_requests": "gauge",
}


async def _metrics(session, srv) -> dict[str, dict[tuple, float]]:
    async with session.get(srv.url("/metrics")) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/plain")
        text = await resp.text()
    out: dict[str, dict[tuple, float]] = {}
    for fam in text_string_to_metric_families(text):
        for sample in fam.samples:
            out.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    out["__types__"] = {(fam.name,): fam.type for fam in text_string_to_metric_families(text)}  # type: ignore[misc]  # the families' types, beside the floats
    return out


def _value(m: dict, name: str, **labels: str) -> float:
    return m.get(name, {}).get(tuple(sorted(labels.items())), 0.0)


async def test_metrics_families_and_counts(server, session):
    srv = await server(FakeScript(text=" w", ttft=0.4, token_delay=0.01), sse_heartbeat=0.05, max_concurrent_requests=1, max_queued_requests=0)
    before = await _metrics(session, srv)
    types = before["__types__"]
    for name, kind in FAMILIES.items():
        assert types.get((name,)) == kind, (name, types.get((name,)))

    async with session.post(srv.url("/v1/chat/completions"), json={"messages": USER_HI, "stream": True, "max_tokens": 5}) as resp:
        body = await resp.read()
    assert b": keepalive" in body
    # One rejected (the slot is taken), one disconnect mid-stream.
    holder = await session.post(srv.url("/v1/completions"), json={"prompt": "hi", "stream": True, "max_tokens": 1000}, headers={"X-Request-Id": "m-gone"})
    await holder.content.readuntil(b"\n\n")
    while b'"text":" w"' not in await holder.content.readuntil(b"\n\n"):
        pass  # until its first token
    assert _value(await _metrics(session, srv), "streamproxy_engine_requests") == 1  # the engine holds it
    async with session.post(srv.url("/v1/completions"), json={"prompt": "hi"}) as resp:
        assert resp.status == 429
    holder.close()
    assert await wait_until(lambda: "m-gone" in srv.engine.aborted, 5.0)
    after = await _metrics(session, srv)
    for _ in range(500):  # the disconnected request is counted when its handler ends
        if _value(after, "streamproxy_request_duration_seconds_count") - _value(before, "streamproxy_request_duration_seconds_count") >= 3:
            break
        await asyncio.sleep(0.01)
        after = await _metrics(session, srv)

    def delta(name: str, **labels: str) -> float:
        return _value(after, name, **labels) - _value(before, name, **labels)

    route = "/v1/chat/completions"
    assert delta("streamproxy_responses_total", route=route, status="200", code="") == 1
    assert delta("streamproxy_responses_total", route="/v1/completions", status="429", code="too_many_requests") == 1
    assert delta("streamproxy_responses_total", route="/v1/completions", status="200", code="client_disconnected") == 1
    assert delta("streamproxy_admission_rejections_total") == 1
    assert delta("streamproxy_client_disconnects_total") == 1
    assert delta("streamproxy_engine_aborts_total") == 1
    assert delta("streamproxy_heartbeats_total", kind="sse") >= 2
    assert delta("streamproxy_time_to_first_token_seconds_count") == 2
    assert delta("streamproxy_time_to_first_byte_seconds_count") == 3
    assert delta("streamproxy_request_duration_seconds_count") == 3
    # Inter-token latency: once per write with text after the first (not per token).
    assert 4 <= delta("streamproxy_inter_token_latency_seconds_count") <= 4 + 1000
    # TTFT ~0.4 s (the engine's), TTFB well before it (headers go out first).
    ttft_sum = delta("streamproxy_time_to_first_token_seconds_sum")
    assert 0.25 < ttft_sum < 10.0, ttft_sum  # two requests of at least 0.4 s each
    assert _value(after, "streamproxy_active_streams") == 0
    assert _value(after, "streamproxy_engine_requests") == 0  # nothing left in the engine
    assert _value(after, "streamproxy_requests_running") == 0 and _value(after, "streamproxy_requests_queued") == 0


async def test_access_log_line_fields(server, session, access_log):
    srv = await server(FakeScript(text=" a", ttft=0.05, token_delay=0.01))
    await (
        await session.post(
            srv.url("/v1/chat/completions"),
            json={"model": "fake", "messages": [{"role": "user", "content": "SECRET PROMPT"}], "user": "u-42", "stream": True, "max_tokens": 3},
            headers={"X-Request-Id": "log-1"},
        )
    ).read()
    await (await session.post(srv.url("/v1/completions"), json={"prompt": "SECRET PROMPT", "max_tokens": 2}, headers={"X-Request-Id": "log-2"})).read()
    await (await session.post(srv.url("/v1/chat/completions"), json={"messages": "nope"}, headers={"X-Request-Id": "log-3"})).read()
    gone = await session.post(srv.url("/v1/completions"), json={"prompt": "hi", "stream": True, "max_tokens": 1000}, headers={"X-Request-Id": "log-4"})
    await gone.content.readuntil(b"\n\n")
    gone.close()
    assert await wait_until(lambda: len(access_log) == 4, 5.0), access_log
    assert all("SECRET" not in line and "\n" not in line for line in access_log)
    lines = {d["request_id"]: d for d in map(json.loads, access_log)}
    keys = {
        "ts", "request_id", "method", "path", "status", "model", "user", "stream", "prompt_tokens", "completion_tokens",
        "cached_tokens", "finish_reason", "error_code", "ttfb_ms", "ttft_ms", "duration_ms", "client_disconnected", "remote",
    }
    assert all(set(d) == keys for d in lines.values())
    one = lines["log-1"]
    assert one["method"] == "POST" and one["path"] == "/v1/chat/completions" and one["status"] == 200
    assert one["model"] == "fake" and one["user"] == "u-42" and one["stream"] is True
    assert one["prompt_tokens"] == len("<|user|>SECRET PROMPT\n<|assistant|>")
    assert one["completion_tokens"] == 3 and one["cached_tokens"] == 0
    assert one["finish_reason"] == "length" and one["error_code"] is None and one["client_disconnected"] is False
    assert 0 <= one["ttfb_ms"] < one["ttft_ms"] <= one["duration_ms"]
    assert one["ttft_ms"] >= 40
    assert one["remote"] == "127.0.0.1"
    two = lines["log-2"]
    assert two["stream"] is False and two["model"] is None and two["finish_reason"] == "length"
    assert two["completion_tokens"] == 2 and two["prompt_tokens"] == len("SECRET PROMPT") and two["ttft_ms"] is not None
    three = lines["log-3"]
    assert three["status"] == 400 and three["error_code"] == "invalid_type" and three["completion_tokens"] is None
    four = lines["log-4"]
    assert four["status"] == 200 and four["client_disconnected"] is True and four["finish_reason"] is None


async def test_access_log_for_a_client_gone_before_the_response(server, access_log):
    srv = await server(FakeScript(text=" w", ttft=5.0))
    reader, writer = await asyncio.open_connection("127.0.0.1", srv.port)
    writer.write(http_request("POST", "/v1/completions", b'{"prompt":"hi","max_tokens":5}', {"X-Request-Id": "early"}))
    await writer.drain()
    assert await wait_until(lambda: srv.engine.num_running == 1, 5.0)
    writer.transport.abort()
    assert await wait_until(lambda: len(access_log) == 1, 5.0)
    line = json.loads(access_log[0])
    assert line["status"] == 499 and line["client_disconnected"] is True and line["request_id"] == "early"
    assert srv.engine.aborted == ["early"]


async def test_deprecation_header_for_marked_route_and_field(server, session):
    srv = await server(
        deprecated=["/v1/completions@2025-06-30", "/v1/chat/completions#max_tokens", "/v1/models/{model_id}"],
        deprecation_link="https://example.com/deprecations",
    )
    async with session.post(srv.url("/v1/completions"), json={"prompt": "hi", "max_tokens": 2}) as resp:
        assert resp.status == 200
        assert resp.headers["Deprecation"] == "@1751241600"
        assert resp.headers["Link"] == '<https://example.com/deprecations>; rel="deprecation"'
    async with session.post(srv.url("/v1/chat/completions"), json={"messages": USER_HI, "max_tokens": 2}) as resp:
        assert resp.status == 200
        assert re.fullmatch(r"@\d+", resp.headers["Deprecation"])
    for body in ({"messages": USER_HI, "max_completion_tokens": 2}, {"messages": USER_HI, "stream": True}):
        async with session.post(srv.url("/v1/chat/completions"), json=body) as resp:
            assert resp.status == 200
            assert "Deprecation" not in resp.headers
            await resp.read()
    async with session.post(srv.url("/v1/chat/completions"), json={"messages": USER_HI, "stream": True, "max_tokens": 2}) as resp:
        assert "Deprecation" in resp.headers  # streams too: the header goes out with the 200
        await resp.read()
    async with session.get(srv.url("/v1/models/fake")) as resp:
        assert resp.status == 200 and "Deprecation" in resp.headers
    async with session.get(srv.url("/v1/models")) as resp:
        assert "Deprecation" not in resp.headers
