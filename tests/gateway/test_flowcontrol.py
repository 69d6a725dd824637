"""gateway/flowcontrol.py: awaiting a place in a saturated deployment (the asyncio side of fairq)."""

from __future__ import annotations

import asyncio
import math

import pytest

from streamproxy.errors import QueueTimeout, RateLimited
from streamproxy.gateway.fairq import FairQueue
from streamproxy.gateway.flowcontrol import FlowControl, Ticket


def control(limit: int = 2, **queue: float) -> tuple[FlowControl, list[int]]:
    room = [limit]
    return FlowControl("d", FairQueue(**queue), lambda: room[0]), room  # type: ignore[arg-type]


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_under_the_limit_a_request_is_admitted_at_once() -> None:
    fc, _ = control(limit=2)
    a, b = await fc.admit("t"), await fc.admit("t")
    assert fc.inflight == 2 and len(fc.queue) == 0
    fc.release(a)
    fc.release(a)  # twice: once
    assert fc.inflight == 1
    fc.release(b)
    assert fc.inflight == 0


async def test_at_the_limit_requests_wait_and_are_let_out_fairly() -> None:
    fc, _ = control(limit=1)
    first = await fc.admit("heavy")
    order: list[str] = []

    async def one(tenant: str) -> Ticket:
        ticket = await fc.admit(tenant)
        order.append(tenant)
        return ticket

    tasks = [asyncio.create_task(one("heavy")) for _ in range(5)]
    await settle()
    tasks.append(asyncio.create_task(one("light")))
    await settle()
    assert len(fc.queue) == 6 and fc.queue.queued() == {0: {"heavy": 5, "light": 1}}
    fc.release(first)
    for _ in range(6):
        await settle()
        done = [t for t in tasks if t.done() and not t.result().released]
        assert len(done) == 1 and fc.inflight == 1
        fc.release(done[0].result())
    assert order.index("light") <= 1  # not behind the heavy tenant's five


async def test_a_waiter_whose_client_goes_away_leaves_the_queue() -> None:
    fc, _ = control(limit=1)
    held = await fc.admit("t")
    waiting = asyncio.create_task(fc.admit("t"))
    await settle()
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert len(fc.queue) == 0 and fc.queue.next_deadline() is None
    fc.release(held)
    assert fc.inflight == 0


async def test_a_waiter_cancelled_after_its_turn_came_gives_the_place_back() -> None:
    fc, _ = control(limit=1)
    held = await fc.admit("t")
    waiting = asyncio.create_task(fc.admit("t"))
    await settle()
    fc.release(held)  # its turn: inflight counts it
    waiting.cancel()  # ... but its client is gone before it runs
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert fc.inflight == 0


async def test_the_waiting_bound_raises_queue_timeout() -> None:
    fc, _ = control(limit=1, max_wait=0.05)
    held = await fc.admit("t")
    with pytest.raises(QueueTimeout) as caught:
        await fc.admit("t", band=1)
    assert caught.value.status == 429 and caught.value.retry_after is not None
    with pytest.raises(QueueTimeout):
        await fc.admit("t", timeout=0.01)  # the request's own, sooner bound
    fc.release(held)
    assert fc.inflight == 0 and len(fc.queue) == 0


async def test_a_full_queue_refuses_and_sheds_the_lowest_band() -> None:
    fc, _ = control(limit=1, max_queued=2)
    held = await fc.admit("a")
    low = [asyncio.create_task(fc.admit("batch", band=9)) for _ in range(2)]
    await settle()
    with pytest.raises(RateLimited) as refused:
        await fc.admit("batch", band=9)  # its own band is the lowest, and its flow the biggest
    assert refused.value.status == 429 and refused.value.headers()["Retry-After"]
    urgent = asyncio.create_task(fc.admit("chat", band=0))
    await settle()
    assert low[1].done() and isinstance(low[1].exception(), RateLimited)  # displaced: the lowest band's newest
    fc.release(held)
    await settle()
    assert urgent.done() and not low[0].done()  # the higher band first
    fc.release(urgent.result())
    await settle()
    fc.release(low[0].result())
    assert fc.inflight == 0


async def test_poke_lets_waiters_through_when_the_limit_grows() -> None:
    fc, room = control(limit=0)
    waiting = asyncio.create_task(fc.admit("t"))
    await settle()
    assert not waiting.done()
    room[0] = 1
    fc.poke()
    await settle()
    assert waiting.done() and fc.inflight == 1


async def test_release_with_the_real_cost_corrects_the_share() -> None:
    fc, _ = control(limit=1)
    held = await fc.admit("a")
    queued = [asyncio.create_task(fc.admit(t, cost=1.0)) for t in ("a", "b", "a", "b")]
    await settle()
    fc.release(held)
    await settle()
    first = next(t for t in queued if t.done())
    fc.release(first.result(), cost=50.0)  # it cost 50, not 1
    await settle()
    second = next(t for t in queued if t.done() and not t.result().released)
    assert second.result().tenant != first.result().tenant
    fc.release(second.result())
    await settle()
    third = next(t for t in queued if t.done() and not t.result().released)
    assert third.result().tenant == second.result().tenant  # the dear tenant waits its turn
    for t in queued:
        t.cancel()
    await settle()


async def test_without_a_bound_on_waiting_no_timer_is_set() -> None:
    fc, _ = control(limit=1, max_wait=math.inf)
    held = await fc.admit("t")
    waiting = asyncio.create_task(fc.admit("t"))
    await settle()
    assert fc._timer is None and not waiting.done()
    fc.release(held)
    await settle()
    assert waiting.done()
    fc.release(waiting.result())
