"""Push hand-over: `DeltaQueue.arm` and the vLLM collector hook (`VllmOutputStream`).

The vLLM half runs against a stand-in collector with the shape and
semantics of vLLM 0.32's `RequestOutputCollector` (output_processor.py):
`put(RequestOutput)` stores or merges (`RequestOutput.add(aggregate=True)`
in DELTA mode), `put(Exception)` replaces, `ready` is an asyncio.Event,
`get_nowait()` takes and clears. The same tests against vLLM's real classes
are in tests/engine/test_push_vllm.py.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from engine_adapter.base import Delta, DeltaQueue, EngineFailure, PushFailed
from engine_adapter.vllm_stream import VllmOutputStream


def d(text: str, index: int = 0) -> Delta:
    return Delta(index, text, 1)


class Sink:
    """A sink that records what it took; `accept` False refuses, `boom` raises."""

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


# -- DeltaQueue -----------------------------------------------------------------


async def test_armed_put_goes_to_the_sink_and_nothing_is_pending():
    s = DeltaQueue()
    sink = Sink()
    assert s.arm(sink)
    s.put([d("a")])
    s.put([d("b"), d("x", 1)])
    assert [[x.text for x in step] for step in sink.got] == [["a"], ["b", "x"]]
    assert s.get_nowait() is None


async def test_a_refused_step_is_pending_wakes_the_consumer_and_disarms():
    s = DeltaQueue()
    sink = Sink(accept=False)
    s.arm(sink)
    waiter = asyncio.ensure_future(s.get())
    await asyncio.sleep(0)
    s.put([d("a")])
    s.put([d("b")])  # disarmed: coalesces with the refused one
    assert [x.text for x in await asyncio.wait_for(waiter, 1)] == ["a", "b"]
    sink.accept = True
    assert s.arm(sink)  # re-armed once nothing is pending
    s.put([d("c")])
    assert [x.text for x in sink.got[0]] == ["c"]


def test_arm_is_refused_while_something_is_pending_or_after_close():
    s = DeltaQueue()
    s.put([d("a")])
    assert not s.arm(Sink())
    s.get_nowait()
    s.close()
    assert not s.arm(Sink())


async def test_close_disarms_and_wakes_the_consumer():
    s = DeltaQueue()
    sink = Sink()
    s.arm(sink)
    waiter = asyncio.ensure_future(s.get())
    await asyncio.sleep(0)
    s.put([d("a")])
    s.close()
    with pytest.raises(StopAsyncIteration):
        await asyncio.wait_for(waiter, 1)
    assert s.finished


async def test_a_sink_exception_never_reaches_the_producer():
    s = DeltaQueue()
    s.arm(Sink(boom=ValueError("bad frame")))
    waiter = asyncio.ensure_future(s.get())
    await asyncio.sleep(0)
    s.put([d("a")])  # must not raise
    s.put([d("b")])  # disarmed: pending, still no raise
    with pytest.raises(PushFailed) as info:
        await asyncio.wait_for(waiter, 1)
    assert isinstance(info.value.__cause__, ValueError)
    assert not s.finished  # the route aborts the engine request
    assert not s.arm(Sink())


# -- the vLLM collector hook --------------------------------------------------------


class Completion:
    """vllm.outputs.CompletionOutput, the fields the adapter reads."""

    def __init__(self, index: int, text: str, token_ids: list[int], finish_reason: str | None = None) -> None:
        self.index = index
        self.text = text
        self.token_ids = token_ids
        self.finish_reason = finish_reason
        self.logprobs = None


class ROut:
    """vllm.outputs.RequestOutput: `add` as vLLM 0.32 merges in DELTA mode."""

    def __init__(self, outputs: list[Completion], finished: bool = False, prompt: int = 3, cached: int = 0) -> None:
        self.outputs = outputs
        self.finished = finished
        self.prompt_token_ids = list(range(prompt))
        self.num_cached_tokens = cached

    def add(self, next_output: ROut, aggregate: bool) -> None:
        self.finished |= next_output.finished
        for nxt in next_output.outputs:
            for i, comp in enumerate(self.outputs):
                if comp.index == nxt.index:
                    if aggregate:
                        comp.text += nxt.text
                        comp.token_ids = [*comp.token_ids, *nxt.token_ids]
                        comp.finish_reason = nxt.finish_reason
                    else:
                        self.outputs[i] = nxt
                    break
            else:
                self.outputs.append(nxt)


class Collector:
    """vllm.v1.engine.output_processor.RequestOutputCollector (DELTA), as in 0.32."""

    def __init__(self) -> None:
        self.aggregate = True
        self.output: Any = None
        self.ready = asyncio.Event()

    def put(self, output: Any) -> None:
        if self.output is None or isinstance(output, Exception):
            self.output = output
            self.ready.set()
        elif isinstance(self.output, ROut) and isinstance(output, ROut):
            self.output.add(output, aggregate=self.aggregate)

    def get_nowait(self) -> Any:
        output = self.output
        if output is not None:
            self.output = None
            self.ready.clear()
        if isinstance(output, Exception):
            raise output
        return output


def tok(text: str, index: int = 0, finish: str | None = None, finished: bool = False) -> ROut:
    return ROut([Completion(index, text, [len(text)], finish)], finished=finished)


def texts(deltas: list[Delta]) -> list[str]:
    return [x.text for x in deltas]  # type: ignore[misc]


async def test_vllm_not_armed_merges_in_the_collector_as_before():
    c = Collector()
    s = VllmOutputStream(c)
    c.put(tok("a"))
    c.put(tok("b"))
    c.put(tok("x", index=1))
    got = s.get_nowait()
    assert texts(got) == ["ab", "x"]
    assert got[0].num_tokens == 2
    assert s.get_nowait() is None


async def test_vllm_armed_put_is_converted_and_pushed_in_the_producers_call():
    c = Collector()
    s = VllmOutputStream(c)
    sink = Sink()
    assert s.arm(sink)
    c.put(tok("a"))  # what vLLM's output handler calls: req_state.queue.put(request_output)
    c.put(tok("b"))
    assert [texts(step) for step in sink.got] == [["a"], ["b"]]
    assert c.output is None and not c.ready.is_set()  # the consumer is not woken per step
    assert s.prompt_tokens == 3
    assert s.get_nowait() is None


async def test_vllm_pushed_final_output_wakes_the_consumer_to_end():
    c = Collector()
    s = VllmOutputStream(c)
    sink = Sink()
    s.arm(sink)
    waiter = asyncio.ensure_future(s.get())
    await asyncio.sleep(0)
    c.put(tok("a"))
    assert not waiter.done()
    c.put(tok("", finish="stop", finished=True))
    with pytest.raises(StopAsyncIteration):
        await asyncio.wait_for(waiter, 1)
    assert s.finished
    assert texts(sink.got[-1]) == [""] and sink.got[-1][0].finish_reason == "stop"


async def test_vllm_exception_put_goes_to_the_collector_and_fails_the_stream():
    c = Collector()
    s = VllmOutputStream(c)
    sink = Sink()
    s.arm(sink)
    waiter = asyncio.ensure_future(s.get())
    await asyncio.sleep(0)
    c.put(RuntimeError("EngineDeadError"))  # propagate_error
    with pytest.raises(EngineFailure):
        await asyncio.wait_for(waiter, 1)
    assert sink.got == []


async def test_vllm_refused_step_is_held_and_later_steps_merge_in_the_collector():
    c = Collector()
    s = VllmOutputStream(c)
    sink = Sink(accept=False)
    s.arm(sink)
    waiter = asyncio.ensure_future(s.get())
    await asyncio.sleep(0)
    c.put(tok("a"))  # refused: held, consumer woken
    c.put(tok("b"))  # disarmed: vLLM's own put
    c.put(tok("c"))  # merged by the collector
    assert texts(await asyncio.wait_for(waiter, 1)) == ["a"]
    assert texts(s.get_nowait()) == ["bc"]
    assert s.get_nowait() is None
    assert not c.ready.is_set()  # no stale wake-up: the next get() sleeps
    sink.accept = True
    assert s.arm(sink)
    c.put(tok("d"))
    assert texts(sink.got[0]) == ["d"]


async def test_vllm_refused_final_output_is_delivered_before_the_end():
    c = Collector()
    s = VllmOutputStream(c)
    s.arm(Sink(accept=False))
    c.put(tok("z", finish="length", finished=True))
    got = s.get_nowait()
    assert texts(got) == ["z"] and got[0].finish_reason == "length"
    with pytest.raises(StopAsyncIteration):
        s.get_nowait()


async def test_vllm_sink_exception_stays_out_of_the_output_handler():
    c = Collector()
    s = VllmOutputStream(c)
    s.arm(Sink(boom=KeyError("frame")))
    waiter = asyncio.ensure_future(s.get())
    await asyncio.sleep(0)
    c.put(tok("a"))  # must not raise into vLLM's loop
    c.put(tok("b"))
    with pytest.raises(PushFailed):
        await asyncio.wait_for(waiter, 1)
    assert not s.finished  # so the route aborts the request


async def test_vllm_disarmed_stream_uses_the_collectors_own_put():
    c = Collector()
    s = VllmOutputStream(c)
    sink = Sink()
    s.arm(sink)
    s.disarm()
    c.put(tok("a"))
    c.put(tok("b"))
    assert sink.got == []
    assert texts(s.get_nowait()) == ["ab"]


async def test_vllm_n2_children_push_separately():
    c = Collector()
    s = VllmOutputStream(c)
    sink = Sink()
    s.arm(sink)
    c.put(tok("a", index=0))
    c.put(tok("x", index=1))
    assert [(step[0].index, step[0].text) for step in sink.got] == [(0, "a"), (1, "x")]


async def test_vllm_wait_returns_at_the_deadline_or_on_output_and_takes_nothing():
    c = Collector()
    s = VllmOutputStream(c)
    loop = asyncio.get_running_loop()
    start = loop.time()
    await s.wait(0.05)  # nothing comes: back at the deadline
    assert loop.time() - start >= 0.04
    loop.call_later(0.01, c.put, tok("a"))
    start = loop.time()
    await s.wait(5.0)  # woken by the output, long before the deadline
    assert loop.time() - start < 1.0
    assert texts(s.get_nowait()) == ["a"]  # still there for the taker
    c.put(tok("z", finished=True))
    assert texts(s.get_nowait()) == ["z"]
    await asyncio.wait_for(s.wait(5.0), 1.0)  # ended: returns at once
