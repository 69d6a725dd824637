"""SSE heartbeats: while queued, during a long time to first token, in mid-stream gaps,
and a proxy that drops idle connections keeps a slow stream alive only thanks to them."""

from __future__ import annotations

import asyncio
import time

import pytest
from aiohttp import web

from engine_adapter.base import Delta, OutputStream
from engine_adapter.fake import FakeScript
from streamproxy.core.stream import ChatStreamEncoder
from streamproxy.http.writer import SSE_HEADERS, pump_sse
from tests.support import USER_HI, sse, wait_until
from tests.support.sse import DONE_FRAME as DONE
from tests.support.sse import KEEPALIVE_FRAME as KEEPALIVE


async def _timed_frames(session, url: str, body: dict) -> list[tuple[float, bytes]]:
    """Each SSE frame with the time it arrived (seconds since the request was sent)."""
    t0 = time.monotonic()
    out: list[tuple[float, bytes]] = []
    async with session.post(url, json=body) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"] == "text/event-stream"
        buf = b""
        async for chunk in resp.content.iter_any():
            buf += chunk
            while b"\n\n" in buf:
                frame, buf = buf.split(b"\n\n", 1)
                out.append((time.monotonic() - t0, frame))
    assert buf == b""
    return out


def _max_silence(timed: list[tuple[float, bytes]]) -> float:
    times = [0.0] + [t for t, _ in timed]
    return max(b - a for a, b in zip(times, times[1:]))


async def test_heartbeat_during_long_time_to_first_token(server, session):
    srv = await server(FakeScript(tokens=["a", "b"], ttft=0.6), sse_heartbeat=0.1)
    timed = await _timed_frames(session, srv.url("/v1/chat/completions"), {"messages": USER_HI, "stream": True})
    kinds = [f for _, f in timed]
    first_content = next(i for i, f in enumerate(kinds) if b'"content":"a"' in f)
    beats_before = [f for f in kinds[:first_content] if f == KEEPALIVE]
    assert 4 <= len(beats_before) <= 7, kinds
    assert kinds[-1] == DONE
    # Never silent for much longer than the heartbeat, from the headers on.
    assert _max_silence(timed) < 0.1 + 0.15, timed


async def test_heartbeat_in_mid_stream_gaps(server, session):
    srv = await server(FakeScript(text=" slow", token_delay=0.35), sse_heartbeat=0.1)
    timed = await _timed_frames(
        session, srv.url("/v1/chat/completions"), {"messages": USER_HI, "stream": True, "max_tokens": 3}
    )
    kinds = [f for _, f in timed]
    contents = [i for i, f in enumerate(kinds) if b'"content":" slow"' in f]
    assert len(contents) == 3
    # Between consecutive tokens (0.35 s apart) there are heartbeats.
    for a, b in zip(contents, contents[1:]):
        assert 2 <= sum(f == KEEPALIVE for f in kinds[a:b]) <= 4, kinds[a:b]
    assert _max_silence(timed) < 0.1 + 0.15


async def test_heartbeat_while_queued(server, session):
    srv = await server(
        FakeScript(text=" x", token_delay=0.05), sse_heartbeat=0.1, max_concurrent_requests=1, max_queued_requests=1
    )
    url = srv.url("/v1/chat/completions")
    first = asyncio.ensure_future(_timed_frames(session, url, {"messages": USER_HI, "stream": True, "max_tokens": 10}))
    assert await wait_until(lambda: srv.engine.num_running == 1, 2.0)
    second = await _timed_frames(session, url, {"messages": USER_HI, "stream": True, "max_tokens": 2})
    await first
    kinds = [f for _, f in second]
    # Headers came at once; while the first request held the only slot (~0.5 s),
    # the queued one got keepalive comments, then its own stream.
    assert kinds[0] == KEEPALIVE, kinds
    first_data = next(i for i, f in enumerate(kinds) if f.startswith(b"data: "))
    assert 3 <= first_data <= 6, kinds
    assert second[0][0] < 0.1 + 0.15
    assert sse.verdict(b"\n\n".join(kinds) + b"\n\n") == "done"
    assert srv.state.admission.active == 0 and srv.state.admission.queued == 0


async def test_heartbeat_when_steps_write_nothing(unused_tcp_port):
    """Engine steps arrive but the encoder holds the text back (as a tool-call filter
    may): the deadline is measured from the last write, so heartbeats still go out."""

    class HoldBack(ChatStreamEncoder):
        def step(self, deltas):  # type: ignore[override]
            super().step(deltas)
            return b""

    async def handler(request: web.Request) -> web.StreamResponse:
        out = OutputStream()

        async def produce() -> None:
            for _ in range(12):
                await asyncio.sleep(0.03)
                out.put([Delta(0, "x", 1)])
            out.close()

        producer = asyncio.ensure_future(produce())
        response = web.StreamResponse(headers=SSE_HEADERS)
        await response.prepare(request)
        encoder = HoldBack(response_id="r", created=0, model="m", n=1)
        outcome = await pump_sse(request, response, out, encoder, heartbeat=0.1, stall_timeout=1.0)
        await producer
        request["beats"] = outcome.heartbeats
        await response.write_eof(outcome.tail)  # the usage/[DONE] frames ride with the last chunk
        return response

    app = web.Application()
    app.router.add_post("/s", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", unused_tcp_port).start()
    try:
        import aiohttp

        async with aiohttp.ClientSession() as s:
            async with s.post(f"http://127.0.0.1:{unused_tcp_port}/s") as resp:
                body = await resp.read()
    finally:
        await runner.cleanup()
    fs = sse.frames(body)
    # 12 steps x 30 ms = 0.36 s of steps that write nothing: 3 heartbeats.
    assert 2 <= fs.count(KEEPALIVE) <= 4, fs
    assert fs[-1] == DONE


class IdleProxy:
    """A TCP proxy on 127.0.0.1 that drops a connection after `idle` seconds without
    a byte in either direction, the way nginx's proxy_read_timeout or a cloud
    load balancer's idle timeout does."""

    def __init__(self, target_port: int, idle: float) -> None:
        self.target_port = target_port
        self.idle = idle
        self.dropped = 0
        self._server: asyncio.base_events.Server | None = None

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()

    async def _handle(self, c_reader: asyncio.StreamReader, c_writer: asyncio.StreamWriter) -> None:
        s_reader, s_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        last = [time.monotonic()]

        async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            while data := await reader.read(65536):
                last[0] = time.monotonic()
                writer.write(data)
                await writer.drain()

        tasks = [asyncio.ensure_future(pipe(c_reader, s_writer)), asyncio.ensure_future(pipe(s_reader, c_writer))]
        try:
            while not any(t.done() for t in tasks):
                await asyncio.sleep(0.01)
                if time.monotonic() - last[0] > self.idle:
                    self.dropped += 1
                    break
        finally:
            for t in tasks:
                t.cancel()
            for w in (c_writer, s_writer):
                w.close()


@pytest.mark.parametrize("heartbeat", [0.1, 0.0], ids=["heartbeat", "no-heartbeat"])
async def test_idle_dropping_proxy_keeps_slow_stream_alive(server, session, heartbeat):
    # Long time to first token and long gaps between tokens, both > the proxy's idle limit.
    srv = await server(FakeScript(text=" slow", ttft=0.7, token_delay=0.5), sse_heartbeat=heartbeat)
    proxy = IdleProxy(srv.port, idle=0.3)
    port = await proxy.start()
    try:
        body = b""
        cut = False
        try:
            async with session.post(
                f"http://127.0.0.1:{port}/v1/chat/completions",
                json={"messages": USER_HI, "stream": True, "max_tokens": 3},
                headers={"X-Request-Id": f"proxied-{heartbeat}"},
            ) as resp:
                assert resp.status == 200
                async for chunk in resp.content.iter_any():
                    body += chunk
        except Exception:
            cut = True
        if heartbeat:
            assert not cut and proxy.dropped == 0
            payloads = sse.payloads(body)
            assert [p["choices"][0]["delta"].get("content") for p in payloads[1:4]] == [" slow"] * 3
            assert sse.frames(body).count(KEEPALIVE) >= 10
            assert srv.engine.aborted == []
        else:
            # The control: without heartbeats the proxy cuts the stream mid-way,
            # and the server notices and aborts the engine request.
            assert proxy.dropped == 1
            assert cut or DONE not in body
            assert await wait_until(lambda: "proxied-0.0" in srv.engine.aborted, 2.0)
        assert await wait_until(lambda: srv.engine.num_running == 0, 2.0)
    finally:
        await proxy.close()


async def test_runs_on_uvloop():
    assert type(asyncio.get_running_loop()).__module__.startswith("uvloop")
