"""A client that goes away in any phase closes the upstream request, and the replica aborts:
while the gateway waits for the replica's answer (stream or not), mid-stream (each API),
and during a non-stream answer's keepalive. The order is what is checked: the replica saw
the request, the client left, then the replica saw the abort (its engine's `aborted`, or a
stub's end of file) with nothing left running or counted in flight."""

from __future__ import annotations

import asyncio

import pytest

from engine_adapter.fake import FakeScript
from tests.gateway.gateway_support import DEPLOYMENT, chat, line_for, sample
from tests.support import wait_until

SLOW = FakeScript(text=" word", token_delay=0.05)  # a token every 50 ms, for ever (max_tokens permitting)
SILENT = FakeScript(text=" word", ttft=30.0)
GONE = 10.0  # generous bound on "the replica saw the abort"; a passing test waits far less


def all_settled(gw) -> bool:
    """No replica of the deployment counted busy, in the pool or in the in-flight gauge."""
    return all(
        r.outstanding == 0 and not sample("streamproxy_gateway_in_flight", deployment=DEPLOYMENT, upstream=r.url)
        for r in gw.pool().replicas
    )


async def aborted(r, request_id: str) -> bool:
    return await wait_until(lambda: request_id in r.engine.aborted and r.engine.num_running == 0, GONE)


class Silent:
    """A stub replica that takes the request and never answers; `closed` once the gateway hangs up."""

    def __init__(self) -> None:
        self.got = asyncio.Event()
        self.closed = asyncio.Event()

    async def __call__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.got.set()
        assert await reader.read() == b""  # nothing more: the gateway closed its side
        self.closed.set()


@pytest.mark.parametrize("stream", [False, True], ids=["body", "stream"])
async def test_gone_while_waiting_for_the_replicas_answer_closes_the_upstream_request(stub, gateway, session, access_log, stream):
    silent = Silent()
    upstream = await stub(silent)
    gw = await gateway(upstream.base, sse_heartbeat=30)  # nothing at all goes to the client meanwhile
    call = asyncio.ensure_future(session.post(gw.url("/v1/chat/completions"), json=chat(stream=stream), headers={"X-Request-Id": "wait-1"}))
    await asyncio.wait_for(silent.got.wait(), GONE)
    assert not silent.closed.is_set()
    call.cancel()  # the client goes away
    await asyncio.wait_for(silent.closed.wait(), GONE)
    assert await wait_until(lambda: all_settled(gw), GONE)
    assert await wait_until(lambda: any('"wait-1"' in line for line in access_log), GONE)
    line = line_for(access_log, "wait-1")
    assert (line["status"], line["client_disconnected"], line["upstream"]) == (499, True, upstream.base)


async def test_gone_while_a_replica_generates_a_body_aborts_it(replica, gateway, session):
    r = await replica(SILENT)
    gw = await gateway(r)
    call = asyncio.ensure_future(session.post(gw.url("/v1/chat/completions"), json=chat(), headers={"X-Request-Id": "body-1"}))
    assert await wait_until(lambda: r.engine.num_running == 1, GONE)
    call.cancel()
    assert await aborted(r, "body-1"), r.engine.aborted
    assert await wait_until(lambda: all_settled(gw), GONE)


STREAMS = {
    "chat": ("/v1/chat/completions", chat(stream=True, max_tokens=1000)),
    "responses": ("/v1/responses", {"model": DEPLOYMENT, "input": "hi", "stream": True, "max_output_tokens": 1000}),
    "messages": ("/v1/messages", {"model": DEPLOYMENT, "max_tokens": 1000, "stream": True, "messages": [{"role": "user", "content": "hi"}]}),
}


@pytest.mark.parametrize("api", list(STREAMS))
async def test_gone_mid_stream_aborts_the_replicas_request(replica, gateway, session, access_log, api):
    r = await replica(SLOW)
    gw = await gateway(r)
    path, body = STREAMS[api]
    resp = await session.post(gw.url(path), json=body, headers={"X-Request-Id": f"mid-{api}"})
    assert resp.status == 200
    seen = b""
    while seen.count(b" word") < 2:  # two tokens relayed: the stream is under way
        seen += await asyncio.wait_for(resp.content.readany(), GONE)
    assert r.engine.num_running == 1
    resp.close()
    assert await aborted(r, f"mid-{api}"), r.engine.aborted
    assert await wait_until(lambda: all_settled(gw), GONE)
    assert await wait_until(lambda: any(f'"mid-{api}"' in line and '"deployment"' in line for line in access_log), GONE)
    line = line_for(access_log, f"mid-{api}")
    assert (line["status"], line["client_disconnected"]) == (200, True)


async def test_gone_during_the_nonstream_keepalive_aborts_the_replicas_request(replica, gateway, session):
    r = await replica(SILENT)
    gw = await gateway(r, nonstream_keepalive_after=0.05, nonstream_keepalive_interval=0.05)
    resp = await session.post(gw.url("/v1/chat/completions"), json=chat(), headers={"X-Request-Id": "keepalive-1"})
    assert resp.status == 200
    assert await asyncio.wait_for(resp.content.readexactly(1), GONE) == b"\n"  # the early 200 and a newline are out
    assert r.engine.num_running == 1
    resp.close()
    assert await aborted(r, "keepalive-1"), r.engine.aborted
    assert await wait_until(lambda: all_settled(gw), GONE)


async def test_a_finished_stream_is_not_aborted(replica, gateway, session):
    r = await replica()
    gw = await gateway(r)
    async with session.post(gw.url("/v1/chat/completions"), json=chat(stream=True), headers={"X-Request-Id": "done-1"}) as resp:
        await resp.read()
    assert await wait_until(lambda: all_settled(gw), GONE)
    assert r.engine.aborted == [] and [rid for rid, _, _ in r.engine.submitted] == ["done-1"]
