"""When replicas cannot or will not answer: 503 `upstream_unavailable` + Retry-After when no
replica can take the request; a replica's own 429/503 (and its Retry-After) passed on when
it is the last answer, and a 400 passed through unchanged; failover past a replica that
refuses connections (or answers 429); never a retry once the replica's answer has begun; a
replica whose bytes are not HTTP/1.1 is an `upstream_unavailable` (503, or in-band mid-stream), never
an exception in the gateway."""

from __future__ import annotations

import asyncio
import gzip
import json
import logging
import re

import pytest

from engine_adapter.fake import FakeScript
from tests.gateway.conftest import refused_url
from tests.gateway.gateway_support import (
    DEPLOYMENT,
    SERVED,
    SSE_HEAD,
    chat,
    chunked,
    error_body,
    line_for,
    post,
    renamed,
    sample,
)
from tests.support import sse
from tests.support.fake import hold_start

ROLE = b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"Qwen/Qwen3-8B","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n'
SILENT = FakeScript(text=" word", ttft=30.0)


def retries(reason: str) -> float:
    return sample("streamproxy_gateway_retries_total", deployment=DEPLOYMENT, reason=reason) or 0.0


@pytest.mark.parametrize("stream", [False, True], ids=["body", "stream"])
async def test_no_replica_can_take_it_is_503_upstream_unavailable_with_retry_after(gateway, session, stream):
    gw = await gateway(refused_url(), refused_url())
    status, headers, got = await post(session, gw.url("/v1/chat/completions"), chat(stream=stream))
    assert status == 503
    assert headers["Retry-After"] == "1"
    assert json.loads(got) == error_body(
        f"no replica of deployment `{DEPLOYMENT}` can take the request now; retry shortly", "service_unavailable", "upstream_unavailable"
    )
    assert [r.requests for r in gw.pool().replicas] == [1, 1]  # each tried once


async def test_a_replicas_429_and_retry_after_are_passed_on_when_it_is_the_last_answer(replica, gateway, session):
    r = await replica(SILENT, max_concurrent_requests=1, max_queued_requests=0)
    gw = await gateway(r)
    async with session.post(r.url("/v1/chat/completions"), json=chat(model=SERVED, stream=True)) as busy:
        assert busy.status == 200  # the replica's one slot is taken
        status, headers, got = await post(session, gw.url("/v1/chat/completions"), chat())
        direct_status, direct_headers, direct = await post(session, r.url("/v1/chat/completions"), chat(model=SERVED))
    assert status == direct_status == 429
    assert headers["Retry-After"] == direct_headers["Retry-After"] == "1"
    assert got == direct and json.loads(got)["error"]["type"] == "rate_limit_error"


async def test_a_replicas_503_and_retry_after_are_passed_on_when_it_is_the_last_answer(replica, gateway, session, monkeypatch):
    release = hold_start(monkeypatch)  # the replica's engine stays loading: it answers 503 engine_loading
    r = await replica(ready=False)
    gw = await gateway(r)
    status, headers, got = await post(session, gw.url("/v1/chat/completions"), chat())
    direct_status, direct_headers, direct = await post(session, r.url("/v1/chat/completions"), chat(model=SERVED))
    release.set()
    assert status == direct_status == 503
    assert headers["Retry-After"] == direct_headers["Retry-After"] == "10"
    assert got == direct and json.loads(got)["error"]["code"] == "engine_loading"


async def test_a_429_moves_on_to_another_replica(replica, gateway, session):
    full = await replica(SILENT, max_concurrent_requests=1, max_queued_requests=0)
    free = await replica()
    gw = await gateway(full, free)
    gw.in_order()  # the full one first
    before = retries("429")
    async with session.post(full.url("/v1/chat/completions"), json=chat(model=SERVED, stream=True)) as busy:
        assert busy.status == 200
        status, _, got = await post(session, gw.url("/v1/chat/completions"), chat())
    assert status == 200 and json.loads(got)["model"] == DEPLOYMENT
    assert len(free.inference()) == 1 and retries("429") == before + 1


@pytest.mark.parametrize("stream", [False, True], ids=["body", "stream"])
async def test_a_replicas_400_is_passed_through_unchanged_and_not_retried(replica, gateway, session, stream):
    a, b = await replica(), await replica()
    gw = await gateway(a, b)
    bad = chat(max_tokens=-1, stream=stream)
    status, headers, got = await post(session, gw.url("/v1/chat/completions"), bad)
    direct_status, direct_headers, direct = await post(session, a.url("/v1/chat/completions"), {**bad, "model": SERVED})
    assert status == direct_status == 400
    assert got == direct
    assert json.loads(got) == error_body("'max_tokens' must be at least 1, got -1", "invalid_request_error", None, "max_tokens")
    assert headers["Content-Type"] == direct_headers["Content-Type"]
    assert len(a.inference()) + len(b.inference()) == 2  # the direct one, and one through the gateway: no retry


# -- failover -------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["body", "stream"])
async def test_a_replica_that_refuses_connections_is_skipped(replica, gateway, session, access_log, stream):
    live = await replica()
    dead = refused_url()
    gw = await gateway(dead, live)
    gw.in_order()  # the dead one first
    before = retries("connect_failure")
    status, _, got = await post(session, gw.url("/v1/chat/completions"), chat(stream=stream), **{"X-Request-Id": f"failover-{stream}"})
    assert status == 200
    if stream:
        assert sse.verdict(got) == "done"
    assert [s.request_id for s in live.inference()] == [f"failover-{stream}"]
    assert retries("connect_failure") == before + 1
    assert [r.requests for r in gw.pool().replicas] == [1, 1]
    assert line_for(access_log, f"failover-{stream}")["upstream"] == live.base


def breaks_after(first: bytes, *, declared: bytes = SSE_HEAD, body: bool = False, release: asyncio.Event | None = None):
    """A stub replica that answers 200, sends `first`, and drops the connection (once `release` is set)."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(declared + (first if body else chunked(first)))
        await writer.drain()
        if release is not None:
            await release.wait()

    return handler


async def test_no_retry_once_the_stream_began_an_in_band_error_ends_it(stub, replica, gateway, session, access_log):
    release = asyncio.Event()
    broken = await stub(breaks_after(ROLE, release=release))
    live = await replica()
    gw = await gateway(broken.base, live)
    gw.in_order()  # the breaking one first
    async with session.post(gw.url("/v1/chat/completions"), json=chat(stream=True), headers={"X-Request-Id": "cut-1"}) as resp:
        assert resp.status == 200
        first = await asyncio.wait_for(resp.content.readuntil(b"\n\n"), 10)
        release.set()  # the client has its first bytes: now the replica breaks off
        got = first + await asyncio.wait_for(resp.read(), 10)
    frames = sse.frames(got)
    assert first == renamed(ROLE)
    assert frames[-1] == sse.DONE_FRAME and len(frames) == 3
    error = json.loads(frames[1][len(b"data: "):])["error"]
    assert (error["type"], error["code"], error["param"]) == ("service_unavailable", "upstream_unavailable", None)
    assert re.fullmatch(r"the replica's stream broke off: [^;]+; the answer is incomplete", error["message"]), error
    assert live.inference() == []  # never retried: the client had its first bytes
    line = line_for(access_log, "cut-1")
    assert (line["status"], line["upstream"], line["error_code"]) == (200, broken.base, "upstream_unavailable")


async def test_no_retry_once_a_body_began_503(stub, replica, gateway, session):
    partial = b'{"id":"chatcmpl-1","object":"chat.com'
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 500\r\n\r\n"
    broken = await stub(breaks_after(partial, declared=head, body=True))
    live = await replica()
    gw = await gateway(broken.base, live)
    gw.in_order()
    status, headers, got = await post(session, gw.url("/v1/chat/completions"), chat())
    assert status == 503 and headers["Retry-After"] == "1"
    assert json.loads(got) == error_body("the replica failed before it answered; retry", "service_unavailable", "upstream_unavailable")
    assert live.inference() == []


async def test_replicas_are_asked_for_plain_bytes(stub, gateway, session):
    """The gateway edits what it relays (the model's name, the usage chunk): a replica (or a
    proxy in front of it) that compresses when allowed must not be allowed to."""
    answer = b'{"id":"chatcmpl-1","object":"chat.completion","model":"Qwen/Qwen3-8B","choices":[]}'

    async def compressing(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        _, headers, _ = upstream.requests[-1]
        body, coding = answer, b""
        if "gzip" in headers.get("accept-encoding", ""):
            body, coding = gzip.compress(answer), b"Content-Encoding: gzip\r\n"
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n" + coding + b"Content-Length: %d\r\n\r\n" % len(body) + body)
        await writer.drain()

    upstream = await stub(compressing)
    gw = await gateway(upstream.base)
    status, _, got = await post(session, gw.url("/v1/chat/completions"), chat())
    assert status == 200 and got == renamed(answer)
    assert upstream.requests[0][1]["accept-encoding"] == "identity"


async def test_a_stream_delimited_by_the_close_is_relayed_to_its_last_event(stub, gateway, session, access_log):
    """HTTP/1.0-style replicas (or proxies) end a body by closing: the last events and the close
    may come in one read, and every event before the close reaches the client, with no error."""
    events = [ROLE, ROLE.replace(b'"delta":{"role":"assistant","content":""}', b'"delta":{"content":"hi"}'), b"data: [DONE]\n\n"]

    async def close_delimited(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n" + b"".join(events))
        await writer.drain()
        writer.close()  # the end of the body

    upstream = await stub(close_delimited)
    gw = await gateway(upstream.base)
    async with session.post(gw.url("/v1/chat/completions"), json=chat(stream=True), headers={"X-Request-Id": "close-1"}) as resp:
        assert resp.status == 200
        got = await asyncio.wait_for(resp.read(), 10)
    assert got == b"".join(renamed(e) for e in events)
    line = line_for(access_log, "close-1")
    assert (line["status"], line["error_code"]) == (200, None)


# -- replicas that do not speak HTTP/1.1 ------------------------------------------------


def answers(raw: bytes):
    """A stub replica that answers `raw` and closes."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(raw)
        await writer.drain()

    return handler


@pytest.mark.parametrize("stream", [False, True], ids=["body", "stream"])
@pytest.mark.parametrize(
    "raw",
    [
        b"HTTP/1.1 2\xb20 OK\r\nContent-Length: 2\r\n\r\n{}",  # was a bare ValueError out of h1.feed
        b"HTTP/1.1 200 OK\r\nContent-Length: \xb9\r\n\r\n{}",  # the same
        b"HTTP/1.1 200 OK\r\nX: a\r\n folded\r\nContent-Length: 2\r\n\r\n{}",
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n0x3\r\nabc\r\n0\r\n\r\n",
    ],
    ids=["status-superscript", "length-superscript", "obs-fold", "chunk-size-0x3"],
)
async def test_a_replica_that_answers_bad_http_is_503_upstream_unavailable(stub, gateway, session, access_log, caplog, raw, stream):
    """One read that is not HTTP/1.1 (the head, or the body in the same read): the replica failed
    before the client had a byte, like a refused connection; with no other replica, a 503. Never
    an exception out of the connection's data_received (the loop would log it and drop the connection)."""
    upstream = await stub(answers(raw))
    gw = await gateway(upstream.base)
    request_id = f"bad-http-{stream}-{raw[:20].hex()}"
    status, headers, got = await post(session, gw.url("/v1/chat/completions"), chat(stream=stream), **{"X-Request-Id": request_id})
    assert status == 503 and headers["Retry-After"] == "1"
    assert json.loads(got) == error_body(
        f"no replica of deployment `{DEPLOYMENT}` can take the request now; retry shortly", "service_unavailable", "upstream_unavailable"
    )
    line = line_for(access_log, request_id)
    assert (line["status"], line["upstream"], line["error_code"]) == (503, upstream.base, "upstream_unavailable")
    assert len(upstream.requests) == 1 and retries("connect_failure") >= 1
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


async def test_a_bad_chunk_size_mid_stream_ends_it_in_band(stub, gateway, session, access_log):
    """The first event is relayed; the next chunk's size is one int(x, 16) took and the grammar
    does not: an in-band upstream_unavailable error, then [DONE]."""
    release = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(SSE_HEAD + chunked(ROLE))
        await writer.drain()
        await release.wait()
        writer.write(b"0x3\r\nabc\r\n0\r\n\r\n")
        await writer.drain()

    upstream = await stub(handler)
    gw = await gateway(upstream.base)
    async with session.post(gw.url("/v1/chat/completions"), json=chat(stream=True), headers={"X-Request-Id": "hex-1"}) as resp:
        assert resp.status == 200
        first = await asyncio.wait_for(resp.content.readuntil(b"\n\n"), 10)
        release.set()
        got = first + await asyncio.wait_for(resp.read(), 10)
    frames = sse.frames(got)
    assert first == renamed(ROLE) and frames[-1] == sse.DONE_FRAME and len(frames) == 3
    error = json.loads(frames[1][len(b"data: "):])["error"]
    assert (error["type"], error["code"], error["param"]) == ("service_unavailable", "upstream_unavailable", None)
    assert error["message"] == (
        "the replica's stream broke off: the replica's response is not valid HTTP/1.1 (bad chunk size line: b'0x3');"
        " the answer is incomplete"
    )
    line = line_for(access_log, "hex-1")
    assert (line["status"], line["error_code"]) == (200, "upstream_unavailable")
