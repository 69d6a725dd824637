"""streamproxy.http.merge.MergedStream: one OutputStream over a batch's engine requests.

Not on the OutputStream contract suite: the merge relays its parts through
one task each, so a step reaches it only once that task has run (`settle`),
where the suite's engines hand steps over synchronously. Its parts here are
the base stream and the vLLM stand-in (tests/contract/producers.py).
"""

from __future__ import annotations

import asyncio

import pytest

from engine_adapter.base import Delta, DeltaQueue, EngineFailure
from streamproxy.core.echo import Echo
from streamproxy.http.merge import MergedStream, Part
from tests.contract.producers import BaseProducer, VllmProducer
from tests.support.push import keep

SOON = 10.0


async def settle() -> None:
    for _ in range(10):
        await asyncio.sleep(0)


def seen(deltas: list[Delta]) -> list[tuple[int, str, str | None]]:
    return [(d.index, d.text, d.finish_reason) for d in deltas]  # type: ignore[misc]


async def take_all(stream: MergedStream) -> list[Delta]:
    out: list[Delta] = []

    async def go() -> None:
        async for step in stream:
            out.extend(step)

    await asyncio.wait_for(go(), SOON)
    return out


async def test_parts_choices_are_reindexed_and_interleave_in_the_order_made():
    a, b = BaseProducer(), VllmProducer(real=False)
    merged = MergedStream([Part(a.stream, 0), Part(b.stream, 2)])
    await settle()
    a.step("a1")
    b.step("b1", (1, "c1"))
    a.finish("a2", "length")
    b.finish("b2")
    await settle()
    assert seen(await take_all(merged)) == [
        (0, "a1", None), (2, "b1", None), (3, "c1", None), (0, "a2", "length"), (2, "b2", "stop"),
    ]
    assert merged.finished
    assert merged.prompt_tokens == len(VllmProducer.PROMPT) and merged.cached_tokens == VllmProducer.CACHED


async def test_an_armed_merge_gets_each_step_in_the_engines_own_call():
    a, b = BaseProducer(), VllmProducer(real=False)
    merged = MergedStream([Part(a.stream, 0), Part(b.stream, 1)])
    await settle()  # the parts' tasks have armed them
    got: list[list[Delta]] = []
    assert merged.arm(keep(got))
    a.step("x")
    b.step("y")
    assert [seen(step) for step in got] == [[(0, "x", None)], [(1, "y", None)]]  # no task ran in between
    merged.close()


async def test_the_merge_ends_only_when_every_part_has_ended():
    a, b = BaseProducer(), BaseProducer()
    merged = MergedStream([Part(a.stream, 0), Part(b.stream, 1)])
    a.finish()
    await settle()
    assert merged.get_nowait() is not None
    assert merged.get_nowait() is None and not merged.finished
    b.finish()
    await settle()
    assert seen(merged.get_nowait() or []) == [(1, "", "stop")]
    with pytest.raises(StopAsyncIteration):
        merged.get_nowait()


async def test_a_part_that_fails_fails_the_merge_after_what_came_before():
    a, b = BaseProducer(), BaseProducer()
    merged = MergedStream([Part(a.stream, 0), Part(b.stream, 1)])
    a.step("ok")
    b.fail("engine died")
    await settle()
    assert seen(merged.get_nowait() or []) == [(0, "ok", None)]
    with pytest.raises(EngineFailure, match="engine died"):
        await asyncio.wait_for(merged.get(), SOON)


async def test_a_transform_sees_the_parts_own_indexes_and_its_prompt_logprobs():
    a, b = BaseProducer(), BaseProducer()
    merged = MergedStream([Part(a.stream, 0, Echo("P0:", 1)), Part(b.stream, 1, Echo("P1:", 1))])
    a.finish("x")
    b.finish("y")
    await settle()
    assert seen(await take_all(merged)) == [(0, "P0:x", "stop"), (1, "P1:y", "stop")]


async def test_wait_wakes_on_a_parts_step_for_the_heartbeat_deadline():
    a = BaseProducer()
    merged = MergedStream([Part(a.stream, 0)])
    asyncio.get_running_loop().call_later(0.01, a.step, "late")
    await asyncio.wait_for(merged.wait(3600), SOON)
    assert seen(merged.get_nowait() or []) == [(0, "late", None)]
    merged.close()


async def test_close_stops_the_relay_and_leaves_the_parts_to_the_caller():
    a = BaseProducer()
    merged = MergedStream([Part(a.stream, 0)])
    await settle()
    merged.close()
    await settle()
    a.step("after")
    await settle()
    assert merged.get_nowait() is None
    assert not a.stream.finished  # aborting the engine request is the caller's


async def test_no_parts_is_an_ended_stream():
    merged = MergedStream([])
    with pytest.raises(StopAsyncIteration):
        merged.get_nowait()


async def test_prompt_tokens_are_summed_from_the_start():
    a, b = DeltaQueue(), DeltaQueue()
    a.prompt_tokens, b.prompt_tokens = 3, 4
    merged = MergedStream([Part(a, 0), Part(b, 1)])
    assert merged.prompt_tokens == 7
    merged.close()
