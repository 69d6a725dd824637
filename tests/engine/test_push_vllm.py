"""The push hook on vLLM's own `RequestOutputCollector` and `RequestOutput` (no engine started).

tests/unit/test_push_streams.py runs the same cases on a stand-in; these
prove the stand-in matches the installed vLLM: the hook replaces `put` on the
instance, pushes a RequestOutput while armed and nothing is pending, leaves
exceptions and pending outputs to vLLM's own `put` (which merges DELTA
outputs with `RequestOutput.add(aggregate=True)`).
"""

from __future__ import annotations

import asyncio

import pytest

from engine_adapter.base import Delta, EngineFailure, PushFailed
from engine_adapter.vllm_stream import VllmOutputStream

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def vllm_classes():
    from vllm.outputs import CompletionOutput, RequestOutput
    from vllm.sampling_params import RequestOutputKind
    from vllm.v1.engine.output_processor import RequestOutputCollector

    return RequestOutputCollector, RequestOutput, CompletionOutput, RequestOutputKind


def _out(classes, text: str, index: int = 0, finish: str | None = None, finished: bool = False):
    _, RequestOutput, CompletionOutput, _ = classes
    comp = CompletionOutput(index=index, text=text, token_ids=[len(text)], cumulative_logprob=None, logprobs=None, finish_reason=finish)
    return RequestOutput("r", None, [1, 2, 3], None, [comp], finished, num_cached_tokens=1)


class Sink:
    def __init__(self, accept: bool = True, boom: BaseException | None = None) -> None:
        self.accept, self.boom, self.got = accept, boom, []

    def __call__(self, deltas: list[Delta]) -> bool:
        if self.boom is not None:
            raise self.boom
        if self.accept:
            self.got.append([d.text for d in deltas])
        return self.accept


async def test_real_collector_push_fallback_merge_and_errors(vllm_classes):
    Collector, _, _, Kind = vllm_classes
    c = Collector(Kind.DELTA, "r")
    s = VllmOutputStream(c)
    # Not armed: vLLM merges.
    c.put(_out(vllm_classes, "a"))
    c.put(_out(vllm_classes, "b"))
    assert [d.text for d in s.get_nowait()] == ["ab"]
    assert s.prompt_tokens == 3 and s.cached_tokens == 1
    # Armed: pushed in the producer's call, the consumer not woken.
    sink = Sink()
    assert s.arm(sink)
    c.put(_out(vllm_classes, "c"))
    assert sink.got == [["c"]] and c.output is None and not c.ready.is_set()
    # Refused: held, the rest merged by vLLM, in order.
    sink.accept = False
    c.put(_out(vllm_classes, "d"))
    c.put(_out(vllm_classes, "e"))
    c.put(_out(vllm_classes, "f"))
    assert [d.text for d in await asyncio.wait_for(s.get(), 1)] == ["d"]
    assert [d.text for d in s.get_nowait()] == ["ef"]
    # The engine's error goes to the collector as before.
    c.put(RuntimeError("engine dead"))
    with pytest.raises(EngineFailure):
        s.get_nowait()


async def test_real_collector_finish_and_sink_failure(vllm_classes):
    Collector, _, _, Kind = vllm_classes
    c = Collector(Kind.DELTA, "r")
    s = VllmOutputStream(c)
    sink = Sink()
    s.arm(sink)
    c.put(_out(vllm_classes, "a"))
    c.put(_out(vllm_classes, "", finish="stop", finished=True))
    with pytest.raises(StopAsyncIteration):
        await asyncio.wait_for(s.get(), 1)
    assert s.finished and sink.got == [["a"], [""]]

    c2 = Collector(Kind.DELTA, "r2")
    s2 = VllmOutputStream(c2)
    s2.arm(Sink(boom=ValueError("x")))
    c2.put(_out(vllm_classes, "a"))  # must not raise into vLLM's output handler
    with pytest.raises(PushFailed):
        s2.get_nowait()
    assert not s2.finished
