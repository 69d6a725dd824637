"""Non-streaming counterpart of `stream.py`: gather each choice's whole answer.

Sans-IO like the stream encoders: `step(deltas)` per engine step, then read
`texts`, `finish_reasons`, token counts. Text goes through the same UTF-8
carry, so a character split across steps is whole in the answer.
"""

from __future__ import annotations

from collections.abc import Sequence

from engine_adapter.base import Delta

from .utf8 import Utf8Carry


class Accumulator:
    __slots__ = ("_parts", "_carries", "tokens", "finish_reasons", "prompt_tokens", "cached_tokens")

    def __init__(self, n: int) -> None:
        self._parts: list[list[str]] = [[] for _ in range(n)]
        self._carries = [Utf8Carry() for _ in range(n)]
        self.tokens = [0] * n
        self.finish_reasons: list[str | None] = [None] * n
        self.prompt_tokens = 0
        self.cached_tokens = 0

    def step(self, deltas: Sequence[Delta]) -> None:
        for d in deltas:
            i = d.index
            text = self._carries[i].feed(d.text)
            if text:
                self._parts[i].append(text)
            self.tokens[i] += d.num_tokens
            if d.finish_reason is not None:
                tail = self._carries[i].flush()
                if tail:
                    self._parts[i].append(tail)
                self.finish_reasons[i] = d.finish_reason

    def text(self, index: int) -> str:
        return "".join(self._parts[index])

    @property
    def completion_tokens(self) -> int:
        return sum(self.tokens)
