"""Non-streaming counterpart of `stream.py`: gather each choice's whole answer.

Sans-IO: `step(deltas)` per engine step, then `text(i)`, `reasoning(i)`, `tool_calls(i)`, `logprobs(i)`,
`finish_reasons` and the token counts. The same UTF-8 carry and `Pipeline` as the stream, so a
non-stream answer is what the stream reassembles to. `Accumulator` is what `nonstream.collect` and
`generation.run` need; `ChoiceAccumulator` (chat, completions) and `BlockEncoder(emit=False)`
(Responses, Anthropic) implement it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from engine_adapter.base import Delta, TokenLogprob
from streamproxy.core.utf8 import Utf8Carry
from streamproxy.filters.base import CONTENT, REASONING, TOOL_CALL, FilterFactory, Part, Pipeline


class Accumulator(Protocol):
    """A non-streaming request's answer as it builds up, one engine step at a time.

    `collect` feeds every step to `step` (its return value is ignored) and
    sets `prompt_tokens` / `cached_tokens` at the end; `completion_tokens` and
    `finish_reasons` (one per choice) go to the access log.
    """

    prompt_tokens: int
    cached_tokens: int

    @property
    def completion_tokens(self) -> int: ...

    @property
    def finish_reasons(self) -> Sequence[str | None]: ...

    def step(self, deltas: Sequence[Delta]) -> object: ...


class ChoiceAccumulator:
    """An `Accumulator` per choice: text, reasoning, tool calls, logprobs (chat and completions)."""

    __slots__ = (
        "_parts", "_reasoning", "_carries", "_pipes", "_calls", "_logprobs", "tokens", "finish_reasons", "prompt_tokens", "cached_tokens",
        "ids",
    )

    def __init__(self, n: int, filters: FilterFactory | None = None, logprobs: bool = False, ids: bool = False) -> None:
        self._parts: list[list[str]] = [[] for _ in range(n)]
        self._reasoning: list[list[str]] = [[] for _ in range(n)]
        self._carries = [Utf8Carry() for _ in range(n)]
        self._pipes = [Pipeline(filters()) for _ in range(n)] if filters is not None else None
        # Per choice: [id, name, [argument pieces]] per call, in index order.
        self._calls: list[list[list]] = [[] for _ in range(n)]
        self._logprobs: list[list[TokenLogprob]] | None = [[] for _ in range(n)] if logprobs else None
        self.tokens = [0] * n
        self.ids: list[list[int]] | None = [[] for _ in range(n)] if ids else None  # return_token_ids
        self.finish_reasons: list[str | None] = [None] * n
        self.prompt_tokens = 0
        self.cached_tokens = 0

    def step(self, deltas: Sequence[Delta]) -> None:
        pipes = self._pipes
        for d in deltas:
            i = d.index
            self.tokens[i] += d.num_tokens
            if self.ids is not None and d.token_ids:
                self.ids[i].extend(d.token_ids)
            if self._logprobs is not None and d.logprobs:
                self._logprobs[i].extend(d.logprobs)
            if pipes is not None:
                self._take(i, pipes[i].feed(d.text, d.token_ids))
                if d.finish_reason is not None:
                    parts, reason = pipes[i].finish(d.finish_reason)
                    self._take(i, parts)
                    self.finish_reasons[i] = reason
                continue
            text = self._carries[i].feed(d.text)
            if text:
                self._parts[i].append(text)
            if d.finish_reason is not None:
                tail = self._carries[i].flush()
                if tail:
                    self._parts[i].append(tail)
                self.finish_reasons[i] = d.finish_reason

    def _take(self, i: int, parts: list[Part]) -> None:
        for p in parts:
            if p.kind == CONTENT:
                self._parts[i].append(p.text)
            elif p.kind == REASONING:
                self._reasoning[i].append(p.text)
            elif p.kind == TOOL_CALL:
                self._calls[i].append([p.id, p.name, []])
            else:
                self._calls[i][p.index][2].append(p.text)

    def text(self, index: int) -> str:
        return "".join(self._parts[index])

    def reasoning(self, index: int) -> str | None:
        """The choice's thinking; None when there was none."""
        return "".join(self._reasoning[index]) or None

    @property
    def reasoning_tokens(self) -> int | None:
        if self._pipes is None:
            return None
        counts = [n for pipe in self._pipes if (n := pipe.reasoning_tokens) is not None]
        return sum(counts) if counts else None

    def tool_calls(self, index: int) -> list[tuple[str, str, str]]:
        """(id, name, arguments) of each call of a choice."""
        return [(cid, name, "".join(pieces)) for cid, name, pieces in self._calls[index]]

    def logprobs(self, index: int) -> list[TokenLogprob] | None:
        return None if self._logprobs is None else self._logprobs[index]

    @property
    def completion_tokens(self) -> int:
        return sum(self.tokens)
