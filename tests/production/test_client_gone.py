"""Clients that go away or stop reading: the engine request is aborted, once, and
nothing is left running; a client that never reads cannot make the server
buffer without bound.

This file is the one home of disconnects: mid-stream, before the first token,
non-stream (also while the keepalive newlines flow), during push, a
thousand at once, at any point of the request; finished requests are never
aborted. After each storm (a thousand gone at once, vanishing at any point,
clients that never read) the server's open descriptors, its tasks and the
engine's running requests are back at their baseline (baseline.py).
(The same against the real engine is in tests/engine/test_real_engine.py.)"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import socket
import time

import psutil

from engine_adapter.fake import FakeScript
from tests.production.baseline import Baseline
from tests.production.raw_http import chat_body, http_request, read_head
from tests.support import USER_HI, wait_until

SLOW = FakeScript(text=" word", token_delay=0.05)  # one token, repeated


async def test_disconnect_mid_stream_aborts(server, session):
    srv = await server(SLOW)
    resp = await session.post(
        srv.url("/v1/chat/completions"),
        json={"messages": USER_HI, "stream": True, "max_tokens": 1000},
        headers={"X-Request-Id": "gone-1"},
    )
    assert resp.status == 200
    role = await resp.content.readuntil(b"\n\n")
    assert b'"role":"assistant"' in role
    first = await resp.content.readuntil(b"\n\n")
    assert b'"content":" word"' in first
    assert srv.engine.num_running == 1
    resp.close()
    assert await wait_until(lambda: "gone-1" in srv.engine.aborted and srv.engine.num_running == 0, timeout=5.0), (
        srv.engine.aborted,
        srv.engine.num_running,
    )
    assert srv.engine.aborted.count("gone-1") == 1


async def test_disconnect_mid_stream_completions_aborts(server, session):
    srv = await server(SLOW)
    resp = await session.post(
        srv.url("/v1/completions"), json={"prompt": "hi", "stream": True, "max_tokens": 1000}, headers={"X-Request-Id": "gone-2"}
    )
    await resp.content.readuntil(b"\n\n")
    resp.close()
    assert await wait_until(lambda: "gone-2" in srv.engine.aborted and srv.engine.num_running == 0, timeout=5.0)


async def test_disconnect_mid_stream_of_a_batch_aborts_every_prompts_request(server, session):
    srv = await server(SLOW)
    resp = await session.post(
        srv.url("/v1/completions"),
        json={"prompt": ["a", "b", "cd"], "echo": True, "stream": True, "max_tokens": 1000},
        headers={"X-Request-Id": "gone-batch"},
    )
    assert resp.status == 200
    await resp.content.readuntil(b"\n\n")
    assert srv.engine.num_running == 3
    resp.close()
    ids = ["gone-batch-0", "gone-batch-1", "gone-batch-2"]
    assert await wait_until(lambda: srv.engine.num_running == 0 and all(i in srv.engine.aborted for i in ids), timeout=5.0), (
        srv.engine.aborted,
        srv.engine.num_running,
    )
    assert sorted(srv.engine.aborted) == ids  # each once
    assert srv.state.admission.active == 0


async def test_nonstream_batch_cancelled_mid_generation_aborts_every_prompts_request(server, session):
    srv = await server(SLOW)
    task = asyncio.ensure_future(
        session.post(srv.url("/v1/completions"), json={"prompt": ["a", "b"], "max_tokens": 1000}, headers={"X-Request-Id": "gone-nb"})
    )
    assert await wait_until(lambda: srv.engine.num_running == 2, timeout=5.0)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert await wait_until(lambda: srv.engine.num_running == 0, timeout=5.0)
    assert sorted(srv.engine.aborted) == ["gone-nb-0", "gone-nb-1"]


async def test_disconnect_before_first_token_aborts(server, session):
    # ttft 30 s: the abort must come from the disconnect itself, not from a failed
    # write when the first token finally arrives.
    srv = await server(FakeScript(text=" word", ttft=30.0, token_delay=0.05))
    resp = await session.post(
        srv.url("/v1/chat/completions"),
        json={"messages": USER_HI, "stream": True, "max_tokens": 1000},
        headers={"X-Request-Id": "gone-3"},
    )
    assert resp.status == 200
    assert srv.engine.num_running == 1
    resp.close()
    assert await wait_until(lambda: "gone-3" in srv.engine.aborted and srv.engine.num_running == 0, timeout=5.0), (
        srv.engine.aborted,
        srv.engine.num_running,
    )


async def test_nonstream_cancelled_mid_generation_aborts(server, session):
    srv = await server(SLOW)
    task = asyncio.ensure_future(
        session.post(srv.url("/v1/chat/completions"), json={"messages": USER_HI, "max_tokens": 1000}, headers={"X-Request-Id": "gone-4"})
    )
    assert await wait_until(lambda: srv.engine.num_running == 1, timeout=5.0)
    await asyncio.sleep(0.15)  # a few tokens in
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        pass
    assert await wait_until(lambda: "gone-4" in srv.engine.aborted and srv.engine.num_running == 0, timeout=5.0), (
        srv.engine.aborted,
        srv.engine.num_running,
    )


async def test_client_gone_during_keepalive_aborts_quietly(server, session, access_log, caplog):
    srv = await server(FakeScript(text=" x", token_delay=0.05), nonstream_keepalive_after=0.1, nonstream_keepalive_interval=0.05)
    resp = await session.post(srv.url("/v1/completions"), json={"prompt": "hi", "max_tokens": 1000}, headers={"X-Request-Id": "ka-gone"})
    assert resp.status == 200
    assert await resp.content.readexactly(2) == b"\n\n"
    resp.close()
    assert await wait_until(lambda: "ka-gone" in srv.engine.aborted and srv.engine.num_running == 0, 5.0)
    assert await wait_until(lambda: len(access_log) == 1, 5.0)
    line = json.loads(access_log[0])
    assert line["status"] == 200 and line["client_disconnected"] is True
    assert not [r for r in caplog.records if r.levelname == "ERROR"], caplog.text


async def test_disconnect_during_push_aborts_the_engine_request(server, session, pushes):
    srv = await server(FakeScript(text=" word", token_delay=0.01))
    resp = await session.post(
        srv.url("/v1/chat/completions"), json={"messages": USER_HI, "stream": True, "max_tokens": 1000}, headers={"X-Request-Id": "push-gone"}
    )
    await resp.content.readuntil(b"\n\n")
    assert await wait_until(lambda: sum(took for _, took in pushes) >= 5, 5.0)
    resp.close()
    assert await wait_until(lambda: "push-gone" in srv.engine.aborted and srv.engine.num_running == 0, 5.0), srv.engine.aborted
    assert srv.engine.aborted.count("push-gone") == 1


async def test_finished_requests_are_not_aborted(server, session):
    srv = await server(FakeScript(tokens=["a", "b"]))
    for stream in (False, True):
        async with session.post(srv.url("/v1/chat/completions"), json={"messages": USER_HI, "stream": stream}) as resp:
            await resp.read()
            assert resp.status == 200
    assert srv.engine.aborted == []
    assert srv.engine.num_running == 0


async def test_server_survives_disconnects(server, session):
    srv = await server(SLOW)
    for i in range(3):
        resp = await session.post(
            srv.url("/v1/chat/completions"),
            json={"messages": USER_HI, "stream": True, "max_tokens": 1000},
            headers={"X-Request-Id": f"r{i}"},
        )
        await resp.content.readuntil(b"\n\n")
        resp.close()
    assert await wait_until(lambda: srv.engine.num_running == 0, timeout=5.0)
    assert sorted(srv.engine.aborted) == ["r0", "r1", "r2"]
    async with session.post(srv.url("/v1/chat/completions"), json={"messages": USER_HI, "max_tokens": 2}) as resp:
        assert resp.status == 200
        assert (await resp.json())["choices"][0]["message"]["content"] == " word word"


# -- many clients, raw sockets --------------------------------------------------------------


async def test_1000_clients_disconnecting_after_first_byte_leave_nothing_running(server):
    srv = await server(FakeScript(text=" word", token_delay=0.01), max_model_len=100_000)
    before = Baseline.take()
    n = 1000
    ids = [f"gone-{i}" for i in range(n)]
    seen_first_byte = 0

    async def client(rid: str) -> None:
        nonlocal seen_first_byte
        reader, writer = await asyncio.open_connection("127.0.0.1", srv.port)
        writer.write(http_request("POST", "/v1/chat/completions", chat_body(stream=True, max_tokens=50_000), {"X-Request-Id": rid}))
        await writer.drain()
        first = await reader.read(1)
        assert first == b"H"  # "HTTP/1.1 200 ..."
        seen_first_byte += 1
        writer.transport.abort()  # gone, without a goodbye

    t0 = time.monotonic()
    await asyncio.gather(*(client(rid) for rid in ids))
    assert seen_first_byte == n
    assert await wait_until(lambda: not srv.runner.server.connections and srv.engine.num_running == 0, 10.0)
    elapsed = time.monotonic() - t0
    submitted = {s[0] for s in srv.engine.submitted}
    assert submitted == set(ids)
    assert sorted(srv.engine.aborted) == sorted(ids)  # each aborted exactly once
    assert srv.state.admission.active == 0
    assert len(srv.state.inflight) == 0
    assert elapsed < 20, elapsed
    await before.back(srv)


async def test_clients_vanishing_at_any_point_leave_nothing_running(server):
    """Before the request is complete, right after it, and mid-stream, streaming and not."""
    srv = await server(FakeScript(text=" word", ttft=0.05, token_delay=0.01), max_model_len=100_000)
    before = Baseline.take()

    async def client(i: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", srv.port)
        req = http_request("POST", "/v1/completions", f'{{"prompt":"hi","max_tokens":50000,"stream":{"true" if i % 2 else "false"}}}'.encode(), {"X-Request-Id": f"v-{i}"})
        point = i % 4
        if point == 0:
            writer.write(req[: len(req) // 2])  # half a request
            await writer.drain()
        else:
            writer.write(req)
            await writer.drain()
            if point >= 2:
                await asyncio.sleep(0.02 * point)
        writer.transport.abort()

    await asyncio.gather(*(client(i) for i in range(200)))
    # Every connection's handler has ended (so nothing can still submit), and nothing runs.
    assert await wait_until(lambda: not srv.runner.server.connections and srv.engine.num_running == 0, 10.0)
    submitted = {s[0] for s in srv.engine.submitted}
    assert submitted == set(srv.engine.aborted)
    assert srv.state.admission.active == 0 and len(srv.state.inflight) == 0
    await before.back(srv)


def _server_buffers(srv) -> list[int]:
    return [h.transport.get_write_buffer_size() for h in srv.runner.server.connections if h.transport is not None]


async def test_client_that_never_reads_is_bounded_then_ended(server):
    """A fast stream (4 KiB per token, no delay) to clients that never read.

    Bound (per stream): the transport buffer stays under aiohttp's 64 KiB
    drain threshold + the loop's 64 KiB high-water mark + one write; once the
    write is blocked for --write-stall-timeout the stream is ended, the
    transport aborted (its buffer freed) and the engine request aborted.
    """
    stall = 0.5
    word = "x" * 4095 + " "
    srv = await server(FakeScript(text=word), max_model_len=10_000_000, write_stall_timeout=stall)
    clients = 20
    proc = psutil.Process(os.getpid())
    gc.collect()
    rss_before = proc.memory_info().rss
    before = Baseline.take()
    socks = []
    for i in range(clients):
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.setblocking(False)
        await asyncio.get_running_loop().sock_connect(s, ("127.0.0.1", srv.port))
        await asyncio.get_running_loop().sock_sendall(
            s, http_request("POST", "/v1/completions", b'{"prompt":"hi","max_tokens":5000000,"stream":true}', {"X-Request-Id": f"stuck-{i}"})
        )
        socks.append(s)
    peak_buffer = 0
    peak_total = 0
    peak_rss = rss_before
    t0 = time.monotonic()
    try:
        while time.monotonic() - t0 < 30:
            sizes = _server_buffers(srv)
            if sizes:
                peak_buffer = max(peak_buffer, max(sizes))
                peak_total = max(peak_total, sum(sizes))
            peak_rss = max(peak_rss, proc.memory_info().rss)
            if len(srv.engine.aborted) == clients and srv.engine.num_running == 0:
                break
            await asyncio.sleep(0.005)
        ended_after = time.monotonic() - t0
        assert sorted(srv.engine.aborted) == sorted(f"stuck-{i}" for i in range(clients))
        assert srv.engine.num_running == 0
        # Each stream was ended about `stall` after its buffer filled (not left to run).
        assert ended_after < stall + 10.0, ended_after
        per_stream_bound = 64 * 1024 + 64 * 1024 + 8 * 1024
        assert peak_buffer <= per_stream_bound, peak_buffer
        growth = peak_rss - rss_before
        print(
            f"\nnever-reading clients={clients}: peak transport buffer per stream={peak_buffer} B, "
            f"all streams={peak_total} B, RSS growth={growth / 2**20:.1f} MiB, ended after {ended_after:.2f} s"
        )
        assert growth < 64 * 2**20, growth
        # The connections were dropped (their buffers freed), and the server still serves.
        assert await wait_until(lambda: not any(_server_buffers(srv)), 5.0)
        reader, writer = await asyncio.open_connection("127.0.0.1", srv.port)
        writer.write(http_request("GET", "/health"))
        status, _ = await read_head(reader)
        assert status == 200
        writer.close()
    finally:
        for s in socks:
            s.close()
    await before.back(srv)
