"""Metering: the gateway's access-log line (deployment, upstream, replicas, key_id, status, tokens,
finish_reason, TTFT, duration, usage_source) for each API, streamed or not; the usage chunk the gateway
asked for removed when the client did not ask, kept when it did; a stream the client cut
is `counted` from the events relayed."""

from __future__ import annotations

import asyncio

import pytest

from engine_adapter.fake import FakeScript
from tests.gateway.conftest import refused_url
from tests.gateway.gateway_support import (
    DEPLOYMENT,
    SERVED,
    SSE_HEAD,
    chat,
    chunked,
    line_for,
    post,
    renamed,
    sample,
    timeless,
)
from tests.support import sse, wait_until

KEY = "sk-meter-5d0e1a"
PROMPT_TOKENS = 24  # the fake replica's rendering of "hi" as the only user turn
ANSWER_TOKENS = 3  # "Hel", "lo", " world"
HI = [{"role": "user", "content": "hi"}]


async def keyed(replica, gateway):
    r = await replica()
    gw = await gateway(r, keys=[{"id": "team-meter", "key": KEY}])
    return r, gw


def auth(request_id: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEY}", "X-Request-Id": request_id}


def assert_billed(line: dict, upstream: str, *, stream: bool, completion: int = ANSWER_TOKENS) -> None:
    assert line["deployment"] == DEPLOYMENT and line["model"] == DEPLOYMENT
    assert (line["upstream"], line["key_id"], line["status"], line["stream"]) == (upstream, "team-meter", 200, stream)
    assert (line["prompt_tokens"], line["cached_prompt_tokens"], line["completion_tokens"]) == (PROMPT_TOKENS, 0, completion)
    assert line["usage_source"] == "billed"
    assert (line["finish_reason"], line["replicas"], line["migrations"]) == ("stop", [upstream], 0)  # Messages' end_turn, Responses' completed
    assert 0 < line["ttft_ms"] <= line["duration_ms"]
    assert line["client_disconnected"] is False and line["error_code"] is None


async def test_a_stream_whose_client_did_not_ask_for_usage_is_metered_and_the_usage_chunk_removed(replica, gateway, session, access_log):
    r, gw = await keyed(replica, gateway)
    before = sample("streamproxy_gateway_tokens_total", deployment=DEPLOYMENT, kind="completion") or 0.0
    status, _, got = await post(session, gw.url("/v1/chat/completions"), chat(stream=True), **auth("meter-1"))
    assert status == 200
    # Exactly what the replica sends a client that did not ask for usage, renamed.
    _, _, direct = await post(session, r.url("/v1/chat/completions"), chat(model=SERVED, stream=True), **{"X-Request-Id": "meter-1"})
    assert b'"usage"' not in got and timeless(got) == timeless(renamed(direct))
    assert_billed(line_for(access_log, "meter-1"), r.base, stream=True)  # billed: the replica did send the usage asked for
    assert sample("streamproxy_gateway_tokens_total", deployment=DEPLOYMENT, kind="completion") == before + ANSWER_TOKENS


async def test_a_stream_whose_client_asked_for_usage_keeps_it(replica, gateway, session, access_log):
    r, gw = await keyed(replica, gateway)
    body = chat(stream=True, stream_options={"include_usage": True})
    status, _, got = await post(session, gw.url("/v1/chat/completions"), body, **auth("meter-2"))
    assert status == 200
    last = sse.payloads(got)[-1]
    assert last["choices"] == [] and last["usage"]["prompt_tokens"] == PROMPT_TOKENS
    assert last["usage"]["completion_tokens"] == ANSWER_TOKENS and last["model"] == DEPLOYMENT
    assert_billed(line_for(access_log, "meter-2"), r.base, stream=True)


ROUTES = {
    "chat": ("/v1/chat/completions", chat()),
    "completions": ("/v1/completions", {"model": DEPLOYMENT, "prompt": "<|user|>hi\n<|assistant|>"}),  # 24 characters, as rendered
    "responses": ("/v1/responses", {"model": DEPLOYMENT, "input": "hi"}),
    "messages": ("/v1/messages", {"model": DEPLOYMENT, "max_tokens": 50, "messages": HI}),
}


@pytest.mark.parametrize("stream", [False, True], ids=["body", "stream"])
@pytest.mark.parametrize("route", list(ROUTES))
async def test_each_api_is_metered(replica, gateway, session, access_log, route, stream):
    r, gw = await keyed(replica, gateway)
    path, body = ROUTES[route]
    status, _, got = await post(session, gw.url(path), {**body, "stream": stream}, **auth(f"meter-{route}"))
    assert status == 200, got
    assert_billed(line_for(access_log, f"meter-{route}"), r.base, stream=stream)


async def test_the_line_names_every_replica_tried_and_why_the_answer_ended(replica, gateway, session, access_log):
    r = await replica(FakeScript(tokens=["a", "b", "c", "d"]))
    dead = refused_url()
    gw = await gateway(dead, r, upstream={"policy": "round_robin", "health_check_interval": 60.0})
    for i, stream in enumerate((True, False)):  # round robin: the first request's first try is the dead one
        status, _, got = await post(session, gw.url("/v1/chat/completions"), chat(stream=stream, max_tokens=2),
                                    **{"X-Request-Id": f"tried-{i}"})
        assert status == 200, got
    first, second = line_for(access_log, "tried-0"), line_for(access_log, "tried-1")
    assert (first["replicas"], first["upstream"], first["finish_reason"], first["migrations"]) == ([dead, r.base], r.base, "length", 0)
    assert (second["replicas"], second["finish_reason"], second["completion_tokens"]) == ([r.base], "length", 2)


def held_stream(events: list[bytes], release: asyncio.Event):
    """A stub replica that sends `events` and then nothing (no usage, no end) until `release`."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(SSE_HEAD + b"".join(chunked(e) for e in events))
        await writer.drain()
        await release.wait()

    return handler


def chunk(delta: bytes) -> bytes:
    return b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"Qwen/Qwen3-8B","choices":[{"index":0,"delta":' + delta + b"}]}\n\n"


async def test_a_stream_cut_by_the_client_is_counted(stub, gateway, session, access_log):
    release = asyncio.Event()
    # Three tokens, and the replica's keepalives (not tokens) around them.
    events = [b": keepalive\n\n", chunk(b'{"role":"assistant","content":""}'), b": keepalive\n\n"] + [chunk(b'{"content":"w"}')] * 3
    upstream = await stub(held_stream(events, release))
    gw = await gateway(upstream.base, keys=[{"id": "team-meter", "key": KEY}])
    resp = await session.post(gw.url("/v1/chat/completions"), json=chat(stream=True), headers=auth("cut-1"))
    got = b""
    while got.count(b"\n\n") < len(events):  # everything the replica sent has reached the client
        got += await asyncio.wait_for(resp.content.readany(), 10)
    resp.close()
    assert await wait_until(lambda: any('"cut-1"' in line and '"deployment"' in line for line in access_log), 10)
    release.set()
    line = line_for(access_log, "cut-1")
    assert (line["usage_source"], line["completion_tokens"], line["prompt_tokens"], line["cached_prompt_tokens"]) == ("counted", 3, None, None)
    assert (line["status"], line["client_disconnected"], line["key_id"], line["upstream"]) == (200, True, "team-meter", upstream.base)


async def test_a_stream_cut_by_the_client_of_a_real_replica_is_counted(replica, gateway, session, access_log):
    r = await replica(FakeScript(text=" word", token_delay=0.05))
    gw = await gateway(r)
    resp = await session.post(gw.url("/v1/chat/completions"), json=chat(stream=True, max_tokens=1000), headers={"X-Request-Id": "cut-2"})
    got = b""
    while got.count(b" word") < 2:
        got += await asyncio.wait_for(resp.content.readany(), 10)
    resp.close()
    assert await wait_until(lambda: any('"cut-2"' in line and '"deployment"' in line for line in access_log), 10)
    line = line_for(access_log, "cut-2")
    assert line["usage_source"] == "counted" and line["prompt_tokens"] is None
    assert line["completion_tokens"] >= 2  # at least what the client read; the gateway may have relayed more
    assert await wait_until(lambda: r.engine.num_running == 0, 10)
