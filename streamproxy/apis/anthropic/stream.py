"""Deltas -> Anthropic Messages stream events, and the final `Message`.

A `BlockEncoder`: `message_start`; per block `content_block_start` (text, thinking or tool_use),
`content_block_delta` (text_delta, thinking_delta, input_json_delta), `content_block_stop`; then
`message_delta` (stop_reason, stop_sequence, usage) and `message_stop`. The in-band error and the ping
sent on silence are `spec.ANTHROPIC`'s. Stop reasons: "stop" -> end_turn (stop_sequence when the
`StopSequenceFilter` saw one), "length" -> max_tokens (model_context_window_exceeded when the route
lowered max_tokens), tool calls -> tool_use. `input_tokens` excludes `cache_read_input_tokens`, known
only at the end: message_start counts the whole prompt and message_delta carries the final split.
"""

from __future__ import annotations

from typing import Any

import msgspec
import orjson

from streamproxy.apis.anthropic.protocol import Message, TextBlock, ThinkingBlock, ToolUseBlock, Usage
from streamproxy.apis.anthropic.spec import ANTHROPIC, PING
from streamproxy.core import sse
from streamproxy.core.blockstream import CALL, TEXT, Block, BlockEncoder
from streamproxy.errors import APIError
from streamproxy.filters.base import FilterFactory
from streamproxy.filters.jsonscan import loads
from streamproxy.filters.stopseq import StopSequenceFilter

_dumps = orjson.dumps
_encode = msgspec.json.Encoder().encode

_STOP = sse.event_frame(b"message_stop", b'{"type":"message_stop"}')
_DELTA_OPEN = {TEXT: b'"delta":{"type":"text_delta","text":', CALL: b'"delta":{"type":"input_json_delta","partial_json":'}
_THINKING_OPEN = b'"delta":{"type":"thinking_delta","thinking":'


def tool_use_id(call_id: str) -> str:
    """Anthropic's id style for a filter's call id (ids are opaque to clients either way)."""
    return "toolu_" + call_id.removeprefix("call_")


class AnthropicEncoder(BlockEncoder):
    keepalive = PING  # ANTHROPIC.keepalive

    def __init__(
        self,
        *,
        message_id: str,
        model: str,
        filters: FilterFactory | None = None,
        stop_sequences: list[str] | None = None,
        window_capped: bool = False,
        emit: bool = True,
        id_seed: str | None = None,
    ) -> None:
        stops = StopSequenceFilter(stop_sequences) if stop_sequences else None
        if stops is not None:
            # First in the chain: it sees the engine's text as the engine stopped on it
            # (the route asks the engine to keep the stop string in its output).
            inner = filters
            filters = lambda: [stops, *(inner() if inner is not None else ())]  # noqa: E731
        super().__init__(filters, emit=emit, id_seed=id_seed)  # (with a seed, tool_use ids are derived)
        self.message_id = message_id
        self.model = model
        self.stops = stops
        self.window_capped = window_capped  # max_tokens was lowered to fit the context
        self.stop_sequence: str | None = None

    def map_finish_reason(self, reason: str) -> str:
        if reason == "tool_calls" or (reason == "stop" and any(b.kind == CALL for b in self.blocks)):
            return "tool_use"  # also a forced call (tool_choice "tool"), which chat reports as "stop"
        if reason == "length":
            return "model_context_window_exceeded" if self.window_capped else "max_tokens"
        if self.stops is not None and self.stops.matched is not None:
            self.stop_sequence = self.stops.matched
            return "stop_sequence"
        return "end_turn"

    # -- the Message object -----------------------------------------------
    def usage(self, *, final: bool) -> Usage:
        cached = self.cached_tokens if final else 0
        return Usage(input_tokens=self.prompt_tokens - cached, output_tokens=self.tokens if final else 0, cache_read_input_tokens=cached)

    def _content(self, block: Block) -> Any:
        if block.kind == TEXT:
            return TextBlock(text=block.text)
        if block.kind == CALL:
            return ToolUseBlock(id=tool_use_id(block.id), name=block.name, input=_arguments(block.text))
        return ThinkingBlock(thinking=block.text)

    def message(self) -> Message:
        done = self.reason is not None
        return Message(
            id=self.message_id,
            model=self.model,
            content=[self._content(b) for b in self.blocks] if done else [],
            stop_reason=self.finish_reason,
            stop_sequence=self.stop_sequence,
            usage=self.usage(final=done),
        )

    def final_json(self) -> bytes:
        """The non-stream answer (after the last step)."""
        if self.reason is None:
            self.finish()
        return _encode(self.message())

    # -- events -----------------------------------------------------------
    def _start(self) -> bytes:
        return sse.event_frame(b"message_start", _encode({"type": "message_start", "message": self.message()}))

    def _open(self, block: Block) -> bytes:
        index = str(block.position).encode()
        block.head = (
            b'event: content_block_delta\ndata: {"type":"content_block_delta","index":'
            + index
            + b","
            + _DELTA_OPEN.get(block.kind, _THINKING_OPEN)
        )
        if not self.emit:
            return b""
        if block.kind == TEXT:
            start: dict[str, Any] = {"type": "text", "text": ""}
        elif block.kind == CALL:
            start = {"type": "tool_use", "id": tool_use_id(block.id), "name": block.name, "input": {}}
        else:
            start = {"type": "thinking", "thinking": "", "signature": ""}
        return sse.event_frame(b"content_block_start", _encode({"type": "content_block_start", "index": block.position, "content_block": start}))

    def _delta(self, block: Block, text: str) -> bytes:
        return block.head + _dumps(text) + b"}}\n\n"

    def _close(self, block: Block) -> bytes:
        return b'event: content_block_stop\ndata: {"type":"content_block_stop","index":' + str(block.position).encode() + b"}\n\n"

    def _finish(self) -> bytes:
        usage = self.usage(final=True)
        body = {
            "type": "message_delta",
            "delta": {"stop_reason": self.finish_reason, "stop_sequence": self.stop_sequence},
            "usage": {
                "input_tokens": usage.input_tokens,
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": usage.cache_read_input_tokens,
                "output_tokens": usage.output_tokens,
            },
        }
        return sse.event_frame(b"message_delta", _encode(body)) + _STOP

    def _error(self, exc: APIError) -> bytes:
        return ANTHROPIC.error(exc)

    def error(self, exc: APIError) -> bytes:
        # No message_start first: Anthropic's own streams may fail before it.
        return self._error(exc)


def _arguments(text: str) -> dict[str, Any]:
    """A tool_use block's `input` object; a call cut off mid-JSON (max_tokens) keeps what parsed: {}."""
    try:
        value = loads(text) if text.strip() else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
