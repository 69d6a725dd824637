"""What only `engine_adapter.base.DeltaQueue` does; the contract every OutputStream
keeps (coalescing, the end, failures, cancellation, wait, push) is
tests/contract/test_output_stream.py.

The base stream ends on `close()` (with or without a last step), and an error
given to `close(error)` comes after what is pending, the first one only, and
is raised again on every later take.
"""

from __future__ import annotations

import asyncio

import pytest

from engine_adapter.base import Delta, DeltaQueue, EngineFailure
from tests.support.push import keep


def d(text: str, index: int = 0) -> Delta:
    return Delta(index, text, 1)


def texts(deltas) -> list[str]:
    return [x.text for x in deltas]


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


def test_several_puts_keep_every_delta_in_order():
    s = DeltaQueue()
    s.put([d("a"), d("x", 1)])
    s.put([d("b")])
    assert texts(s.get_nowait()) == ["a", "x", "b"]


def test_a_put_never_changes_the_producers_list():
    s = DeltaQueue()
    first = [d("a")]
    s.put(first)
    s.put([d("b")])
    assert texts(first) == ["a"]
    assert texts(s.get_nowait()) == ["a", "b"]


def test_get_wakes_on_close_without_a_last_step():
    async def main():
        s = DeltaQueue()
        task = asyncio.create_task(s.get())
        await asyncio.sleep(0)
        s.close()
        with pytest.raises(StopAsyncIteration):
            await task

    asyncio.run(main())


def test_close_disarms_and_wakes_the_consumer():
    async def main():
        s = DeltaQueue()
        got: list[list[Delta]] = []
        assert s.arm(keep(got))
        task = asyncio.create_task(s.get())
        await asyncio.sleep(0)
        s.close()
        with pytest.raises(StopAsyncIteration):
            await task
        assert got == [] and s.finished

    asyncio.run(main())


def test_held_steps_go_through_the_sink_in_one_piece_with_the_next_put():
    """A held step (the engine ran ahead of the front end) waits, with the sink still armed: the
    next `put` hands it on first, in the same piece, so order is kept and one write carries both."""
    s = DeltaQueue()
    pushed: list[list[Delta]] = []
    assert s.arm(keep(pushed))
    s.put([d("a")])  # current: through the sink
    s.hold([d("b")])
    s.hold([d("c")])
    assert [texts(x) for x in pushed] == [["a"]]
    s.put([d("e")])
    assert [texts(x) for x in pushed] == [["a"], ["b", "c", "e"]]
    assert s.get_nowait() is None


def test_release_hands_held_steps_to_the_sink():
    s = DeltaQueue()
    pushed: list[list[Delta]] = []
    assert s.arm(keep(pushed))
    s.hold([d("a")])
    s.hold([d("b")])
    s.release()
    assert [texts(x) for x in pushed] == [["a", "b"]]
    s.release()  # nothing held: nothing handed on
    assert [texts(x) for x in pushed] == [["a", "b"]]


def test_held_steps_refused_by_the_sink_stay_for_the_consumer_in_order():
    s = DeltaQueue()
    assert s.arm(lambda deltas: False)  # the client is behind: the sink refuses
    s.hold([d("a")])
    s.put([d("b")])
    assert texts(s.get_nowait() or []) == ["a", "b"]


def test_close_after_hold_gives_the_consumer_the_held_steps_first():
    s = DeltaQueue()
    pushed: list[list[Delta]] = []
    assert s.arm(keep(pushed))
    s.hold([d("a")])
    s.close()
    assert pushed == [] and texts(s.get_nowait() or []) == ["a"]
    assert s.finished
    with pytest.raises(StopAsyncIteration):
        s.get_nowait()


def test_hold_leaves_the_consumer_asleep_until_release():
    """Held steps wait for `release()` (the producer is current again): the consumer then takes
    every step held meanwhile in one go."""
    async def main():
        s = DeltaQueue()
        task = asyncio.create_task(s.get())
        await asyncio.sleep(0)
        s.hold([d("a")])
        s.hold([d("b")])
        await asyncio.sleep(0)
        assert not task.done()
        s.release()
        assert texts(await task) == ["a", "b"]

    asyncio.run(main())


def test_a_put_after_hold_wakes_the_consumer():
    async def main():
        s = DeltaQueue()
        task = asyncio.create_task(s.get())
        await asyncio.sleep(0)
        s.hold([d("a")])
        s.put([d("b")])
        assert texts(await task) == ["a", "b"]

    asyncio.run(main())
