"""--enable-log-outputs: the generated text of a request, for its access-log line.

`EncoderTap` (a `StreamEncoder`) and `AccumulatorTap` (an `Accumulator`)
stand in front of a route's own encoder or accumulator, hand everything on
unchanged, and keep each choice's raw engine text on the way (as vLLM logs
it: before reasoning or tool-call parsing). `outputs(limit)` is the text per
choice, each cut to `limit` characters (--max-log-len). Used only when the
flag is on, so the stream path pays nothing otherwise. Sans-IO.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Generic, TypeVar

from engine_adapter.base import Delta
from streamproxy.core.accumulate import Accumulator
from streamproxy.core.stream import StreamEncoder
from streamproxy.errors import APIError

T = TypeVar("T", StreamEncoder, Accumulator)


class _Tap(Generic[T]):
    def __init__(self, inner: T) -> None:
        self.inner: T = inner
        self._texts: dict[int, list[str | bytes]] = {}

    @property
    def prompt_tokens(self) -> int:
        return self.inner.prompt_tokens

    @prompt_tokens.setter
    def prompt_tokens(self, value: int) -> None:
        self.inner.prompt_tokens = value

    @property
    def cached_tokens(self) -> int:
        return self.inner.cached_tokens

    @cached_tokens.setter
    def cached_tokens(self, value: int) -> None:
        self.inner.cached_tokens = value

    @property
    def completion_tokens(self) -> int:
        return self.inner.completion_tokens

    @property
    def finish_reasons(self) -> Sequence[str | None]:
        return self.inner.finish_reasons

    def _keep(self, deltas: Sequence[Delta]) -> None:
        for d in deltas:
            if d.text:
                self._texts.setdefault(d.index, []).append(d.text)

    def outputs(self, limit: int | None = None) -> list[str]:
        """Each choice's text (in choice order), at most `limit` characters each."""
        out = []
        for index in sorted(self._texts):
            parts = self._texts[index]
            text = b"".join(p if isinstance(p, bytes) else p.encode() for p in parts).decode("utf-8", "replace")
            out.append(text if limit is None else text[:limit])
        return out


class EncoderTap(_Tap[StreamEncoder]):
    @property
    def keepalive(self) -> bytes:
        return self.inner.keepalive

    def start(self) -> bytes:
        return self.inner.start()

    def step(self, deltas: Sequence[Delta]) -> bytes:
        self._keep(deltas)
        return self.inner.step(deltas)

    def finish(self) -> bytes:
        return self.inner.finish()

    def error(self, exc: APIError) -> bytes:
        return self.inner.error(exc)


class AccumulatorTap(_Tap[Accumulator]):
    def step(self, deltas: Sequence[Delta]) -> object:
        self._keep(deltas)
        return self.inner.step(deltas)
