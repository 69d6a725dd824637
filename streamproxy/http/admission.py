"""Admission control: a bounded number of requests generate, a bounded number wait.

`enter()` decides at once, with no await: granted, queued, or a 429 with Retry-After. Queued tickets are
granted in arrival order; one whose client leaves gives up its place; `release()` once per ticket in the
route's `finally`. `max_concurrent == 0`: no limit. A ticket counts `weight` slots (a batched
completions request, one per prompt), granted when all are free; a weight above the limit counts as the
limit. The gauges and the rejection counter move here.
"""

from __future__ import annotations

import asyncio
from collections import deque

from streamproxy.errors import RateLimited
from streamproxy.http.metrics import ADMISSION_REJECTIONS, REQUESTS_QUEUED, REQUESTS_RUNNING


class Ticket:
    __slots__ = ("_admission", "granted", "waiter", "released", "weight")

    def __init__(self, admission: Admission, granted: bool, weight: int = 1) -> None:
        self._admission = admission
        self.granted = granted
        self.weight = weight
        self.waiter: asyncio.Future[None] | None = None
        self.released = False

    async def wait(self) -> None:
        """Until the ticket holds a slot (returns at once if it already does)."""
        if self.granted:
            return
        if self.waiter is None:
            self.waiter = asyncio.get_running_loop().create_future()
        await asyncio.shield(self.waiter)

    def release(self) -> None:
        if not self.released:
            self.released = True
            self._admission.ticket_released(self)


class Admission:
    def __init__(self, max_concurrent: int = 0, max_queued: int = 0) -> None:
        self.max_concurrent = max_concurrent
        self.max_queued = max_queued
        self.active = 0
        self._queue: deque[Ticket] = deque()
        self.queued = 0  # the queued tickets' weights
        self.rejected = 0

    def enter(self, weight: int = 1) -> Ticket:
        if self.max_concurrent > 0:
            weight = min(weight, self.max_concurrent)
        if self.max_concurrent <= 0 or (self.active + weight <= self.max_concurrent and not self._queue):
            self.active += weight
            REQUESTS_RUNNING.inc(weight)
            return Ticket(self, True, weight)
        if self.queued + weight > self.max_queued:
            self.rejected += 1
            ADMISSION_REJECTIONS.inc()
            raise RateLimited(
                f"the server is at capacity ({self.active} requests running, {self.queued} waiting); retry shortly",
                retry_after=1,
            )
        ticket = Ticket(self, False, weight)
        self._queue.append(ticket)
        self.queued += weight
        REQUESTS_QUEUED.inc(weight)
        return ticket

    def ticket_released(self, ticket: Ticket) -> None:
        if not ticket.granted:
            # Left while waiting: give up the place in line.
            try:
                self._queue.remove(ticket)
            except ValueError:
                return
            self.queued -= ticket.weight
            REQUESTS_QUEUED.dec(ticket.weight)
            # A heavy ticket that left the head of the line may have held lighter ones back.
            self._grant()
            return
        self.active -= ticket.weight
        REQUESTS_RUNNING.dec(ticket.weight)
        self._grant()

    def _grant(self) -> None:
        """Grant waiting tickets in arrival order while their weight fits."""
        while self._queue and self.active + self._queue[0].weight <= max(self.max_concurrent, 1):
            nxt = self._queue.popleft()
            self.queued -= nxt.weight
            REQUESTS_QUEUED.dec(nxt.weight)
            nxt.granted = True
            self.active += nxt.weight
            REQUESTS_RUNNING.inc(nxt.weight)
            waiter = nxt.waiter
            if waiter is None:
                nxt.waiter = waiter = asyncio.get_running_loop().create_future()
            if not waiter.done():
                waiter.set_result(None)
