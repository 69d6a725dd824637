"""SSE heartbeats: while queued, during a long time to first token, in mid-stream gaps,
in push mode, in each API's own shape (a `: keepalive` comment; `event: ping`
on /v1/messages), and a proxy that drops idle connections keeps a slow stream
alive only thanks to them.

This file is the one home of the SSE keepalive; the non-stream keepalive
(newlines before the JSON) is in test_nonstream.py, and what clients make of
both is in tests/compat/test_keepalive.py."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from aiohttp import web

from engine_adapter.base import Delta, DeltaQueue
from engine_adapter.fake import FakeScript
from streamproxy.core.stream import ChatStreamEncoder
from streamproxy.http.body import SSE_HEADERS, StreamBody
from streamproxy.http.writer import pump_sse
from tests.support import USER_HI, sse, wait_until
from tests.support.api_events import check_anthropic
from tests.support.sse import DONE_FRAME as DONE
from tests.support.sse import KEEPALIVE_FRAME as KEEPALIVE
from tests.support.sse import named_events

# Timing: each test makes the engine silent for much longer than the heartbeat
# and the bounds it checks, so a busy machine (timers late by a few hundred ms)
# does not fail it: counts have a low floor and a high ceiling (heartbeats
# never come faster than their interval; a spam bug would blow the ceiling),
# and silences are bounded well below the engine's own silence.


async def _timed_frames(session, url: str, body: dict) -> tuple[list[tuple[float, bytes]], float]:
    """Each SSE frame with the time it arrived (loop seconds; the framing checked), and when the request was sent."""
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    chunks: list[tuple[float, bytes]] = []
    async with session.post(url, json=body) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"] == "text/event-stream"
        async for chunk in resp.content.iter_any():
            chunks.append((loop.time(), chunk))
    return [(t, frame) for t, frame in sse.arrivals(chunks)], t0


def _max_silence(timed: list[tuple[float, bytes]], t0: float) -> float:
    times = [t0] + [t for t, _ in timed]
    return max(b - a for a, b in zip(times, times[1:]))


async def test_heartbeat_during_long_time_to_first_token(server, session):
    srv = await server(FakeScript(tokens=["a", "b"], ttft=1.0), sse_heartbeat=0.1)
    timed, t0 = await _timed_frames(session, srv.url("/v1/chat/completions"), {"messages": USER_HI, "stream": True})
    kinds = [f for _, f in timed]
    first_content = next(i for i, f in enumerate(kinds) if b'"content":"a"' in f)
    beats_before = [f for f in kinds[:first_content] if f == KEEPALIVE]
    assert 3 <= len(beats_before) <= 30, kinds  # about 9
    assert kinds[-1] == DONE
    # Never silent for much longer than the heartbeat, from the headers on (without
    # heartbeats the silence would be the whole 1 s time to first token).
    assert _max_silence(timed, t0) < 0.5, timed


async def test_heartbeat_in_mid_stream_gaps(server, session):
    srv = await server(FakeScript(text=" slow", token_delay=0.8), sse_heartbeat=0.1)
    timed, t0 = await _timed_frames(
        session, srv.url("/v1/chat/completions"), {"messages": USER_HI, "stream": True, "max_tokens": 3}
    )
    kinds = [f for _, f in timed]
    contents = [i for i, f in enumerate(kinds) if b'"content":" slow"' in f]
    assert len(contents) == 3
    # Between consecutive tokens (0.8 s apart) there are heartbeats (about 7).
    for a, b in zip(contents, contents[1:]):
        assert 2 <= sum(f == KEEPALIVE for f in kinds[a:b]) <= 25, kinds[a:b]
    assert _max_silence(timed, t0) < 0.4


async def test_heartbeat_during_long_time_to_first_token_of_a_batch(server, session):
    # A batched completions request (one engine request per prompt, merged): the same keepalives.
    srv = await server(FakeScript(tokens=["a", "b"], ttft=1.0), sse_heartbeat=0.1)
    timed, t0 = await _timed_frames(session, srv.url("/v1/completions"), {"prompt": ["x", "y", "z"], "stream": True})
    kinds = [f for _, f in timed]
    first_text = next(i for i, f in enumerate(kinds) if b'"text":"a"' in f)
    assert 3 <= sum(f == KEEPALIVE for f in kinds[:first_text]) <= 30, kinds  # about 9
    assert sorted(json.loads(f[6:])["choices"][0]["index"] for f in kinds if b'"finish_reason":"stop"' in f) == [0, 1, 2]
    assert kinds[-1] == DONE
    assert _max_silence(timed, t0) < 0.5, timed


async def test_heartbeat_while_queued(server, session):
    srv = await server(
        FakeScript(text=" x", token_delay=0.05), sse_heartbeat=0.1, max_concurrent_requests=1, max_queued_requests=1
    )
    url = srv.url("/v1/chat/completions")
    first = asyncio.ensure_future(_timed_frames(session, url, {"messages": USER_HI, "stream": True, "max_tokens": 20}))
    assert await wait_until(lambda: srv.engine.num_running == 1, 5.0)
    second, _ = await _timed_frames(session, url, {"messages": USER_HI, "stream": True, "max_tokens": 2})
    held, _ = await first
    kinds = [f for _, f in second]
    # Headers came at once: while the first request held the only slot (~1 s), the
    # queued one got keepalive comments, then its own stream.
    assert kinds[0] == KEEPALIVE, kinds
    assert second[0][0] < held[-1][0]  # the first keepalive came while the slot was still held
    first_data = next(i for i, f in enumerate(kinds) if f.startswith(b"data: "))
    assert 2 <= first_data <= 30, kinds  # about 9
    assert sse.verdict(b"\n\n".join(kinds) + b"\n\n") == "done"
    assert srv.state.admission.active == 0 and srv.state.admission.queued == 0


async def test_heartbeat_comment_while_waiting_for_first_token(server, session):
    srv = await server(FakeScript(tokens=["a"], ttft=0.8), sse_heartbeat=0.1)
    async with session.post(srv.url("/v1/chat/completions"), json={"messages": USER_HI, "stream": True}) as resp:
        raw = await resp.read()
    frames = sse.frames(raw)
    keepalives = [f for f in frames if f.startswith(b":")]
    assert 2 <= len(keepalives) <= 25, frames  # about 7
    assert set(keepalives) == {b": keepalive"}
    # Keepalives come after the role chunk and before any content.
    first_content = next(i for i, f in enumerate(frames) if b'"content":"a"' in f)
    assert all(i < first_content for i, f in enumerate(frames) if f.startswith(b":"))
    assert json.loads(frames[0][6:])["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert frames[-1] == b"data: [DONE]"


async def test_queued_stream_gets_the_encoders_keepalive(server, session):
    """A stream waiting for an admission slot is kept alive with its encoder's keepalive
    (`event: ping` on /v1/messages, an SSE comment elsewhere), as it is once generating."""
    srv = await server(
        FakeScript(text=" x", token_delay=0.05), sse_heartbeat=0.05, max_concurrent_requests=1, max_queued_requests=2
    )
    busy = asyncio.ensure_future(session.post(srv.url("/v1/chat/completions"), json={"messages": USER_HI, "max_tokens": 8}))
    assert await wait_until(lambda: srv.engine.num_running == 1, 5.0)  # it holds the only slot for ~0.4 s
    queued_anthropic = session.post(srv.url("/v1/messages"), json={"max_tokens": 2, "messages": USER_HI, "stream": True})
    queued_chat = session.post(srv.url("/v1/chat/completions"), json={"messages": USER_HI, "max_tokens": 2, "stream": True})
    first, a, c = await asyncio.gather(busy, queued_anthropic, queued_chat)
    assert first.status == 200 and (await first.json())["choices"][0]["finish_reason"] == "length"
    body = await a.read()
    events = named_events(body)
    check_anthropic(events)
    assert events[0][0] == "ping", [e for e, _ in events][:4]  # while queued: before message_start
    assert b": keepalive" not in body
    chat_body = await c.read()
    assert chat_body.startswith(b": keepalive\n\n") and b"event: ping" not in chat_body


async def test_ping_keeps_a_slow_anthropic_stream_alive(server, session):
    srv = await server(FakeScript(tokens=["late"], ttft=0.8), sse_heartbeat=0.1)
    async with session.post(srv.url("/v1/messages"), json={"max_tokens": 5, "messages": USER_HI, "stream": True}) as resp:
        body = await resp.read()
    events = named_events(body)
    check_anthropic(events)
    assert [e for e, _ in events].count("ping") >= 2
    assert b"\n: keepalive" not in body and not body.startswith(b":")


async def test_idle_pushed_stream_gets_heartbeats_and_a_busy_one_does_not(server, session, pushes):
    srv = await server(FakeScript(text=" w", ttft=1.2, token_delay=0.01), sse_heartbeat=0.3)
    async with session.post(srv.url("/v1/chat/completions"), json={"messages": USER_HI, "stream": True, "max_tokens": 15}) as resp:
        body = await resp.read()
    frames = sse.frames(body)
    first_text = next(i for i, f in enumerate(frames) if b'"content":" w"' in f)
    beats_before = sum(f == b": keepalive" for f in frames[:first_text])
    assert 1 <= beats_before <= 10, frames[:first_text]  # about 3
    # Tokens every 10 ms keep the stream busy: no keepalive (0.3 s) once they flow.
    assert b": keepalive" not in b"\n\n".join(frames[first_text:])
    assert sum(took for _, took in pushes) >= 15


async def test_idle_pushed_anthropic_stream_gets_ping_events(server, session, pushes):
    srv = await server(FakeScript(text=" w", ttft=0.8, token_delay=0.01), sse_heartbeat=0.1)
    async with session.post(srv.url("/v1/messages"), json={"model": "fake", "max_tokens": 5, "stream": True, "messages": USER_HI}) as resp:
        body = await resp.read()
    assert body.count(b"event: ping\n") >= 2
    assert b": keepalive" not in body
    assert body.rstrip().endswith(b'{"type":"message_stop"}')
    assert sum(took for _, took in pushes) >= 5


async def test_heartbeat_when_steps_write_nothing(unused_tcp_port):
    """Engine steps arrive but the encoder holds the text back (as a tool-call filter
    may): the deadline is measured from the last write, so heartbeats still go out."""

    class HoldBack(ChatStreamEncoder):
        def step(self, deltas):
            super().step(deltas)
            return b""

    async def handler(request: web.Request) -> web.StreamResponse:
        out = DeltaQueue()

        async def produce() -> None:
            for _ in range(25):
                await asyncio.sleep(0.04)
                out.put([Delta(0, "x", 1)])
            out.close()

        producer = asyncio.ensure_future(produce())
        response = web.StreamResponse(headers=SSE_HEADERS)
        await response.prepare(request)
        encoder = HoldBack(response_id="r", created=0, model="m", n=1)
        body = StreamBody(request, response, encoder, heartbeat=0.1, stall=1.0)
        await body.open()
        outcome = await pump_sse(body, out)
        await producer
        await body.finish(outcome.tail)  # the usage/[DONE] frames ride with the last chunk
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
    # 25 steps x 40 ms = 1 s of steps that write nothing: about 9 heartbeats (none if
    # the deadline were measured from the last step).
    assert 2 <= fs.count(KEEPALIVE) <= 12, fs
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


@pytest.mark.parametrize("heartbeat", [0.06, 0.0], ids=["heartbeat", "no-heartbeat"])
async def test_idle_dropping_proxy_keeps_slow_stream_alive(server, session, heartbeat):
    # Long time to first token and long gaps between tokens, both > the proxy's idle limit,
    # which is 10 heartbeats long.
    srv = await server(FakeScript(text=" slow", ttft=0.8, token_delay=0.7), sse_heartbeat=heartbeat)
    proxy = IdleProxy(srv.port, idle=0.6)
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
            assert await wait_until(lambda: "proxied-0.0" in srv.engine.aborted, 5.0)
        assert await wait_until(lambda: srv.engine.num_running == 0, 5.0)
    finally:
        await proxy.close()


async def test_runs_on_uvloop():
    assert type(asyncio.get_running_loop()).__module__.startswith("uvloop")
