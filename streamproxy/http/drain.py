"""How long a generating request may live, and the graceful drain that shortens it.

Every generating request runs inside one `Lifetime`, an `asyncio.Timeout` with the request timeout (one
timer per request). `InFlight.begin_drain(deadline, reason)` pulls every deadline in (and later
lifetimes start with it), so a request not done by then ends as a timeout does: cancelled where it
awaits, and the writer ends the response with the lifetime's `reason` (`server_shutting_down`, or
`engine_dead`) while the route's `finally` aborts the engine request. `wait_idle()` waits for none left.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from types import TracebackType

from aiohttp import web

from streamproxy.errors import APIError, ServerShuttingDown


class Lifetime:
    """`async with` scope bounding one request; `reason` says why it ended early."""

    __slots__ = ("_registry", "_timeout", "_after", "_on_timeout", "_reason")

    def __init__(self, registry: InFlight, timeout: float | None, on_timeout: Callable[[], APIError] | None = None) -> None:
        self._registry = registry
        self._after = timeout if timeout and timeout > 0 else None
        self._on_timeout = on_timeout
        self._timeout: asyncio.Timeout | None = None
        self._reason: APIError | None = None

    async def __aenter__(self) -> Lifetime:
        loop = asyncio.get_running_loop()
        when = None if self._after is None else loop.time() + self._after
        self._timeout = asyncio.timeout_at(when)
        await self._timeout.__aenter__()
        self._registry._enter(self)
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        assert self._timeout is not None
        try:
            await self._timeout.__aexit__(exc_type, exc, tb)  # never swallows: it returns None
        finally:
            self._registry._exit(self)

    def end_by(self, when: float, reason: APIError) -> None:
        """End the request at loop time `when` at the latest, with `reason`."""
        timeout = self._timeout
        if timeout is None or timeout.expired():
            return
        current = timeout.when()
        if current is None or when < current:
            timeout.reschedule(when)
            self._reason = reason

    @property
    def reason(self) -> APIError | None:
        if self._reason is None and self._on_timeout is not None:
            self._reason = self._on_timeout()
        return self._reason

    @property
    def expired(self) -> bool:
        return self._timeout is not None and self._timeout.expired()


class InFlight:
    """The lifetimes running now, and the drain state of the server."""

    def __init__(self) -> None:
        self._running: set[Lifetime] = set()
        self._idle: asyncio.Event | None = None
        self.draining = False
        self.drain_deadline: float | None = None
        self.drain_reason: APIError | None = None  # None: server_shutting_down
        self.ended_by_drain = 0

    def __len__(self) -> int:
        return len(self._running)

    def lifetime(self, timeout: float | None = None, on_timeout: Callable[[], APIError] | None = None) -> Lifetime:
        return Lifetime(self, timeout, on_timeout)

    def _enter(self, life: Lifetime) -> None:
        self._running.add(life)
        if self.drain_deadline is not None:
            life.end_by(self.drain_deadline, self.drain_reason or _shutdown_error())

    def _exit(self, life: Lifetime) -> None:
        self._running.discard(life)
        if self.draining and life.expired:
            self.ended_by_drain += 1
        if not self._running and self._idle is not None:
            self._idle.set()

    def begin_drain(self, deadline: float, reason: APIError | None = None) -> None:
        """No new work; everything running ends by loop time `deadline` at the latest (with
        `reason`, or the first reason given, else `server_shutting_down`)."""
        self.draining = True
        if self.drain_deadline is None or deadline < self.drain_deadline:
            self.drain_deadline = deadline
        if self.drain_reason is None:
            self.drain_reason = reason
        reason = self.drain_reason or _shutdown_error()
        for life in list(self._running):
            life.end_by(deadline, reason)

    async def wait_idle(self, timeout: float) -> bool:
        """True once nothing is in flight; False if `timeout` passed first."""
        if not self._running:
            return True
        self._idle = asyncio.Event()
        try:
            async with asyncio.timeout(timeout):
                await self._idle.wait()
            return True
        except TimeoutError:
            return not self._running
        finally:
            self._idle = None


def _shutdown_error() -> ServerShuttingDown:
    return ServerShuttingDown("the server is shutting down; this request was ended before it finished, retry it")


# Every app (serve's, the gateway's) puts its registry here, for the server's drain.
INFLIGHT_KEY: web.AppKey[InFlight] = web.AppKey("inflight", InFlight)
