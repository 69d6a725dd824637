"""One choice's parts as a sequence of output blocks: the core of the item-based encoders.

Responses (output items) and Anthropic (content blocks) describe an answer as blocks opened, extended
and closed. `BlockEncoder` runs the choice's `Pipeline` on each Delta and maps parts to transitions:
CONTENT/REASONING extend the open block of that kind or close and open one; TOOL_CALL opens a call
block; TOOL_ARGS extends it. A subclass renders `_open`, `_delta`, `_close` and the framing (`start`,
`finish`, `error`) as bytes, one bytes object per step. With `emit=False` it is the non-stream
accumulator instead, so a JSON answer is exactly what the stream reassembles to: a `BlockEncoder` is a
`stream.StreamEncoder` and an `accumulate.Accumulator`. `prime(pieces)` (core/continuation.py) takes a
continued stream's earlier tokens through the filters and the blocks without a byte out (no opening
events either), so the blocks' text, positions and ids stand where the broken stream's stood.
A call block's id is the parser's, or with `id_seed` (`seed_of(the response's id)`) `call_<seed><position>`:
then a stream's ids follow from its response's id alone, and a continuation's equal the broken stream's.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from engine_adapter.base import Delta
from streamproxy.core import sse
from streamproxy.errors import APIError
from streamproxy.filters import base as F
from streamproxy.filters.base import CONTENT, TOOL_ARGS, TOOL_CALL, FilterFactory, Part, Pipeline, merge_content

# The reasoning part kind, once the reasoning splitter defines it.
REASONING: int | None = getattr(F, "REASONING", None)

TEXT = "text"
THINKING = "reasoning"
CALL = "call"


def seed_of(response_id: str) -> str:
    """The id seed of a response (12 hex digits, as random seeds have): its ids follow from its own."""
    return hashlib.blake2b(response_id.encode(), digest_size=6).hexdigest()


class Block:
    __slots__ = ("kind", "position", "id", "name", "pieces", "open", "complete", "item_id", "head")

    def __init__(self, kind: str, *, id: str = "", name: str = "") -> None:
        self.kind = kind
        self.position = 0
        self.id = id  # a call's id (from the filter); item ids are the subclass's
        self.name = name
        self.pieces: list[str] = []
        self.open = True
        self.complete = False  # closed normally (not cut off by max tokens)
        self.item_id = ""  # the subclass's id for the block, if its API names blocks
        self.head = b""  # the subclass's pre-encoded delta prefix

    @property
    def text(self) -> str:
        return "".join(self.pieces)

    def __repr__(self) -> str:
        return f"Block({self.kind}, {self.position}, {self.text!r})"


class BlockEncoder:
    keepalive = sse.KEEPALIVE

    def __init__(self, filters: FilterFactory | None = None, *, emit: bool = True, id_seed: str | None = None) -> None:
        self.id_seed = id_seed  # call ids derived from it (see the module's comment); None: the parser's
        self.pipeline = Pipeline(filters() if filters else ())
        self.emit = emit
        self.blocks: list[Block] = []
        self.current: Block | None = None
        self._calls: dict[int, Block] = {}
        self.tokens = 0
        self.prompt_tokens = 0
        self.cached_tokens = 0
        self.reason: str | None = None  # the finish reason after the filters (stop, length, tool_calls)
        self.finish_reason: str | None = None  # the same in this API's words
        self.started = False
        self.continued = False  # a continuation (`prime`): no opening events

    # -- what the writer, generation.run and the access log read ------
    @property
    def finish_reasons(self) -> list[str | None]:
        return [self.finish_reason]

    @property
    def completion_tokens(self) -> int:
        return self.tokens

    @property
    def truncated(self) -> bool:
        return self.reason == "length"

    # -- the protocol ---------------------------------------------------
    def start(self) -> bytes:
        if self.continued:
            return b""  # the opening went out with the stream's first part
        self.started = True
        return self._start() if self.emit else b""

    def prime(self, pieces: Sequence[tuple[str, int]]) -> None:
        """A continuation: these tokens (text, id) were generated and sent before; nothing goes out."""
        self.started = self.continued = True
        emit, self.emit = self.emit, False
        try:
            for text, token in pieces:
                self.tokens += 1
                parts = self.pipeline.feed(text, [token])
                if parts:
                    self._take([], parts)
        finally:
            self.emit = emit

    def step(self, deltas: Sequence[Delta]) -> bytes:
        out: list[bytes] = []
        for d in deltas:
            self.tokens += d.num_tokens
            if self.reason is not None:
                continue
            parts = self.pipeline.feed(d.text, d.token_ids)
            if parts:
                self._take(out, parts)
            if d.finish_reason is not None:
                self._end(out, d.finish_reason)
        return b"".join(out)

    def finish(self) -> bytes:
        """The engine is done: close what is open (if no finish reason came), then the API's ending."""
        out: list[bytes] = []
        if self.reason is None:
            self._end(out, "abort")
        if not self.emit:
            return b""
        out.append(self._finish())
        return b"".join(out)

    def error(self, exc: APIError) -> bytes:
        head = b"" if self.started else self.start()
        return head + self._error(exc)

    # -- parts -> blocks ------------------------------------------------
    def _take(self, out: list[bytes], parts: list[Part]) -> None:
        emit = self.emit
        for p in parts if len(parts) == 1 else merge_content(parts):
            kind = p.kind
            if kind == TOOL_ARGS:
                block = self._calls.get(p.index)
                if block is None or not p.text:
                    continue
            elif kind == TOOL_CALL:
                call = Block(CALL, id=self.call_id(p.id, len(self.blocks)), name=p.name or "")
                block = self._calls[p.index] = self._switch(out, call)
                continue
            else:
                if not p.text:
                    continue
                want = TEXT if kind == CONTENT else THINKING if kind == REASONING else None
                if want is None:
                    continue  # a part kind this API cannot show
                block = self.current
                if block is None or block.kind != want:
                    block = self._switch(out, Block(want))
            block.pieces.append(p.text)
            if emit:
                out.append(self._delta(block, p.text))

    def _switch(self, out: list[bytes], block: Block) -> Block:
        if self.current is not None:
            self._close_block(out, self.current, complete=True)
        block.position = len(self.blocks)
        self.blocks.append(block)
        self.current = block
        opened = self._open(block)
        if self.emit:
            out.append(opened)
        return block

    def _close_block(self, out: list[bytes], block: Block, *, complete: bool) -> None:
        block.open = False
        block.complete = complete
        if self.current is block:
            self.current = None
        if self.emit:
            out.append(self._close(block))

    def _end(self, out: list[bytes], engine_reason: str) -> None:
        parts, reason = self.pipeline.finish(engine_reason)
        self.reason = reason
        self.finish_reason = self.map_finish_reason(reason)
        if parts:
            self._take(out, parts)
        if self.current is not None:
            self._close_block(out, self.current, complete=not self.truncated)

    # -- for subclasses -------------------------------------------------
    def map_finish_reason(self, reason: str) -> str:
        return reason

    def call_id(self, parser_id: str | None, position: int) -> str:
        """The id of the call block opening at `position`."""
        if self.id_seed is not None:
            return "call_" + self.id_seed + str(position)
        return parser_id or F.new_call_id()

    def _start(self) -> bytes:
        return b""

    def _open(self, block: Block) -> bytes:
        """The block's opening events; also where a subclass sets `block.head`."""
        raise NotImplementedError

    def _delta(self, block: Block, text: str) -> bytes:
        raise NotImplementedError

    def _close(self, block: Block) -> bytes:
        raise NotImplementedError

    def _finish(self) -> bytes:
        return b""

    def _error(self, exc: APIError) -> bytes:
        raise NotImplementedError
