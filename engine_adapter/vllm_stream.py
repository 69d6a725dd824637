"""vLLM's per-request `RequestOutputCollector` behind the `base.OutputStream` protocol.

vLLM's collector already merges outputs when the consumer is behind;
`VllmOutputStream` wraps it into the contract's `get_nowait()/get()/wait()`
and turns each `RequestOutput` into `Delta`s. No task per request: the
consumer awaits the collector's event directly, and while the client keeps
up it is not woken at all: vLLM's output handler hands each step to the
writer's sink through a hook on the collector's `put` (push). With logprobs,
vLLM's per-position `{token_id: Logprob}` dicts become engine-neutral
`TokenLogprob`s whose bytes come from the vocabulary (`TokenBytes`), exact
even for half a character; the same for the prompt's logprobs
(`RequestOutput.prompt_logprobs`, all of them on the request's first
output), kept on the stream as `prompt_logprobs` before that output's
Deltas are handed out.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from .base import Delta, PushFailed, Sink, TokenLogprob, token_text
from .token_bytes import TokenBytes
from .vllm_compat import engine_exception


class VllmOutputStream:
    """vLLM's `RequestOutputCollector` behind the contract's `get_nowait()/get()`, plus push.

    Pull: the collector merges outputs while the consumer is behind; each
    `get_nowait` takes what it holds and converts it to `Delta`s.

    Push (`arm(sink)`): the collector's `put` is replaced on the instance (vLLM's
    output handler calls `req_state.queue.put(request_output)` from its task
    in this loop, and `put(exc)` for `propagate_error`). While armed and the
    collector holds nothing, a `RequestOutput` is converted and handed to the
    sink right there, in vLLM's output step. Anything else goes to vLLM's own
    `put`: an exception, an output while one is pending (merged as before),
    any output while disarmed. When the sink refuses, its converted Deltas are
    kept (`_held`, taken before the collector's) and the consumer is woken;
    when it raises, or converting raises, the error is kept for the consumer
    (`PushFailed`) and nothing reaches vLLM's loop. The last output of the
    request (`finished`) wakes the consumer to end the stream.
    """

    __slots__ = (
        "_collector", "_done", "prompt_tokens", "cached_tokens", "prompt_logprobs", "_logprobs", "_prompt_logprobs", "_sink", "_held",
        "_sink_error", "_error",
    )

    def __init__(self, collector: Any, logprobs: Any = None, prompt_logprobs: Any = None) -> None:
        self._collector = collector
        self._done = False
        self.prompt_tokens = 0
        self.cached_tokens = 0
        self.prompt_logprobs: list[TokenLogprob] | None = None
        # (TokenBytes, top-k) when the request asked for logprobs; the same for prompt logprobs.
        self._logprobs = logprobs
        self._prompt_logprobs = prompt_logprobs
        self._sink: Sink | None = None
        self._held: list[Delta] = []
        self._sink_error: BaseException | None = None
        self._error: Exception | None = None  # raised on every take once the engine failed
        self._hook()

    @property
    def finished(self) -> bool:
        return self._done

    # -- push -----------------------------------------------------------
    def arm(self, sink: Sink) -> bool:
        if self._held or self._done or self._sink_error is not None or self._collector.output is not None:
            return False
        self._sink = sink
        return True

    def disarm(self) -> None:
        self._sink = None

    def _hook(self) -> None:
        collector = self._collector
        original = collector.put  # vLLM's own (bound) put
        stream = self

        def put(output: Any) -> None:
            if isinstance(output, BaseException):
                stream._keep_pending()  # vLLM's put would replace it with the error
                original(output)
            elif stream._sink is None or collector.output is not None:
                original(output)
            else:
                stream._push(output)

        collector.put = put

    def _keep_pending(self) -> None:
        """An error arrives: the steps the consumer has not taken yet still go first."""
        pending = self._collector.output
        if pending is None or isinstance(pending, BaseException):
            return
        self._collector.output = None
        try:
            self._held = self._held + self._convert(pending)
        except Exception:  # never into vLLM's output handler: the error says enough
            pass

    def _push(self, output: Any) -> None:
        sink = self._sink
        assert sink is not None
        try:
            deltas = self._convert(output)
            if sink(deltas):
                if self._done:  # the request's last output: wake the consumer to end the stream
                    self._sink = None
                    self._collector.ready.set()
                return
        except Exception as exc:  # never into vLLM's output handler
            self._sink = None
            self._sink_error = exc
            self._collector.ready.set()
            return
        self._sink = None  # the consumer takes over (and pulls)
        self._held = deltas
        self._collector.ready.set()

    # -- pull -----------------------------------------------------------
    def get_nowait(self) -> list[Delta] | None:
        held = self._held
        if held:  # what the sink refused comes first; the collector's on the next call
            self._held = []
            return held
        if self._sink_error is not None:
            raise PushFailed(repr(self._sink_error)) from self._sink_error
        if self._error is not None:
            raise self._error
        if self._done:
            raise StopAsyncIteration
        got = self._take()
        if got is None:
            self._collector.ready.clear()  # nothing to take: a wake-up of ours is used up
        return got

    def _take(self) -> list[Delta] | None:
        try:
            out = self._collector.get_nowait()
        except Exception as exc:  # EngineDeadError, EngineGenerateError, a request's own error (0.33), ...
            self._done = True
            self._error = engine_exception(exc)
            raise self._error from exc
        if out is None:
            return None
        return self._convert(out)

    def _convert(self, out: Any) -> list[Delta]:
        if out.prompt_token_ids is not None:
            self.prompt_tokens = len(out.prompt_token_ids)
        self.cached_tokens = out.num_cached_tokens or 0
        if self._prompt_logprobs is not None and self.prompt_logprobs is None and getattr(out, "prompt_logprobs", None):
            token_bytes, top = self._prompt_logprobs
            self.prompt_logprobs = prompt_logprobs(out.prompt_token_ids, out.prompt_logprobs, token_bytes, top)
        if self._logprobs is None:
            deltas = [Delta(o.index, o.text, len(o.token_ids), o.finish_reason, o.token_ids) for o in out.outputs]
        else:
            token_bytes, top = self._logprobs
            deltas = [
                Delta(o.index, o.text, len(o.token_ids), o.finish_reason, o.token_ids, _logprobs(o.token_ids, o.logprobs, token_bytes, top))
                for o in out.outputs
            ]
        if out.finished:
            self._done = True
        return deltas

    async def get(self) -> list[Delta]:
        while True:
            got = self.get_nowait()
            if got is not None:
                return got
            await self._collector.ready.wait()

    async def wait(self, timeout: float) -> None:
        """Until there is something to take (or the end, or a sink error), at most `timeout` s; takes nothing."""
        if self._held or self._done or self._sink_error is not None:
            return
        try:
            async with asyncio.timeout(timeout):
                await self._collector.ready.wait()
        except TimeoutError:
            pass

    def __aiter__(self) -> VllmOutputStream:
        return self

    async def __anext__(self) -> list[Delta]:
        got = await self.get()
        return got


def _logprobs(token_ids: Sequence[int], positions: Any, token_bytes: TokenBytes, top: int) -> list[TokenLogprob] | None:
    """vLLM's per-position {token_id: Logprob} -> engine-neutral TokenLogprobs.

    vLLM puts the sampled token first (with its rank) and then the top-k by
    rank; bytes come from the vocabulary (`TokenBytes`), not from the decoded
    text, so a token that is half a character keeps its real bytes.
    """
    if positions is None:
        return None
    out: list[TokenLogprob] = []
    for token_id, ranked in zip(token_ids, positions):
        ranked = ranked or {}
        sampled = ranked.get(token_id)
        data = token_bytes(token_id)
        best = sorted((lp.rank, tid, lp.logprob) for tid, lp in ranked.items() if lp.rank is not None and lp.rank <= top)
        alternatives = []
        for _, tid, value in best[:top]:
            alt = token_bytes(tid)
            alternatives.append(TokenLogprob(tid, token_text(alt), alt, value))
        value = sampled.logprob if sampled is not None else float("-inf")
        out.append(TokenLogprob(token_id, token_text(data), data, value, alternatives))
    return out


def prompt_logprobs(prompt_ids: Sequence[int], positions: Any, token_bytes: TokenBytes, top: int) -> list[TokenLogprob]:
    """vLLM's prompt logprobs (None for the first position, then {token_id: Logprob}) -> TokenLogprobs.

    Each position's dict holds the prompt's own token (with its rank) and the
    top-k by rank (`top` -1: all it holds); the own token keeps its rank.
    """
    out: list[TokenLogprob] = []
    for token_id, ranked in zip(prompt_ids, positions):
        data = token_bytes(token_id)
        if not ranked:
            out.append(TokenLogprob(token_id, token_text(data), data, None))
            continue
        own = ranked.get(token_id)
        best = sorted((lp.rank, tid, lp.logprob) for tid, lp in ranked.items() if lp.rank is not None and (top < 0 or lp.rank <= top))
        alternatives = []
        for rank, tid, value in best if top < 0 else best[:top]:
            alt = token_bytes(tid)
            alternatives.append(TokenLogprob(tid, token_text(alt), alt, value, rank=rank))
        value = own.logprob if own is not None else float("-inf")
        out.append(TokenLogprob(token_id, token_text(data), data, value, alternatives, own.rank if own is not None else None))
    return out
