"""The gateway's HTTP/1.1 client to its replicas: the connection pool and the one small GET client.

`Upstreams.send` takes an idle keep-alive connection (or opens one within the connect timeout) and
writes the request in the caller's own loop turn; the reply is an `Exchange` (exchange.py: one
connection's protocol and one response's state). A pooled connection closed while idle is
`UpstreamClosed(stale=True)`, safe to resend. Connections are pooled per (URL, tls); a failed TLS
handshake is `UpstreamClosed(tls=True)`. `get` is the one small client for everything else (probes,
boot checks, pods' /metrics): the whole `Reply` within one timeout and `limit` bytes, or `UpstreamClosed`.
"""

from __future__ import annotations

import asyncio
import ssl as ssl_module
from collections import deque
from typing import NamedTuple
from urllib.parse import urlsplit

from streamproxy.gateway.exchange import Connection, Exchange, UpstreamClosed
from streamproxy.gateway.h1 import request_bytes
from streamproxy.gateway.upstream_tls import ClientTLS

IDLE_TIMEOUT = 60.0  # seconds an idle connection is kept (below the 75 s replicas keep theirs)
GET_LIMIT = 1 << 20  # bytes of body `Upstreams.get` takes by default


class Reply(NamedTuple):
    """A whole answer to `Upstreams.get` (headers' names in lower case)."""

    status: int
    headers: dict[str, str]
    body: bytes


class Origin:
    """One replica's address, parsed once: where to connect and what to prefix paths with."""

    __slots__ = ("host", "port", "ssl", "tls", "authority", "base_path", "idle", "keepalive", "loop")

    def __init__(self, url: str, keepalive: int, loop: asyncio.AbstractEventLoop, tls: ClientTLS | None = None) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        self.ssl = parts.scheme == "https"
        self.tls = tls if self.ssl else None  # None on https: the system's trust store
        self.host = parts.hostname
        self.port = parts.port or (443 if self.ssl else 80)
        self.authority = parts.netloc.rpartition("@")[2]
        self.base_path = parts.path.rstrip("/")
        self.idle: deque[Connection] = deque()
        self.keepalive = keepalive
        self.loop = loop  # looked up once: asyncio.get_running_loop() costs a getpid() system call


class Upstreams:
    """The pool of connections to every replica, by base URL."""

    def __init__(self, *, connect_timeout: float, read_timeout: float | None, keepalive: int = 256) -> None:
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.keepalive = keepalive  # idle connections kept per replica (nginx `keepalive`)
        self._origins: dict[tuple[str, ClientTLS | None], Origin] = {}
        self._ssl: ssl_module.SSLContext | None = None

    async def send(self, url: str, path: str, body: bytes, headers: dict[str, str], *, method: str = "POST", fresh: bool = False,
                   tls: ClientTLS | None = None) -> Exchange:
        """Write the request (on a pooled connection: before this returns control to the loop);
        `fresh`: on a new connection, not a pooled one; `tls`: how to reach an https:// URL."""
        key = (url, tls)
        origin = self._origins.get(key)
        if origin is None:
            origin = self._origins[key] = Origin(url, self.keepalive, asyncio.get_running_loop(), tls)
        loop = origin.loop
        conn = None
        now = loop.time()
        while origin.idle and not fresh:
            candidate = origin.idle.popleft()  # the longest idle: the replica is surely done with its last request
            if not candidate.closed and now - candidate.idle_since < IDLE_TIMEOUT:
                conn = candidate
                break
            candidate.close()
        reused = conn is not None
        if conn is None:
            conn = await self._connect(origin, loop)
        target = origin.base_path + path
        return conn.start(request_bytes(method, target, origin.authority, headers, body), self.read_timeout, reused, method == "HEAD")

    async def get(self, url: str, path: str, *, timeout: float, headers: dict[str, str] | None = None,
                  tls: ClientTLS | None = None, limit: int = GET_LIMIT) -> Reply:
        """`GET url+path`, the whole answer within `timeout` s; raises UpstreamClosed, for any failure."""
        try:
            async with asyncio.timeout(timeout):
                for fresh in (False, True):
                    exchange = await self.send(url, path, b"", headers or {}, method="GET", fresh=fresh, tls=tls)
                    try:
                        return await _collect(exchange, limit)
                    except UpstreamClosed as exc:
                        if not exc.stale or fresh:
                            raise
                    finally:
                        exchange.finish(reuse=True)  # kept only when the answer is complete and all is well
        except TimeoutError:
            raise UpstreamClosed(f"no answer from {url}{path} within {timeout:g} s") from None
        except UpstreamClosed:
            raise
        except OSError as exc:  # no connection (refused, unreachable, no such host)
            raise UpstreamClosed(f"no connection to {url}: {exc}") from None
        raise AssertionError("unreachable")

    async def _connect(self, origin: Origin, loop: asyncio.AbstractEventLoop) -> Connection:
        ssl: ssl_module.SSLContext | None = None
        server_hostname: str | None = None
        if origin.tls is not None:
            ssl = origin.tls.context
            server_hostname = origin.tls.server_name or origin.host
        elif origin.ssl:
            if self._ssl is None:
                self._ssl = ssl_module.create_default_context()
            ssl = self._ssl
            server_hostname = origin.host
        try:
            async with asyncio.timeout(self.connect_timeout or None):
                _, conn = await loop.create_connection(
                    lambda: Connection(origin), origin.host, origin.port, ssl=ssl, server_hostname=server_hostname
                )
        except TimeoutError:
            raise UpstreamClosed(f"no connection to {origin.authority} within {self.connect_timeout:g} s") from None
        except ssl_module.SSLError as exc:
            reason = getattr(exc, "verify_message", None) or exc.reason or str(exc)
            if exc.reason == "WRONG_VERSION_NUMBER":  # what OpenSSL makes of an HTTP answer
                reason += ", the replica may be serving plain HTTP"
            reason = f"{reason} ({type(exc).__name__})"
            raise UpstreamClosed(f"TLS handshake with {origin.authority} failed: {reason}", tls=True, reason=reason) from None
        return conn

    def close(self) -> None:
        """Close every idle connection (those in use end with their exchanges)."""
        for origin in self._origins.values():
            while origin.idle:
                origin.idle.pop().close()


async def _collect(exchange: Exchange, limit: int) -> Reply:
    """The answer's head and body, refusing a body over `limit` bytes (before reading it when Content-Length says so)."""
    await exchange.head()
    length = exchange.headers.get("content-length", "")
    if length.isdigit() and int(length) > limit:
        raise UpstreamClosed(f"the replica's answer is {length} bytes, over the {limit} taken")
    parts: list[bytes] = []
    size = 0

    def sink(data: bytes) -> bool:
        nonlocal size
        size += len(data)
        parts.append(data)
        return size <= limit  # over: reading pauses, and the exchange is given up

    exchange.stream(sink)
    while not exchange.complete and size <= limit:
        await exchange.wait()
    if size > limit:
        raise UpstreamClosed(f"the replica's answer is over the {limit} bytes taken")
    return Reply(exchange.status, exchange.headers, b"".join(parts))
