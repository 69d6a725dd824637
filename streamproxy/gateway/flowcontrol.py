"""Admission to a saturated deployment: the asyncio side of `fairq.FairQueue`.

`FlowControl.admit(tenant, band, cost)` returns a `Ticket` at once while the
deployment has room (fewer requests in flight than `limit()`, from its
replicas' concurrency bounds: `fairq.deployment_limit`) and nobody waits;
otherwise the request joins the queue and awaits its turn. `release(ticket)`,
in the request's `finally`, frees its place and dispatches the next waiters
(`poke()` does the same when the limit grew: a replica came back). A waiter
refused (the queue full, its band shed) or expired raises the 429 that
`FairQueue.refusal` builds; one whose task is cancelled (its client went
away) leaves the queue, or gives its place back if it was dispatched in the
meantime. One timer, at the earliest deadline, refuses the expired. Times
are the loop's clock. Nothing here runs per token.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable

from streamproxy.gateway.fairq import FairQueue, Outcome, Waiter


class Ticket:
    __slots__ = ("band", "charged", "cost", "released", "tenant", "weight")

    def __init__(self, tenant: str, band: int, cost: float, weight: float) -> None:
        self.tenant, self.band, self.cost, self.weight = tenant, band, cost, weight
        self.released = False
        self.charged = False  # dispatched from the queue: its cost is on its tenant's counter


class FlowControl:
    def __init__(self, name: str, queue: FairQueue, limit: Callable[[], float]) -> None:
        self.name = name  # the deployment's, for the refusals' messages
        self.queue = queue
        self.limit = limit
        self.inflight = 0  # admitted and not released
        self._timer: asyncio.TimerHandle | None = None

    async def admit(self, tenant: str, band: int = 0, cost: float = 1.0, weight: float = 1.0,
                    timeout: float | None = None) -> Ticket:
        """Wait for a place (at most the queue's `max_wait`, or `timeout` if sooner); RateLimited if refused."""
        loop = asyncio.get_running_loop()
        ticket = Ticket(tenant, band, cost, weight)
        if not len(self.queue) and self.inflight < self.limit():
            self.inflight += 1
            return ticket
        now = loop.time()
        w = Waiter(tenant, band, cost, weight, deadline=now + timeout if timeout else math.inf)
        future: asyncio.Future[None] = loop.create_future()
        w.handle = future
        for shed in self.queue.push(w, now):
            if shed is w:
                raise self.queue.refusal(w, now, self.name)
            self._refuse(shed, now)
        self._dispatch()
        try:
            await future
        except asyncio.CancelledError:
            self._left(w, future)
            raise
        ticket.charged = True
        return ticket

    def release(self, ticket: Ticket, cost: float | None = None) -> None:
        """The request ended (`cost`: what it really cost, if known, to correct its tenant's share)."""
        if ticket.released:
            return
        ticket.released = True
        self.inflight -= 1
        if cost is not None and ticket.charged:  # (one admitted at once was never charged: nothing to correct)
            self.queue.charge(ticket.tenant, ticket.band, (cost - ticket.cost) / ticket.weight)
        self._dispatch()

    def poke(self) -> None:
        """The limit may have grown: dispatch whom it now lets through."""
        self._dispatch()

    def _left(self, w: Waiter, future: asyncio.Future[None]) -> None:
        if self.queue.cancel(w):
            self._arm()
        elif w.outcome is Outcome.DISPATCHED:  # its turn came as its client went: give the place back
            self.inflight -= 1
            self._dispatch()
        elif future.done() and not future.cancelled():
            future.exception()  # (refused meanwhile: nobody will read it)

    def _dispatch(self) -> None:
        queue = self.queue
        now = asyncio.get_running_loop().time()
        for w in queue.expire(now):
            self._refuse(w, now)
        while len(queue) and self.inflight < self.limit():
            turn = queue.pop(now)
            if turn is None:
                break
            self.inflight += 1
            future = turn.handle
            assert isinstance(future, asyncio.Future)
            if not future.done():
                future.set_result(None)
        self._arm()

    def _refuse(self, w: Waiter, now: float) -> None:
        future = w.handle
        assert isinstance(future, asyncio.Future)
        if not future.done():
            future.set_exception(self.queue.refusal(w, now, self.name))

    def _arm(self) -> None:
        """One timer, at the earliest deadline of those waiting."""
        deadline = self.queue.next_deadline()
        if deadline is not None and not math.isfinite(deadline):
            deadline = None  # (no bound on waiting)
        timer = self._timer
        if timer is not None and (deadline is None or timer.when() != deadline):
            timer.cancel()
            self._timer = timer = None
        if deadline is not None and timer is None:
            self._timer = asyncio.get_running_loop().call_at(deadline, self._expired)

    def _expired(self) -> None:
        self._timer = None
        self._dispatch()
