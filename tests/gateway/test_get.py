"""`Upstreams.get` (gateway/wire.py), the gateway's client for everything but relayed requests
(probes, managed replicas' boot checks, pods' /metrics), against raw-TCP stub replicas: a whole
answer, an error status, and every failure as `UpstreamClosed` (never another exception)."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from streamproxy.gateway.exchange import UpstreamClosed
from streamproxy.gateway.upstream_tls import ClientTLS
from streamproxy.gateway.wire import Reply, Upstreams
from tests.gateway.conftest import Stub, StubHandler, refused_url
from tests.support.tls import make_certs

StartStub = Callable[..., Awaitable[Stub]]


def answer(raw: bytes) -> StubHandler:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(raw)
        await writer.drain()

    return handler


async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await reader.read()  # until the gateway gives up and closes


@pytest.fixture
async def upstreams():
    u = Upstreams(connect_timeout=5, read_timeout=None)
    yield u
    u.close()


async def test_a_200_with_its_body_and_the_request_sent(stub: StartStub, upstreams: Upstreams) -> None:
    s = await stub(answer(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 5\r\n\r\nhello"))
    reply = await upstreams.get(s.base, "/metrics", timeout=5, headers={"Authorization": "Bearer sk-r"})
    assert reply == Reply(200, {"content-type": "text/plain", "content-length": "5"}, b"hello")
    host = s.base.removeprefix("http://")
    assert s.requests == [("GET /metrics HTTP/1.1", {"host": host, "content-length": "0", "authorization": "Bearer sk-r"}, b"")]


async def test_a_chunked_body_is_whole(stub: StartStub, upstreams: Upstreams) -> None:
    s = await stub(answer(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"))
    assert (await upstreams.get(s.base, "/metrics", timeout=5)).body == b"abcde"


async def test_a_503_is_an_answer(stub: StartStub, upstreams: Upstreams) -> None:
    s = await stub(answer(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 4\r\nRetry-After: 2\r\n\r\nbusy"))
    reply = await upstreams.get(s.base, "/metrics", timeout=5)
    assert (reply.status, reply.headers["retry-after"], reply.body) == (503, "2", b"busy")


async def test_a_kept_alive_answer_leaves_its_connection_for_the_next(upstreams: Upstreams) -> None:
    connections = 0

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        while await reader.readuntil(b"\r\n\r\n"):
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    try:
        assert [(await upstreams.get(url, "/health", timeout=5)).body for _ in range(3)] == [b"ok"] * 3
        assert connections == 1
    finally:
        upstreams.close()
        server.close()


async def test_no_answer_within_the_timeout(stub: StartStub, upstreams: Upstreams) -> None:
    s = await stub(silent)
    with pytest.raises(UpstreamClosed) as caught:
        await upstreams.get(s.base, "/metrics", timeout=0.2)
    assert str(caught.value) == f"no answer from {s.base}/metrics within 0.2 s"


async def test_half_a_head_then_silence_is_the_timeout_too(stub: StartStub, upstreams: Upstreams) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Le")
        await reader.read()

    s = await stub(handler)
    with pytest.raises(UpstreamClosed, match="^no answer from .* within 0.2 s$"):
        await upstreams.get(s.base, "/metrics", timeout=0.2)


@pytest.mark.parametrize(
    "raw, why",
    [
        (b"SSH-2.0-OpenSSH_9.6\r\n\r\n", "not an HTTP/1.x status line: 'SSH-2.0-OpenSSH_9.6'"),
        (b"HTTP/1.1 2x0 OK\r\nContent-Length: 0\r\n\r\n", "not an HTTP/1.x status line: 'HTTP/1.1 2x0 OK'"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 1_0\r\n\r\n", "bad Content-Length: '1_0'"),
    ],
)
async def test_a_malformed_answer(stub: StartStub, upstreams: Upstreams, raw: bytes, why: str) -> None:
    s = await stub(answer(raw))
    with pytest.raises(UpstreamClosed) as caught:
        await upstreams.get(s.base, "/metrics", timeout=5)
    assert str(caught.value) == f"the replica's response is not valid HTTP/1.1 ({why})"


async def test_a_connection_closed_before_the_end(stub: StartStub, upstreams: Upstreams) -> None:
    s = await stub(answer(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc"))
    with pytest.raises(UpstreamClosed, match="^the replica closed the connection before the end of its response"):
        await upstreams.get(s.base, "/metrics", timeout=5)


async def test_a_connection_closed_without_a_word(stub: StartStub, upstreams: Upstreams) -> None:
    s = await stub(answer(b""))
    with pytest.raises(UpstreamClosed, match="^the replica closed the connection before the end of its response"):
        await upstreams.get(s.base, "/metrics", timeout=5)


async def test_a_refused_connection(upstreams: Upstreams) -> None:
    url = refused_url()
    with pytest.raises(UpstreamClosed) as caught:
        await upstreams.get(url, "/health", timeout=5)
    assert str(caught.value).startswith(f"no connection to {url}: ")


async def test_a_body_over_the_limit_by_its_content_length(stub: StartStub, upstreams: Upstreams) -> None:
    s = await stub(answer(b"HTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\n"))  # refused before a byte of body
    with pytest.raises(UpstreamClosed) as caught:
        await upstreams.get(s.base, "/metrics", timeout=5, limit=10)
    assert str(caught.value) == "the replica's answer is 11 bytes, over the 10 taken"


async def test_a_chunked_body_over_the_limit(stub: StartStub, upstreams: Upstreams) -> None:
    chunk = b"400\r\n" + b"x" * 1024 + b"\r\n"

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        try:
            while True:  # endless: the gateway must stop reading and close
                writer.write(chunk)
                await writer.drain()
        except ConnectionError:
            pass

    s = await stub(handler)
    with pytest.raises(UpstreamClosed) as caught:
        await upstreams.get(s.base, "/metrics", timeout=5, limit=4096)
    assert str(caught.value) == "the replica's answer is over the 4096 bytes taken"
    # At the limit exactly, it is taken.
    exact = await stub(answer(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n0123456789"))
    assert (await upstreams.get(exact.base, "/metrics", timeout=5, limit=10)).body == b"0123456789"


def _server_context(tmp_path: Path) -> tuple[ssl.SSLContext, Path]:
    certs = make_certs(tmp_path)
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(certs.cert, certs.key)
    return server, certs.ca


async def test_over_https_with_the_deployments_ca(stub: StartStub, upstreams: Upstreams, tmp_path: Path) -> None:
    server, ca = _server_context(tmp_path)
    s = await stub(answer(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"), ssl=server)
    assert s.base.startswith("https://127.0.0.1:")
    tls = ClientTLS(ssl.create_default_context(cafile=str(ca)), None)
    reply = await upstreams.get(s.base, "/metrics", timeout=5, tls=tls)
    assert (reply.status, reply.body) == (200, b"ok")


async def test_over_https_an_untrusted_certificate_is_a_tls_failure(stub: StartStub, upstreams: Upstreams, tmp_path: Path) -> None:
    server, _ = _server_context(tmp_path)
    s = await stub(answer(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"), ssl=server)
    with pytest.raises(UpstreamClosed) as caught:  # the system's trust store: the test CA is not in it
        await upstreams.get(s.base, "/metrics", timeout=5)
    assert caught.value.tls
    assert caught.value.reason == "unable to get local issuer certificate (SSLCertVerificationError)"
    assert str(caught.value) == f"TLS handshake with {s.base.removeprefix('https://')} failed: {caught.value.reason}"
