"""One client connection's phases and its one timer: nginx's client timeouts, as `Clock`.

A connection is in one phase at a time:
  fresh/header  nothing, or part of the headers in: `client_header_timeout` from the accept (or the first
                byte on a kept-alive connection), then a close, or a 408 (`body.answer_unread`) once a
                byte is in. aiohttp's keep-alive timer is stopped meanwhile (`keep_alive(True)`).
  body          `client_body_timeout` between two socket reads (a read only stores the time; the timer
                re-arms itself, and waits while the transport is paused); firing makes the body read
                raise `RequestTimeout`: a 408 from the route, or only a close once a response byte is out.
  busy / linger no timer of ours; idle: aiohttp's `keepalive_timeout`, its close counted here.
A timer acts one loop turn later (`call_soon`) and is void if re-armed meanwhile (`_epoch`). The
connection (connection.py's `Protocol`) tells the clock what happened; the clock never reads a socket.
"""

from __future__ import annotations

import asyncio
import logging
import resource
from dataclasses import dataclass
from typing import TYPE_CHECKING

from aiohttp.abc import AbstractStreamWriter
from aiohttp.streams import StreamReader

from streamproxy.config import Settings
from streamproxy.errors import RequestTimeout
from streamproxy.http import accesslog
from streamproxy.http.body import answer_unread
from streamproxy.http.metrics import CLOSED_BODY_TIMEOUT, CLOSED_HEADER_TIMEOUT, CLOSED_KEEPALIVE_TIMEOUT, RESPONSES

if TYPE_CHECKING:
    from streamproxy.http.connection import Protocol

log = logging.getLogger("streamproxy.server")  # the connection's own logger

# Phases of a connection (CLOSING: a 408 is out, nothing more is read; GONE: closed, or refused).
FRESH, HEADER, BODY, BUSY, LINGER, IDLE, CLOSING, GONE = range(8)


@dataclass(frozen=True, slots=True)
class Limits:
    header_timeout: float  # seconds; 0: none
    body_timeout: float  # seconds between two reads; 0: none
    keepalive_timeout: float  # seconds idle; 0: no keep-alive
    max_connections: int  # 0: no cap

    @classmethod
    def from_settings(cls, settings: Settings) -> Limits:
        cap = settings.max_connections
        return cls(
            header_timeout=settings.client_header_timeout,
            body_timeout=settings.client_body_timeout,
            keepalive_timeout=settings.keepalive_timeout,
            max_connections=default_max_connections() if cap is None else cap,
        )


def default_max_connections() -> int:
    """Half the file descriptors this process may open (the soft RLIMIT_NOFILE)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        soft = 1 << 20
    return max(soft // 2, 1)


class Clock:
    """One connection's phase and its one timer (see the module's docstring)."""

    __slots__ = ("_protocol", "_limits", "_loop", "_phase", "_timer", "_epoch", "_body", "_writer", "_last_read", "_idle_until")

    def __init__(self, protocol: Protocol, limits: Limits, loop: asyncio.AbstractEventLoop) -> None:
        self._protocol: Protocol | None = protocol
        self._limits = limits
        self._loop = loop
        self._phase = FRESH
        self._timer: asyncio.TimerHandle | None = None
        self._epoch = 0  # bumped by every arm and disarm: a due expiry of an older one does nothing
        self._body: StreamReader | None = None
        self._writer: AbstractStreamWriter | None = None
        self._last_read = 0.0
        self._idle_until = 0.0  # idle from the last response: aiohttp closes it at this time

    # -- what the connection tells it -------------------------------------------------

    def made(self) -> None:
        self._arm(self._limits.header_timeout)

    def refused(self) -> None:
        self._phase = GONE
        self._protocol = None

    def gone(self) -> bool:
        return self._phase == GONE

    def receiving(self, data: bytes) -> bool:
        """Bytes from the socket, before aiohttp parses them; False: drop them."""
        phase = self._phase
        if phase >= CLOSING:
            return False
        if data and (phase == FRESH or phase == IDLE):  # the first bytes of a request
            if phase == IDLE:
                protocol = self._protocol
                if protocol is not None:
                    protocol.keep_alive(True)  # aiohttp's idle timer stops: the header timeout now
                self._arm(self._limits.header_timeout)  # a kept-alive connection: from the first byte
            self._phase = HEADER
        return True

    def received(self) -> None:
        """aiohttp has taken the bytes: a body read, or the end of a body nobody read."""
        phase = self._phase
        if phase == BODY:
            body = self._body
            if body is None or body.is_eof():
                self._phase = BUSY
                self._body = self._writer = None
                self._disarm()
            else:
                self._last_read = self._loop.time()
        elif phase == LINGER:
            body = self._body
            if body is None or body.is_eof():
                self._idle()

    def started(self, body: StreamReader, writer: AbstractStreamWriter) -> None:
        """A request's headers are in and its handler starts."""
        if self._phase >= CLOSING:
            return
        timeout = self._limits.body_timeout
        if timeout > 0 and not body.is_eof():
            self._phase = BODY
            self._body, self._writer = body, writer
            self._last_read = self._loop.time()
            self._arm(timeout)
        else:
            self._phase = BUSY
            self._disarm()

    def keeps_alive(self) -> bool:
        """The response may keep the connection (not after a 408, nor with keep-alive off)."""
        return self._phase != CLOSING and self._limits.keepalive_timeout > 0

    def ended(self, body: StreamReader) -> None:
        """The response is out."""
        self._writer = None
        if self._phase == GONE:
            return
        if self._phase == CLOSING:
            self._body = None
            if self._protocol is not None:
                self._protocol.force_close()  # after the 408: the rest of the request is not read
        elif body.is_eof():
            self._idle()
        else:
            self._phase = LINGER
            self._body = body
            self._disarm()

    def lost(self) -> None:
        if self._phase == IDLE and self._limits.keepalive_timeout > 0 and self._loop.time() >= self._idle_until:
            CLOSED_KEEPALIVE_TIMEOUT.inc()  # idle that long: aiohttp's keep-alive timer closed it
        self._disarm()
        self._phase = GONE
        self._protocol = None
        self._body = self._writer = None

    # -- the timer --------------------------------------------------------------------

    def _idle(self) -> None:
        self._phase = IDLE
        self._body = None
        if self._timer is not None:
            self._disarm()
        self._idle_until = self._loop.time() + self._limits.keepalive_timeout

    def _arm(self, delay: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._epoch += 1
        live = delay > 0 and self._protocol is not None and self._protocol.transport is not None
        self._timer = self._loop.call_later(delay, self._due, self._epoch) if live else None

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
            self._epoch += 1

    def _due(self, epoch: int) -> None:
        # One loop turn later: a request parsed in this turn is started (`started`) first.
        self._timer = None
        self._loop.call_soon(self._expire, epoch)

    def _expire(self, epoch: int) -> None:
        protocol = self._protocol
        if epoch != self._epoch or protocol is None or protocol.transport is None:
            return
        phase = self._phase
        if phase == FRESH:
            CLOSED_HEADER_TIMEOUT.inc()
            self._phase = CLOSING
            protocol.force_close()
        elif phase == HEADER:
            self._header_timeout(protocol)
        elif phase == BODY:
            self._body_due(protocol)

    def _header_timeout(self, protocol: Protocol) -> None:
        CLOSED_HEADER_TIMEOUT.inc()
        self._phase = CLOSING
        err = RequestTimeout(
            f"the request headers did not arrive within {self._limits.header_timeout:g} s (--client-header-timeout)"
        )
        transport = protocol.transport
        assert transport is not None
        peer = transport.get_extra_info("peername")
        remote = peer[0] if isinstance(peer, (tuple, list)) and peer else None
        log.debug("rejected a request from %s: %s", remote, err.message)
        answer_unread(transport, err)
        RESPONSES.labels("unparsed", str(err.status), err.code or "").inc()
        accesslog.unread("-", "-", remote, err.status, err.code)  # its request line never arrived
        protocol.force_close()  # the answer is flushed first

    def _body_due(self, protocol: Protocol) -> None:
        body = self._body
        timeout = self._limits.body_timeout
        if body is None or body.is_eof():
            self._phase = BUSY
            return
        now = self._loop.time()
        transport = protocol.transport
        if transport is not None and not transport.is_reading():
            self._last_read = now  # aiohttp paused reading: the client cannot send, its clock starts again
        due = self._last_read + timeout
        if now < due:
            self._arm(due - now)
            return
        CLOSED_BODY_TIMEOUT.inc()
        writer = self._writer
        if writer is None or writer.output_size > 0:
            protocol.force_close()  # a response has begun: closing is the only word left
            return
        self._phase = CLOSING
        body.set_exception(
            RequestTimeout(f"the request body stalled: no bytes for {timeout:g} s (--client-body-timeout)")
        )
