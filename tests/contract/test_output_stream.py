"""One suite over every OutputStream implementation: the engine -> writer hand-over.

`engine_adapter.base.DeltaQueue` is the one implementation; the suite runs
it fed the way each engine feeds it (producers.py): put and closed by the
fake engine and vLLM's direct route, and filled by vLLM's own output path
through a `RequestOutputCollector` (`vllm_stream.into_queue`): pull
(coalescing, the end, engine failures, cancellation safety), the heartbeat
`wait`, and push (`arm`: steps handed to the writer's sink in the
producer's own call). It compares what a writer makes of a batch: the
text, token count and finish reason per choice.
What only one implementation does is at the end of this file and in
tests/unit/test_output_stream.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from engine_adapter.base import Delta, EngineFailure, PushFailed
from tests.contract.producers import BaseProducer, VllmProducer

# Bounds for what must happen "at once": generous, a passing test never waits them out.
SOON = 10.0
NEVER = 3600.0  # a deadline no test reaches


@pytest.fixture(params=["base", "vllm-standin", pytest.param("vllm", marks=[pytest.mark.engine, pytest.mark.vllm_sources])])
def producer(request: pytest.FixtureRequest) -> BaseProducer | VllmProducer:
    if request.param == "base":
        return BaseProducer()
    return VllmProducer(real=request.param == "vllm")


def joined(deltas: Sequence[Delta] | None) -> dict[int, str]:
    """Text per choice, in order."""
    assert deltas is not None
    out: dict[int, str] = {}
    for d in deltas:
        out[d.index] = out.get(d.index, "") + d.text  # type: ignore[operator]
    return out


def tokens(deltas: Sequence[Delta]) -> dict[int, int]:
    out: dict[int, int] = {}
    for d in deltas:
        out[d.index] = out.get(d.index, 0) + d.num_tokens
    return out


def reasons(deltas: Sequence[Delta]) -> dict[int, str]:
    return {d.index: d.finish_reason for d in deltas if d.finish_reason is not None}


def drain(stream) -> list[Delta]:
    """Everything pending now (up to the end, if it came)."""
    out: list[Delta] = []
    try:
        while (got := stream.get_nowait()) is not None:
            out += got
    except StopAsyncIteration:
        pass
    return out


async def settle() -> None:
    """Let every ready callback and task run."""
    for _ in range(5):
        await asyncio.sleep(0)


class Sink:
    """A push sink that records what it took; `accept=False` refuses, `boom` raises."""

    def __init__(self, accept: bool = True, boom: BaseException | None = None) -> None:
        self.accept = accept
        self.boom = boom
        self.got: list[list[Delta]] = []

    def __call__(self, deltas: list[Delta]) -> bool:
        if self.boom is not None:
            raise self.boom
        if self.accept:
            self.got.append(deltas)
        return self.accept


# -- pull -----------------------------------------------------------------------------------


def test_a_fresh_stream_has_nothing_and_is_not_finished(producer):
    assert producer.stream.get_nowait() is None
    assert producer.stream.finished is False
    assert isinstance(producer.stream.prompt_tokens, int) and isinstance(producer.stream.cached_tokens, int)


def test_one_step_one_get(producer):
    producer.step("a")
    assert joined(producer.stream.get_nowait()) == {0: "a"}
    assert producer.stream.get_nowait() is None


def test_steps_the_consumer_missed_coalesce_into_one_get_in_order(producer):
    producer.step("a", (1, "x"))
    producer.step("b")
    producer.step("c")
    got = producer.stream.get_nowait()
    assert joined(got) == {0: "abc", 1: "x"}
    assert tokens(got) == {0: 3, 1: 1}
    assert producer.stream.get_nowait() is None


def test_a_taken_list_is_never_touched_again(producer):
    producer.step("a")
    got = producer.stream.get_nowait()
    producer.step("b")
    assert joined(got) == {0: "a"}
    assert joined(producer.stream.get_nowait()) == {0: "b"}


def test_the_last_output_comes_first_then_the_end(producer):
    producer.step("a")
    producer.finish("z", "length")
    assert producer.stream.finished is False  # something is still to take
    got = producer.stream.get_nowait()
    assert joined(got) == {0: "az"} and reasons(got) == {0: "length"}
    assert producer.stream.finished is True
    with pytest.raises(StopAsyncIteration):
        producer.stream.get_nowait()


async def test_async_iteration_yields_the_steps_then_ends(producer):
    producer.step("a")
    producer.step("b")
    producer.finish()
    steps = [step async for step in producer.stream]
    everything = [d for step in steps for d in step]
    assert joined(everything) == {0: "ab"} and reasons(everything) == {0: "stop"}


async def test_get_waits_for_a_step(producer):
    task = asyncio.ensure_future(producer.stream.get())
    await settle()
    assert not task.done()
    producer.step("late")
    assert joined(await asyncio.wait_for(task, SOON)) == {0: "late"}


async def test_get_wakes_on_the_last_output_and_then_ends(producer):
    task = asyncio.ensure_future(producer.stream.get())
    await settle()
    producer.finish()
    assert reasons(await asyncio.wait_for(task, SOON)) == {0: "stop"}
    with pytest.raises(StopAsyncIteration):
        await asyncio.wait_for(producer.stream.get(), SOON)


async def test_get_wakes_on_an_engine_failure(producer):
    task = asyncio.ensure_future(producer.stream.get())
    await settle()
    producer.fail("died")
    with pytest.raises(EngineFailure, match="died"):
        await asyncio.wait_for(task, SOON)


def test_an_engine_failure_comes_after_the_pending_steps_and_stays(producer):
    producer.step("a")
    producer.fail("engine dead")
    assert joined(producer.stream.get_nowait()) == {0: "a"}
    for _ in range(2):
        with pytest.raises(EngineFailure, match="engine dead"):
            producer.stream.get_nowait()


async def test_a_timed_out_get_loses_nothing(producer):
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.01):
            await producer.stream.get()
    producer.step("a")
    assert joined(await asyncio.wait_for(producer.stream.get(), SOON)) == {0: "a"}


async def test_a_get_cancelled_right_after_a_step_loses_nothing(producer):
    # The step wakes the waiter, but the cancel lands before get() resumes.
    task = asyncio.ensure_future(producer.stream.get())
    await settle()
    producer.step("a")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert joined(producer.stream.get_nowait()) == {0: "a"}


async def test_repeated_timeouts_then_steps_then_the_end(producer):
    loop = asyncio.get_running_loop()
    loop.call_later(0.03, producer.step, "a")
    loop.call_later(0.05, producer.step, "b")
    loop.call_later(0.05, producer.finish)
    seen: list[Delta] = []
    timeouts = 0
    while True:
        try:
            async with asyncio.timeout(0.01):
                seen += await producer.stream.get()
        except TimeoutError:
            timeouts += 1
        except StopAsyncIteration:
            break
    assert joined(seen) == {0: "ab"} and reasons(seen) == {0: "stop"}
    assert timeouts >= 1


# -- wait: the writer's heartbeat deadline ------------------------------------------------------


async def test_wait_returns_at_the_deadline_when_nothing_comes_and_takes_nothing(producer):
    loop = asyncio.get_running_loop()
    start = loop.time()
    await asyncio.wait_for(producer.stream.wait(0.05), SOON)
    assert loop.time() - start >= 0.04  # it did wait (a lower bound: never flaky)
    assert producer.stream.get_nowait() is None


async def test_wait_wakes_on_a_step_and_leaves_it_for_the_taker(producer):
    asyncio.get_running_loop().call_later(0.01, producer.step, "a")
    await asyncio.wait_for(producer.stream.wait(NEVER), SOON)  # woken by the step, not the deadline
    assert joined(producer.stream.get_nowait()) == {0: "a"}


async def test_wait_returns_at_once_when_something_is_pending_or_it_ended(producer):
    producer.step("a")
    await asyncio.wait_for(producer.stream.wait(NEVER), SOON)
    producer.stream.get_nowait()
    producer.finish()
    drain(producer.stream)
    await asyncio.wait_for(producer.stream.wait(NEVER), SOON)


async def test_wait_wakes_on_the_end(producer):
    asyncio.get_running_loop().call_later(0.01, producer.finish)
    await asyncio.wait_for(producer.stream.wait(NEVER), SOON)


async def test_wait_wakes_on_a_sink_error(producer):
    def boom(deltas: list[Delta]) -> bool:
        raise RuntimeError("boom")

    assert producer.stream.arm(boom)
    asyncio.get_running_loop().call_later(0.01, producer.step, "a")
    await asyncio.wait_for(producer.stream.wait(NEVER), SOON)
    with pytest.raises(PushFailed):
        producer.stream.get_nowait()


async def test_a_cancelled_wait_leaves_nothing_behind(producer):
    task = asyncio.ensure_future(producer.stream.wait(NEVER))
    await settle()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    producer.step("a")  # the cancelled waiter is not resolved again
    assert joined(producer.stream.get_nowait()) == {0: "a"}


# -- push: arm(sink) --------------------------------------------------------------------------------


async def test_an_armed_step_goes_to_the_sink_in_the_producers_call(producer):
    sink = Sink()
    task = asyncio.ensure_future(producer.stream.get())
    await settle()
    assert producer.stream.arm(sink)
    producer.step("a")
    producer.step("b", (1, "x"))
    assert [joined(step) for step in sink.got] == [{0: "a"}, {0: "b", 1: "x"}]
    await settle()
    assert not task.done()  # the consumer is not woken per step
    assert producer.stream.get_nowait() is None
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_a_refused_step_stays_pending_wakes_the_consumer_and_disarms(producer):
    sink = Sink(accept=False)
    assert producer.stream.arm(sink)
    task = asyncio.ensure_future(producer.stream.get())
    await settle()
    producer.step("a")  # refused: pending, the consumer woken
    producer.step("b")  # disarmed: pending as usual
    producer.step("c")
    got = await asyncio.wait_for(task, SOON)
    got += drain(producer.stream)
    assert joined(got) == {0: "abc"}  # nothing lost or reordered
    # No stale wake-up left behind: the heartbeat wait sleeps to its deadline.
    loop = asyncio.get_running_loop()
    start = loop.time()
    await asyncio.wait_for(producer.stream.wait(0.05), SOON)
    assert loop.time() - start >= 0.04
    sink.accept = True
    assert producer.stream.arm(sink)  # re-armed once nothing is pending
    producer.step("d")
    assert [joined(step) for step in sink.got] == [{0: "d"}]


def test_arm_is_refused_while_something_is_pending_or_after_the_end(producer):
    producer.step("a")
    assert not producer.stream.arm(Sink())
    producer.stream.get_nowait()
    producer.finish()
    drain(producer.stream)
    assert not producer.stream.arm(Sink())


async def test_the_end_while_armed_wakes_the_consumer(producer):
    sink = Sink()
    assert producer.stream.arm(sink)
    task = asyncio.ensure_future(producer.stream.get())
    await settle()
    producer.step("a")
    assert not task.done()
    producer.finish()
    with pytest.raises(StopAsyncIteration):
        await asyncio.wait_for(task, SOON)
    assert producer.stream.finished
    assert joined([d for step in sink.got for d in step]) == {0: "a"}
    assert reasons(sink.got[-1]) == {0: "stop"}


def test_a_refused_last_output_is_delivered_before_the_end(producer):
    assert producer.stream.arm(Sink(accept=False))
    producer.finish("z", "length")
    got = producer.stream.get_nowait()
    assert joined(got) == {0: "z"} and reasons(got) == {0: "length"}
    with pytest.raises(StopAsyncIteration):
        producer.stream.get_nowait()


async def test_an_engine_failure_while_armed_fails_the_stream(producer):
    sink = Sink()
    assert producer.stream.arm(sink)
    task = asyncio.ensure_future(producer.stream.get())
    await settle()
    producer.fail("engine dead")
    with pytest.raises(EngineFailure):
        await asyncio.wait_for(task, SOON)
    assert sink.got == []


async def test_a_sink_exception_never_reaches_the_producer(producer):
    assert producer.stream.arm(Sink(boom=ValueError("bad frame")))
    task = asyncio.ensure_future(producer.stream.get())
    await settle()
    producer.step("a")  # must not raise into the engine's loop
    producer.step("b")  # disarmed: pending, still no raise
    with pytest.raises(PushFailed) as info:
        await asyncio.wait_for(task, SOON)
    assert isinstance(info.value.__cause__, ValueError)
    assert not producer.stream.finished  # so the route aborts the engine request
    assert not producer.stream.arm(Sink())


def test_a_disarmed_stream_is_pulled_as_before(producer):
    sink = Sink()
    assert producer.stream.arm(sink)
    producer.stream.disarm()
    producer.step("a")
    producer.step("b")
    assert sink.got == []
    assert joined(producer.stream.get_nowait()) == {0: "ab"}


def test_each_choice_is_pushed_as_it_comes(producer):
    sink = Sink()
    assert producer.stream.arm(sink)
    producer.step((0, "a"))
    producer.step((1, "x"))
    assert [joined(step) for step in sink.got] == [{0: "a"}, {1: "x"}]


# -- what only one implementation does ---------------------------------------------------------


@pytest.fixture(params=["vllm-standin", pytest.param("vllm", marks=[pytest.mark.engine, pytest.mark.vllm_sources])])
def vllm_producer(request: pytest.FixtureRequest) -> VllmProducer:
    return VllmProducer(real=request.param == "vllm")


def test_vllm_counts_prompt_and_cached_tokens_from_the_request_output(vllm_producer):
    vllm_producer.step("a")
    vllm_producer.stream.get_nowait()
    assert vllm_producer.stream.prompt_tokens == len(VllmProducer.PROMPT)
    assert vllm_producer.stream.cached_tokens == VllmProducer.CACHED


def test_vllm_armed_steps_leave_the_collector_empty_and_unset(vllm_producer):
    # The collector holds nothing: every output goes to the queue from vLLM's put.
    sink = Sink()
    assert vllm_producer.stream.arm(sink)
    vllm_producer.step("a")
    vllm_producer.step("b")
    assert [joined(step) for step in sink.got] == [{0: "a"}, {0: "b"}]
    assert vllm_producer.collector.output is None and not vllm_producer.collector.ready.is_set()


def test_vllm_a_drained_refusal_leaves_no_wake_up_set(vllm_producer):
    assert vllm_producer.stream.arm(Sink(accept=False))
    vllm_producer.step("a")  # refused: held, the consumer woken
    vllm_producer.step("b")  # pending in the queue
    assert joined(drain(vllm_producer.stream)) == {0: "ab"}
    assert not vllm_producer.collector.ready.is_set()  # the next get() or wait() sleeps


def test_vllm_an_output_put_before_the_queue_took_the_collector_comes_first(vllm_producer):
    # AsyncLLM.add_request awaits the engine core after registering the collector: vLLM's handler may put first.
    from engine_adapter.vllm_stream import into_queue

    vllm_producer.collector = vllm_producer.new_collector()  # no queue has taken it yet
    vllm_producer.step("early")
    stream = into_queue(vllm_producer.collector)
    vllm_producer.step("later")
    assert joined(stream.get_nowait()) == {0: "earlylater"}
    assert vllm_producer.collector.output is None


def test_vllm_an_output_that_cannot_be_converted_fails_the_stream_not_vllms_loop(vllm_producer):
    broken = vllm_producer.output([(0, "a")])
    broken.outputs = None  # not iterable: the conversion raises
    vllm_producer.step("a")
    vllm_producer.collector.put(broken)  # must not raise into vLLM's output handler
    vllm_producer.step("b")  # ignored: the stream has ended
    assert joined(vllm_producer.stream.get_nowait()) == {0: "a"}
    with pytest.raises(EngineFailure, match="TypeError"):
        vllm_producer.stream.get_nowait()


@pytest.mark.parametrize("real", [False, pytest.param(True, marks=pytest.mark.engine)], ids=["vllm-standin", "vllm"])
@pytest.mark.parametrize("push", [False, True], ids=["pull", "push"])
def test_vllm_prompt_logprobs_are_on_the_stream_before_the_first_step_is_handed_out(real, push):
    producer = VllmProducer(real=real, prompt_logprobs=1)
    stream = producer.stream
    assert stream.prompt_logprobs is None
    seen_at_step: list[object] = []
    def record(deltas: list[Delta]) -> bool:
        seen_at_step.append(stream.prompt_logprobs)
        return True

    if push:
        assert stream.arm(record)
    producer.step("a")
    producer.step("b")
    if not push:
        stream.get_nowait()
        seen_at_step.append(stream.prompt_logprobs)
    assert seen_at_step[0] is not None
    got = stream.prompt_logprobs
    assert got is not None and [t.token_id for t in got] == VllmProducer.PROMPT
    first, second, third = got
    assert (first.logprob, first.top, first.token, first.bytes) == (None, (), "t1", b"t1")
    # The own token with its rank; the top 1 by rank after it (k = 1).
    assert (second.logprob, second.rank, [(a.token_id, a.logprob, a.rank) for a in second.top]) == (-0.5, 1, [(2, -0.5, 1)])
    assert (third.logprob, third.rank, [(a.token_id, a.rank) for a in third.top]) == (-3.0, 4, [(9, 1)])
