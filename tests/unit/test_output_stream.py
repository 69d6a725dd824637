"""DeltaQueue: the engine -> writer hand-over (coalescing, end, errors, cancellation)."""

from __future__ import annotations

import asyncio

import pytest

from engine_adapter.base import Delta, DeltaQueue, EngineFailure


def d(text: str, index: int = 0) -> Delta:
    return Delta(index, text, 1)


def texts(deltas) -> list[str]:
    return [x.text for x in deltas]


def test_get_nowait_is_none_when_nothing_is_pending():
    assert DeltaQueue().get_nowait() is None


def test_one_put_one_get():
    s = DeltaQueue()
    s.put([d("a")])
    assert texts(s.get_nowait()) == ["a"]
    assert s.get_nowait() is None


def test_several_puts_coalesce_into_one_get_in_order():
    s = DeltaQueue()
    s.put([d("a"), d("x", 1)])
    s.put([d("b")])
    s.put([d("c")])
    assert texts(s.get_nowait()) == ["a", "x", "b", "c"]
    assert s.get_nowait() is None


def test_get_returns_a_list_the_stream_no_longer_touches():
    s = DeltaQueue()
    s.put([d("a")])
    got = s.get_nowait()
    s.put([d("b")])
    assert texts(got) == ["a"]
    assert texts(s.get_nowait()) == ["b"]


def test_close_after_pending_items_delivers_them_first():
    s = DeltaQueue()
    s.put([d("a")])
    s.close()
    assert s.finished is False
    assert texts(s.get_nowait()) == ["a"]
    assert s.finished is True
    with pytest.raises(StopAsyncIteration):
        s.get_nowait()


def test_close_with_error_raises_after_pending_items_are_taken():
    s = DeltaQueue()
    s.put([d("a")])
    failure = EngineFailure("boom")
    s.close(failure)
    assert texts(s.get_nowait()) == ["a"]
    with pytest.raises(EngineFailure) as info:
        s.get_nowait()
    assert info.value is failure


def test_error_keeps_being_raised():
    s = DeltaQueue()
    s.close(EngineFailure("boom"))
    for _ in range(2):
        with pytest.raises(EngineFailure):
            s.get_nowait()


def test_first_error_wins():
    s = DeltaQueue()
    s.close(EngineFailure("first"))
    s.close(EngineFailure("second"))
    s.close()
    with pytest.raises(EngineFailure, match="first"):
        s.get_nowait()


def test_fresh_stream_is_not_finished():
    assert DeltaQueue().finished is False


def test_async_iteration_ends_with_stop_async_iteration():
    async def main():
        s = DeltaQueue()
        s.put([d("a")])
        s.put([d("b")])
        s.close()
        return [texts(step) async for step in s]

    assert asyncio.run(main()) == [["a", "b"]]


def test_get_waits_for_a_put():
    async def main():
        s = DeltaQueue()
        task = asyncio.create_task(s.get())
        await asyncio.sleep(0)
        assert not task.done()
        s.put([d("late")])
        return texts(await task)

    assert asyncio.run(main()) == ["late"]


def test_get_wakes_on_close():
    async def main():
        s = DeltaQueue()
        task = asyncio.create_task(s.get())
        await asyncio.sleep(0)
        s.close()
        with pytest.raises(StopAsyncIteration):
            await task

    asyncio.run(main())


def test_get_wakes_on_close_with_error():
    async def main():
        s = DeltaQueue()
        task = asyncio.create_task(s.get())
        await asyncio.sleep(0)
        s.close(EngineFailure("died"))
        with pytest.raises(EngineFailure, match="died"):
            await task

    asyncio.run(main())


def test_get_timed_out_loses_nothing():
    async def main():
        s = DeltaQueue()
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.01):
                await s.get()
        s.put([d("a")])
        return texts(await s.get())

    assert asyncio.run(main()) == ["a"]


def test_get_cancelled_right_after_a_put_loses_nothing():
    # The put wakes the waiter, but the cancel lands before get() resumes.
    async def main():
        s = DeltaQueue()
        task = asyncio.create_task(s.get())
        await asyncio.sleep(0)
        s.put([d("a")])
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return texts(s.get_nowait())

    assert asyncio.run(main()) == ["a"]


def test_repeated_timeouts_then_items_then_end():
    async def main():
        s = DeltaQueue()
        seen = []
        loop = asyncio.get_running_loop()
        loop.call_later(0.03, s.put, [d("a")])
        loop.call_later(0.05, s.put, [d("b")])
        loop.call_later(0.05, s.close)
        timeouts = 0
        while True:
            try:
                async with asyncio.timeout(0.01):
                    seen += texts(await s.get())
            except TimeoutError:
                timeouts += 1
            except StopAsyncIteration:
                return seen, timeouts

    seen, timeouts = asyncio.run(main())
    assert seen == ["a", "b"]
    assert timeouts >= 1
