"""Graceful drain: stop accepting, let in-flight requests finish up to the drain
timeout, end the rest with an in-band error event and an engine abort, exit 0.

In-process (server.drain on the test's runner) and for real: `python -m
streamproxy serve --engine fake` in a subprocess, SIGTERM during 100 streams.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time

import aiohttp
import pytest

from engine_adapter.fake import FakeScript
from harness.server import start_server
from streamproxy.http.server import drain
from tests.support import USER_HI, sse, wait_until


async def test_drain_finishes_short_requests_and_ends_long_ones(server, session):
    srv = await server(
        FakeScript(text=" w", token_delay=0.02),
        max_model_len=100_000,
        nonstream_keepalive_after=0.2,
        nonstream_keepalive_interval=0.1,
    )
    url = srv.url("/v1/completions")

    async def stream(rid: str, tokens: int) -> bytes:
        async with session.post(url, json={"prompt": "hi", "stream": True, "max_tokens": tokens}, headers={"X-Request-Id": rid}) as resp:
            assert resp.status == 200
            return await resp.read()

    async def plain(rid: str, tokens: int) -> tuple[int, bytes]:
        async with session.post(url, json={"prompt": "hi", "max_tokens": tokens}, headers={"X-Request-Id": rid}) as resp:
            return resp.status, await resp.read()

    short = [asyncio.ensure_future(stream(f"short-{i}", 15)) for i in range(5)]  # ~0.3 s: inside the drain
    long = [asyncio.ensure_future(stream(f"long-{i}", 5000)) for i in range(5)]
    plain_short = asyncio.ensure_future(plain("plain-short", 15))
    plain_long = asyncio.ensure_future(plain("plain-long", 5000))
    assert await wait_until(lambda: srv.engine.num_running == 12, 5.0)
    await asyncio.sleep(0.05)
    t0 = time.monotonic()
    ended = await drain(srv.runner, srv.app, timeout=1.5)
    took = time.monotonic() - t0
    assert ended == 6 and 1.45 < took < 10.0, (ended, took)  # the long ones kept it to its timeout
    for body in await asyncio.gather(*short):
        assert sse.verdict(body) == "done"
    for body in await asyncio.gather(*long):
        assert sse.verdict(body) == "error"
        err = sse.payloads(body)[-1]["error"]
        assert err["code"] == "server_shutting_down" and err["type"] == "service_unavailable"
    status, raw = await plain_short
    assert status == 200 and json.loads(raw)["choices"][0]["finish_reason"] == "length"
    status, raw = await plain_long
    assert status == 200 and raw.startswith(b"\n")  # it had sent its early 200
    assert json.loads(raw)["error"]["code"] == "server_shutting_down"
    assert await wait_until(lambda: srv.engine.num_running == 0, 5.0)
    assert sorted(srv.engine.aborted) == sorted([f"long-{i}" for i in range(5)] + ["plain-long"])
    # No longer listening.
    with pytest.raises(aiohttp.ClientConnectorError):
        await session.get(srv.url("/health"))


async def test_drain_with_nothing_in_flight_is_immediate_and_new_work_is_refused(server):
    srv = await server()
    async with aiohttp.ClientSession() as s:
        async with s.get(srv.url("/health")) as resp:  # a keep-alive connection
            assert resp.status == 200
        srv.state.inflight.begin_drain(asyncio.get_running_loop().time() + 5)
        async with s.post(srv.url("/v1/chat/completions"), json={"messages": USER_HI}) as resp:
            assert resp.status == 503
            assert resp.headers["Retry-After"]
            assert (await resp.json())["error"]["code"] == "server_shutting_down"
    t0 = time.monotonic()
    assert await drain(srv.runner, srv.app, timeout=60) == 0
    assert time.monotonic() - t0 < 30  # at once: it did not wait for its timeout


async def test_sigterm_during_100_streams_loses_none_silently(tmp_path):
    drain_timeout = 3.0  # the even streams need ~1 s of it
    args = [
        "--engine", "fake",
        "--fake-token-delay", "0.02", "--fake-max-model-len", "100000",
        "--drain-timeout", str(drain_timeout), "--sse-heartbeat", "0.5",
        "--access-log", "stdout", "--log-level", "warning",
    ]
    srv = await asyncio.to_thread(start_server, args, tmp_path, timeout=20)
    proc, base = srv.proc, srv.base
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
            started = 0

            async def stream(i: int) -> bytes:
                nonlocal started
                # Even: ~1 s of tokens (finish inside the drain); odd: ~100 s (ended by it).
                tokens = 50 if i % 2 == 0 else 5000
                async with session.post(
                    base + "/v1/chat/completions",
                    json={"messages": USER_HI, "stream": True, "max_tokens": tokens},
                    headers={"X-Request-Id": f"s-{i}"},
                ) as resp:
                    assert resp.status == 200
                    body = await resp.content.readuntil(b"\n\n")
                    body += await resp.content.readuntil(b"\n\n")  # the first token is out
                    started += 1
                    # Reads to the end of the chunked body: a cut-off stream raises here.
                    return body + await resp.read()

            tasks = [asyncio.ensure_future(stream(i)) for i in range(100)]
            assert await wait_until(lambda: started == 100, 15.0), started
            proc.send_signal(signal.SIGTERM)
            t_sig = time.monotonic()
            bodies = await asyncio.gather(*tasks)
            # Stopped listening at once.
            await asyncio.sleep(0.1)
            with pytest.raises(aiohttp.ClientConnectionError):
                async with session.get(base + "/health") as resp:
                    await resp.read()
        verdicts = [sse.verdict(b) for b in bodies]
        assert verdicts[0::2] == ["done"] * 50
        assert verdicts[1::2] == ["error"] * 50
        for body in bodies[1::2]:
            assert sse.payloads(body)[-1]["error"]["code"] == "server_shutting_down"
        code = await asyncio.get_running_loop().run_in_executor(None, proc.wait, 15)
        took = time.monotonic() - t_sig
        out, err = srv.stdout(), srv.stderr()
        assert code == 0, err[-3000:]
        assert took < drain_timeout + 10, took
        lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        by_id = {line["request_id"]: line for line in lines if line["path"] == "/v1/chat/completions"}
        assert len(by_id) == 100
        for i in range(100):
            line = by_id[f"s-{i}"]
            assert line["status"] == 200 and not line["client_disconnected"]
            if i % 2:
                assert line["error_code"] == "server_shutting_down" and line["finish_reason"] is None
            else:
                assert line["error_code"] is None and line["finish_reason"] == "length" and line["completion_tokens"] == 50
        assert "Traceback" not in err, err[-3000:]
    finally:
        srv.stop()
