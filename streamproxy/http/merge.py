"""One `OutputStream` over several: a batched completions request's engine requests.

As vLLM, one engine request per prompt, merged: each part is a stream, its choice offset (prompt x n)
and an optional Delta transform (`core.echo.Echo`); steps go out in engine order. The merge is a
`DeltaQueue` fed by one task per part, which arms its part with a sink forwarding each step straight
in, so a push still goes from the engine's step to the socket; the task wakes only when its part ends
or the sink is refused. It ends when every part has, or with the first error; token counts are sums.
`close()` cancels the tasks; aborting the engine requests is `generation.Work.end`'s.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from engine_adapter.base import Delta, DeltaQueue, OutputStream, Sink, TokenLogprob

# A part's Deltas, and its prompt's logprobs -> the Deltas to merge.
Transform = Callable[[Sequence[Delta], list[TokenLogprob] | None], list[Delta]]

# How long a part's task sleeps on its armed stream before it looks again (it is woken at the end).
_IDLE = 3600.0


class Part:
    __slots__ = ("stream", "offset", "transform")

    def __init__(self, stream: OutputStream, offset: int, transform: Transform | None = None) -> None:
        self.stream = stream
        self.offset = offset
        self.transform = transform


class MergedStream:
    """An `OutputStream` of several parts' Deltas, their choices re-indexed."""

    __slots__ = ("_parts", "_queue", "_left", "_tasks", "prompt_tokens", "cached_tokens", "prompt_logprobs")

    def __init__(self, parts: list[Part]) -> None:
        self._parts = parts
        self._queue = DeltaQueue()
        self._left = len(parts)
        self.prompt_tokens = 0
        self.cached_tokens = 0
        self._count()
        self.prompt_logprobs: list[TokenLogprob] | None = None  # per part: `Part.stream.prompt_logprobs`
        self._tasks = [asyncio.ensure_future(self._pump(part)) for part in parts]
        if not parts:
            self._queue.close()

    def close(self) -> None:
        """Stop forwarding (the parts' engine requests are the caller's to abort)."""
        for task in self._tasks:
            if not task.done():
                task.cancel()

    # -- the producer side: one task per part ---------------------------------
    def _put(self, part: Part, deltas: Sequence[Delta]) -> None:
        if part.transform is not None:
            deltas = part.transform(deltas, part.stream.prompt_logprobs)
        offset = part.offset
        if offset:
            deltas = [Delta(d.index + offset, d.text, d.num_tokens, d.finish_reason, d.token_ids, d.logprobs) for d in deltas]
        if deltas:
            self._queue.put(deltas if isinstance(deltas, list) else list(deltas))

    def _count(self) -> None:
        """The parts' sums: at the start (engines count the prompt at submission) and as each part ends."""
        self.prompt_tokens = sum(p.stream.prompt_tokens for p in self._parts)
        self.cached_tokens = sum(p.stream.cached_tokens for p in self._parts)

    async def _pump(self, part: Part) -> None:
        stream = part.stream

        def forward(deltas: list[Delta]) -> bool:
            self._put(part, deltas)
            return True

        try:
            while True:
                got = stream.get_nowait()
                if got is not None:
                    self._put(part, got)
                    continue
                armed = stream.arm(forward)
                try:
                    await stream.wait(_IDLE)  # returns at once if something is pending after all
                finally:
                    if armed:
                        stream.disarm()
        except StopAsyncIteration:
            self._count()
            self._left -= 1
            if self._left == 0:
                self._queue.close()
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # the engine failed this part: the whole answer fails
            self._count()
            self._queue.close(exc)

    # -- the consumer side: the queue's ----------------------------------------
    @property
    def finished(self) -> bool:
        return self._queue.finished

    def arm(self, sink: Sink) -> bool:
        return self._queue.arm(sink)

    def disarm(self) -> None:
        self._queue.disarm()

    def get_nowait(self) -> list[Delta] | None:
        return self._queue.get_nowait()

    async def get(self) -> list[Delta]:
        return await self._queue.get()

    async def wait(self, timeout: float) -> None:
        await self._queue.wait(timeout)

    def __aiter__(self) -> MergedStream:
        return self

    async def __anext__(self) -> list[Delta]:
        return await self._queue.get()
