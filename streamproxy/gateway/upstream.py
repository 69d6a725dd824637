"""Asking a replica: its answer's head (`ask`), and its own error answers (`UpstreamError`).

`ask` sends on a pooled connection and waits for the head, once more on a new connection when the
pooled one was closed while idle; failover between replicas is call.py's. `UpstreamError` carries a
replica's own error answer (status, body, Retry-After) to the client unchanged.
"""

from __future__ import annotations

import asyncio

from streamproxy.errors import APIError
from streamproxy.gateway.exchange import Exchange, UpstreamClosed
from streamproxy.gateway.upstream_tls import ClientTLS
from streamproxy.gateway.wire import Upstreams

CONNECT_ERRORS = (UpstreamClosed, OSError, asyncio.TimeoutError)


class UpstreamError(APIError):
    """A replica's error answer, relayed as it is."""

    def __init__(self, status: int, body: bytes, retry_after: str | None) -> None:
        super().__init__(f"the replica answered {status}", status=status)
        self.raw = body
        self.retry_after_header = retry_after
        self.code = "upstream_error"

    def to_json(self) -> bytes:
        return self.raw

    def headers(self) -> dict[str, str]:
        return {"Retry-After": self.retry_after_header} if self.retry_after_header else {}


async def ask(upstreams: Upstreams, url: str, path: str, body: bytes, headers: dict[str, str], tls: ClientTLS | None = None) -> Exchange:
    """Send, and wait for the response head; once more on a new connection when a pooled one
    turns out to have been closed by the replica while idle (nothing of the request was read)."""
    for fresh in (False, True):
        exchange = await upstreams.send(url, path, body, headers, fresh=fresh, tls=tls)
        try:
            await exchange.head()
            return exchange
        except UpstreamClosed as exc:
            exchange.finish(reuse=False)
            if not exc.stale or fresh:
                raise
        except BaseException:
            exchange.finish(reuse=False)  # cancelled (the client left): the replica sees the close
            raise
    raise AssertionError("unreachable")


async def read_error(exchange: Exchange) -> bytes:
    """A retried answer's body, read to its end (the connection goes back to the pool)."""
    try:
        return await exchange.read()
    except CONNECT_ERRORS:
        return b""
    finally:
        exchange.finish(reuse=True)
