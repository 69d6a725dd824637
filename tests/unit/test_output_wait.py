"""`DeltaQueue.wait(timeout)`: the writer's heartbeat wait (output, end, sink error or deadline; takes nothing)."""

from __future__ import annotations

import asyncio
import time

from engine_adapter.base import Delta, DeltaQueue, PushFailed


async def test_wait_returns_at_the_deadline_when_nothing_comes() -> None:
    out = DeltaQueue()
    t0 = time.monotonic()
    await out.wait(0.05)
    assert time.monotonic() - t0 >= 0.04
    assert out.get_nowait() is None


async def test_wait_wakes_on_output_and_leaves_it_pending() -> None:
    out = DeltaQueue()
    loop = asyncio.get_running_loop()
    loop.call_later(0.01, out.put, [Delta(0, "a", 1)])
    t0 = time.monotonic()
    await out.wait(10)
    assert time.monotonic() - t0 < 5
    got = out.get_nowait()
    assert got is not None and [d.text for d in got] == ["a"]


async def test_wait_returns_at_once_when_pending_or_closed() -> None:
    out = DeltaQueue()
    out.put([Delta(0, "a", 1)])
    await asyncio.wait_for(out.wait(10), 1)
    out.get_nowait()
    out.close()
    await asyncio.wait_for(out.wait(10), 1)


async def test_wait_wakes_on_close_and_on_a_sink_error() -> None:
    out = DeltaQueue()
    asyncio.get_running_loop().call_later(0.01, out.close)
    await asyncio.wait_for(out.wait(10), 1)

    def boom(deltas: list[Delta]) -> bool:
        raise RuntimeError("boom")

    out = DeltaQueue()
    assert out.arm(boom)
    asyncio.get_running_loop().call_later(0.01, out.put, [Delta(0, "a", 1)])
    await asyncio.wait_for(out.wait(10), 1)
    try:
        out.get_nowait()
    except PushFailed:
        pass
    else:
        raise AssertionError("expected PushFailed")


async def test_cancelled_wait_leaves_no_timer_and_a_later_put_is_harmless() -> None:
    out = DeltaQueue()
    task = asyncio.ensure_future(out.wait(10))
    await asyncio.sleep(0.01)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    out.put([Delta(0, "a", 1)])  # the cancelled waiter is not resolved again
    assert out.get_nowait() is not None
