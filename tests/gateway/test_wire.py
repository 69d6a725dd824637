"""The gateway's connections to replicas (`gateway/wire.py`) against scripted raw-TCP replicas:
keep-alive reuse, a pooled connection the replica closed, the read timeout, pausing on a slow
client, and closing a response early (how a replica learns to abort)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from streamproxy.gateway.exchange import Connection, UpstreamClosed
from streamproxy.gateway.upstream import ask
from streamproxy.gateway.wire import Origin, Upstreams

OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
HEAD = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"


class Replica:
    """A raw-TCP replica: `script(n, reader, writer)` answers request n (0-based) on a connection."""

    def __init__(self, script) -> None:
        self.script = script
        self.connections = 0
        self.requests: list[bytes] = []
        self.closed = asyncio.Event()

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            n = 0
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                self.requests.append(head + await reader.readexactly(length))
                if not await self.script(n, reader, writer):
                    break
                n += 1
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self.closed.set()
            writer.close()

    async def stop(self) -> None:
        self.server.close()


@pytest.fixture
async def replica():
    made: list[Replica] = []

    async def start(script):
        r = Replica(script)
        made.append(r)
        return r, await r.start()

    yield start
    for r in made:
        await r.stop()


async def send(upstreams: Upstreams, url: str, body: bytes = b"{}"):
    return await ask(upstreams, url, "/v1/chat/completions", body, {"Content-Type": "application/json"})


async def test_a_finished_response_leaves_its_connection_for_the_next_request(replica):
    async def answer(n, reader, writer):
        writer.write(OK)
        return True

    r, url = await replica(answer)
    upstreams = Upstreams(connect_timeout=5, read_timeout=5)
    for _ in range(3):
        exchange = await send(upstreams, url)
        assert (exchange.status, await exchange.read()) == (200, b"ok")
        exchange.finish(reuse=True)
    assert r.connections == 1 and len(r.requests) == 3
    assert r.requests[0].startswith(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:") and r.requests[0].endswith(b"\r\n\r\n{}")
    upstreams.close()


async def test_a_pooled_connection_the_replica_dropped_is_resent_on_a_new_one(replica):
    async def answer_once(n, reader, writer):
        if n == 0:
            writer.write(OK)  # keep-alive, as far as the client knows...
            return True
        return False  # ...but the next request on it finds the connection closed, unanswered

    r, url = await replica(answer_once)
    upstreams = Upstreams(connect_timeout=5, read_timeout=5)
    first = await send(upstreams, url)
    await first.read()
    first.finish(reuse=True)
    second = await send(upstreams, url)
    assert (second.status, await second.read()) == (200, b"ok")
    assert r.connections == 2 and len(r.requests) == 3  # sent, dropped unanswered, sent again
    second.finish(reuse=True)
    upstreams.close()


async def test_a_new_connection_that_breaks_is_not_resent(replica):
    async def hang_up(n, reader, writer):
        return False

    r, url = await replica(hang_up)
    upstreams = Upstreams(connect_timeout=5, read_timeout=5)
    with pytest.raises(UpstreamClosed, match="closed the connection") as caught:
        await send(upstreams, url)
    assert not caught.value.stale and len(r.requests) == 1


async def test_a_replica_silent_past_the_read_timeout_breaks_the_stream(replica):
    async def head_then_silence(n, reader, writer):
        writer.write(HEAD + b"7\r\ndata: 1\r\n")
        await reader.read()  # silent until the gateway closes
        return False

    r, url = await replica(head_then_silence)
    upstreams = Upstreams(connect_timeout=5, read_timeout=0.2)
    exchange = await send(upstreams, url)
    pieces: list[bytes] = []
    exchange.stream(collect(pieces, True))
    with pytest.raises(UpstreamClosed, match="sent nothing for 0.2 s"):
        await exchange.wait()
    assert pieces == [b"data: 1"]
    await asyncio.wait_for(r.closed.wait(), 2)  # and the connection is closed: the replica aborts


async def test_a_sink_that_cannot_take_more_pauses_reading_until_resumed(replica):
    events = [b"data: %d\n\n" % i for i in range(5)]

    async def stream(n, reader, writer):
        writer.write(HEAD)
        for event in events:
            writer.write(b"%x\r\n%s\r\n" % (len(event), event))
            await writer.drain()
            await asyncio.sleep(0.01)
        writer.write(b"0\r\n\r\n")
        return True

    r, url = await replica(stream)
    upstreams = Upstreams(connect_timeout=5, read_timeout=5)
    exchange = await send(upstreams, url)
    got: list[bytes] = []
    exchange.stream(collect(got, False))  # never keeps up: every piece pauses
    rounds = 0
    while True:
        await exchange.wait()
        rounds += 1
        if exchange.complete:
            break
        assert exchange.paused
        exchange.resume()
    assert b"".join(got) == b"".join(events) and rounds >= 2
    exchange.finish(reuse=True)
    assert r.connections == 1
    upstreams.close()


async def test_finishing_an_unfinished_response_closes_the_connection(replica):
    async def endless(n, reader, writer):
        writer.write(HEAD + b"7\r\ndata: 1\r\n")
        await reader.read()  # until the gateway closes
        return False

    r, url = await replica(endless)
    upstreams = Upstreams(connect_timeout=5, read_timeout=5)
    exchange = await send(upstreams, url)
    exchange.finish(reuse=True)  # not complete: never pooled
    await asyncio.wait_for(r.closed.wait(), 2)
    assert r.connections == 1


async def test_a_broken_chunked_stream_is_an_error_not_an_end(replica):
    async def cut(n, reader, writer):
        writer.write(HEAD + b"7\r\ndata: 1\r\n")
        return False

    r, url = await replica(cut)
    upstreams = Upstreams(connect_timeout=5, read_timeout=5)
    exchange = await send(upstreams, url)
    got: list[bytes] = []
    exchange.stream(collect(got, True))
    with pytest.raises(UpstreamClosed, match="before the end of its response"):
        await exchange.wait()
    assert got == [b"data: 1"] and not exchange.complete


async def test_connect_refused_is_a_connection_error():
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()
    with pytest.raises(OSError):
        await send(Upstreams(connect_timeout=5, read_timeout=5), f"http://127.0.0.1:{port}")


async def test_at_most_keepalive_idle_connections_are_kept_per_replica(replica):
    async def answer(n, reader, writer):
        writer.write(OK)
        return True

    r, url = await replica(answer)
    upstreams = Upstreams(connect_timeout=5, read_timeout=5, keepalive=1)
    first, second = await send(upstreams, url), await send(upstreams, url)  # at once: two connections
    for exchange in (first, second):
        await exchange.read()
        exchange.finish(reuse=True)
    assert r.connections == 2
    await asyncio.wait_for(r.closed.wait(), 2)  # the second one over the cap is closed
    third = await send(upstreams, url)
    await third.read()
    third.finish(reuse=True)
    assert r.connections == 2  # the first, kept, carried the third request
    upstreams.close()


async def test_a_connection_closed_before_its_request_fails_the_request_at_once():
    """A replica over its connection cap accepts and closes at once; when the close lands between
    the connect and the request, nothing will ever come back: the exchange fails now, not after
    the read timeout."""
    conn = Connection(Origin("http://127.0.0.1:9", keepalive=1, loop=asyncio.get_running_loop()))
    conn.connection_made(_ClosedTransport())
    conn.connection_lost(None)
    exchange = conn.start(b"POST / HTTP/1.1\r\n\r\n", read_timeout=30, reused=False, head_only=False)
    with pytest.raises(UpstreamClosed, match="closed the connection"):
        await asyncio.wait_for(exchange.head(), 1)


def collect(into: list[bytes], keep_up: bool) -> Callable[[bytes], bool]:
    """A stream sink that keeps every piece and answers `keep_up`."""

    def sink(data: bytes) -> bool:
        into.append(data)
        return keep_up

    return sink


class _ClosedTransport(asyncio.Transport):
    def is_closing(self) -> bool:
        return True

    def write(self, data: bytes | bytearray | memoryview) -> None:
        raise AssertionError("nothing is written on a closed connection")

    def close(self) -> None:
        pass
