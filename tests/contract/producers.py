"""The engine side of each OutputStream implementation, driven the same way.

The contract suite (test_output_stream.py) talks to a `Producer`: `step()`
is one engine step, `finish()` the request's last output (a step carrying
a finish reason, then the end), `fail()` the engine failing the request.
Each implementation is fed the way its engine feeds it:

- `BaseProducer`: `engine_adapter.base.DeltaQueue`, as the fake engine and
  vLLM's direct route use it (`put(deltas)`, `close()`, `close(error)`).
- `VllmProducer`: the `DeltaQueue` vLLM's own output path fills
  (`engine_adapter.vllm_stream.into_queue` over a `RequestOutputCollector`),
  as vLLM's output handler feeds it
  (`collector.put(RequestOutput)`, the last one `finished`;
  `collector.put(exception)` from `propagate_error`). Two flavours:
  `vllm`, vLLM's own classes (importing vLLM takes 10-15 s, so that one runs
  with the engine tests), and `vllm-standin`, the stand-in below with the
  shape and semantics of vLLM 0.32's classes, for the fast suite. The suite
  run on both is what keeps the stand-in honest.
"""

from __future__ import annotations

import asyncio
from functools import cache
from typing import Any

from engine_adapter.base import Delta, DeltaQueue, EngineFailure
from engine_adapter.vllm_stream import into_queue

Piece = str | tuple[int, str]  # text of choice 0, or (choice index, text)


def _pieces(pieces: tuple[Piece, ...]) -> list[tuple[int, str]]:
    return [p if isinstance(p, tuple) else (0, p) for p in pieces]


class BaseProducer:
    name = "base"

    def __init__(self) -> None:
        self.stream = DeltaQueue()

    def step(self, *pieces: Piece) -> None:
        self.stream.put([Delta(i, text, 1, None, [len(text)]) for i, text in _pieces(pieces)])

    def finish(self, text: str = "", reason: str = "stop") -> None:
        self.stream.put([Delta(0, text, 1, reason, [len(text)])])
        self.stream.close()

    def fail(self, message: str) -> None:
        self.stream.close(EngineFailure(message))


# -- vLLM ------------------------------------------------------------------------------


class StandinCompletion:
    """vllm.outputs.CompletionOutput: the fields the adapter reads."""

    def __init__(self, index: int, text: str, token_ids: list[int], finish_reason: str | None = None) -> None:
        self.index = index
        self.text = text
        self.token_ids = token_ids
        self.finish_reason = finish_reason
        self.logprobs = None


class StandinLogprob:
    """vllm.logprobs.Logprob."""

    def __init__(self, logprob: float, rank: int | None = None, decoded_token: str | None = None) -> None:
        self.logprob = logprob
        self.rank = rank
        self.decoded_token = decoded_token


class StandinRequestOutput:
    """vllm.outputs.RequestOutput: `add` merges as vLLM 0.32 does in DELTA mode."""

    def __init__(
        self,
        outputs: list[StandinCompletion],
        finished: bool,
        prompt_token_ids: list[int],
        num_cached_tokens: int,
        prompt_logprobs: list[Any] | None = None,
    ) -> None:
        self.outputs = outputs
        self.finished = finished
        self.prompt_token_ids = prompt_token_ids
        self.num_cached_tokens = num_cached_tokens
        self.prompt_logprobs = prompt_logprobs

    def add(self, next_output: StandinRequestOutput, aggregate: bool) -> None:
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


class StandinCollector:
    """vllm.v1.engine.output_processor.RequestOutputCollector (DELTA), as in 0.32."""

    def __init__(self) -> None:
        self.aggregate = True
        self.output: Any = None
        self.ready = asyncio.Event()

    def put(self, output: Any) -> None:
        if self.output is None or isinstance(output, Exception):
            self.output = output
            self.ready.set()
        elif isinstance(self.output, StandinRequestOutput) and isinstance(output, StandinRequestOutput):
            self.output.add(output, aggregate=self.aggregate)

    def get_nowait(self) -> Any:
        output = self.output
        if output is not None:
            self.output = None
            self.ready.clear()
        if isinstance(output, Exception):
            raise output
        return output


def token_bytes(token_id: int) -> bytes:
    """A stand-in `TokenBytes`: token i is `t<i>`."""
    return b"t%d" % token_id


@cache
def vllm_classes() -> tuple[Any, Any, Any, Any]:
    """vLLM's own (RequestOutputCollector, RequestOutput, CompletionOutput, RequestOutputKind)."""
    from vllm.outputs import CompletionOutput, RequestOutput
    from vllm.sampling_params import RequestOutputKind
    from vllm.v1.engine.output_processor import RequestOutputCollector

    return RequestOutputCollector, RequestOutput, CompletionOutput, RequestOutputKind


class VllmProducer:
    """What vLLM's output handler does to a request's collector."""

    PROMPT = [1, 2, 3]
    CACHED = 1

    def __init__(self, real: bool, prompt_logprobs: int | None = None) -> None:
        """`prompt_logprobs`: the request asked for that many per prompt token; the first output carries
        them (`prompt_logprobs_of`), as vLLM's does."""
        self.name = "vllm" if real else "vllm-standin"
        self.real = real
        self.collector = self.new_collector()
        self.stream = into_queue(self.collector, None, None if prompt_logprobs is None else (token_bytes, prompt_logprobs))
        self.prompt_logprobs = prompt_logprobs
        self.outputs = 0

    def new_collector(self) -> Any:
        """A collector as `AsyncLLM.add_request` returns it (vLLM's own, or the stand-in)."""
        if self.real:
            collector_cls, _, _, kind = vllm_classes()
            return collector_cls(kind.DELTA, "r")
        return StandinCollector()

    def prompt_logprobs_of(self) -> list[Any]:
        """vLLM's prompt logprobs of PROMPT: none for the first token; then the own token and the top 2."""
        if self.real:
            from vllm.logprobs import Logprob
        else:
            Logprob = StandinLogprob  # noqa: N806
        return [
            None,
            {2: Logprob(-0.5, 1, "t2"), 7: Logprob(-2.0, 2, "t7")},  # the prompt's token is the most likely
            {3: Logprob(-3.0, 4, "t3"), 9: Logprob(-0.25, 1, "t9"), 8: Logprob(-1.0, 2, "t8")},  # it is 4th
        ]

    def output(self, pieces: list[tuple[int, str]], finish: str | None = None, finished: bool = False) -> Any:
        first = self.outputs == 0
        self.outputs += 1
        prompt_logprobs = self.prompt_logprobs_of() if first and self.prompt_logprobs is not None else None
        if self.real:
            _, request_output, completion, _ = vllm_classes()
            outputs = [
                completion(index=i, text=text, token_ids=[len(text)], cumulative_logprob=None, logprobs=None, finish_reason=finish)
                for i, text in pieces
            ]
            return request_output("r", None, list(self.PROMPT), prompt_logprobs, outputs, finished, num_cached_tokens=self.CACHED)
        outputs = [StandinCompletion(i, text, [len(text)], finish) for i, text in pieces]
        return StandinRequestOutput(outputs, finished, list(self.PROMPT), self.CACHED, prompt_logprobs)

    def step(self, *pieces: Piece) -> None:
        self.collector.put(self.output(_pieces(pieces)))

    def finish(self, text: str = "", reason: str = "stop") -> None:
        self.collector.put(self.output([(0, text)], reason, finished=True))

    def fail(self, message: str) -> None:
        self.collector.put(RuntimeError(message))  # EngineDeadError / EngineGenerateError in vLLM
