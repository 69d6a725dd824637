"""`return_token_ids` on an item-based stream (Responses, Anthropic Messages): ids on its events. Sans-IO.

`EventIds` wraps a `BlockEncoder` that a request asked for ids: the prompt's go once, as
`"prompt_token_ids":[...]` at the end of the stream's last opening event (`response.in_progress`,
`message_start`; the ones before it marked open, below); each step's as `"token_ids":[...]` at the end of the step's last event, its other events marked open
(`"token_ids":[]`), so a gateway that keeps what a client has (gateway/serve_chunks.py) holds a step's
events until its ids come and the client only ever has whole steps. A step that sends nothing (a parser
holds its text) passes its ids on to the next event out, and so does the step that finishes: its events
stay open until the stream's last event (`response.completed`, `message_stop`), which carries them, so
a stream cut before its end is continued from the finishing step, never past it. A stream that did not
ask has no wrapper: it pays nothing. `BlockStream` makes a request's encoder: `prime`d for a
continuation, wrapped when it asked for ids.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import orjson

from engine_adapter.base import Delta
from streamproxy.core.blockstream import BlockEncoder
from streamproxy.core.stream import StreamEncoder
from streamproxy.errors import APIError

_END = b"}\n\n"  # every event's end (its data is one JSON object; `\n\n` is never inside one)
_OPEN = b',"token_ids":[]}\n\n'


class EventIds:
    """A `StreamEncoder`: `inner`'s events with the ids on them (see the module's comment)."""

    __slots__ = ("inner", "prompt_ids", "pending")

    def __init__(self, inner: BlockEncoder, prompt_ids: list[int]) -> None:
        self.inner = inner
        self.prompt_ids = prompt_ids
        self.pending: list[int] = []  # ids of steps whose events have not gone out yet

    # -- what the writer sets and reads, the inner encoder's ------------
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
    def keepalive(self) -> bytes:
        return self.inner.keepalive

    @property
    def completion_tokens(self) -> int:
        return self.inner.completion_tokens

    @property
    def finish_reasons(self) -> Sequence[str | None]:
        return self.inner.finish_reasons

    # -- the protocol ---------------------------------------------------
    def start(self) -> bytes:
        out = self.inner.start()
        if not out:
            return out  # (a continuation: no opening events)
        out = out.replace(_END, _OPEN)
        return out[: -len(_OPEN)] + b',"prompt_token_ids":' + orjson.dumps(self.prompt_ids) + _END

    def step(self, deltas: Sequence[Delta]) -> bytes:
        out = self.inner.step(deltas)
        for d in deltas:
            if d.token_ids:
                self.pending.extend(d.token_ids)
        if not out:
            return out
        return self._marked(out, last=self.inner.reason is None)  # (the finishing step's ids wait for the end)

    def finish(self) -> bytes:
        return self._marked(self.inner.finish(), last=True)

    def error(self, exc: APIError) -> bytes:
        return self.inner.error(exc)

    def _marked(self, out: bytes, *, last: bool) -> bytes:
        """Every event open; with `last`, the last one ends the step: the pending ids (none: no field)."""
        out = out.replace(_END, _OPEN)
        if last:
            ids = b',"token_ids":' + orjson.dumps(self.pending) if self.pending else b""
            self.pending = []
            out = out[: -len(_OPEN)] + ids + _END
        return out


@dataclass(frozen=True, slots=True)
class BlockStream:
    """Makes the stream encoder of a block API's request that asked for ids (`EventIds` around it) or
    continues a stream (`prime`d with the earlier tokens)."""

    make: Callable[[bool], BlockEncoder]
    prompt_ids: list[int] | None  # return_token_ids: the prompt's
    pieces: list[tuple[str, int]] | None  # continue_token_ids: the earlier tokens (text, id)

    def __call__(self) -> StreamEncoder:
        enc = self.make(True)
        if self.pieces is not None:
            enc.prime(self.pieces)
        return enc if self.prompt_ids is None else EventIds(enc, self.prompt_ids)
