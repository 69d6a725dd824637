"""Deltas -> OpenAI Responses API stream events, and the final `Response` object.

A `BlockEncoder`: named SSE events with `type` and a `sequence_number` counting from 0.
`response.created`, `.in_progress`; per item `output_item.added`, (`content_part.added`,
`output_text.delta`/`reasoning_text.delta`..., `.done`, `content_part.done` | `function_call_arguments`
`.delta`..., `.done`), `output_item.done`; then `response.completed` or `.incomplete`; on error `error`
then `response.failed` (spec.py's, the gateway's too). The JSON around a delta is pre-encoded when its
item opens. One `response()` builds the stream's and the non-stream answer's `Response`.
"""

from __future__ import annotations

import os
from typing import Any

import msgspec
import orjson

from streamproxy.apis.responses.protocol import (
    FunctionCallItem,
    IncompleteDetails,
    InputTokensDetails,
    OutputMessage,
    OutputText,
    OutputTokensDetails,
    ReasoningItem,
    ReasoningText,
    Response,
    ResponseError,
    ResponseUsage,
)
from streamproxy.apis.responses.spec import SEQ as _SEQ
from streamproxy.apis.responses.spec import failed_events, failure
from streamproxy.core import sse
from streamproxy.core.blockstream import CALL, TEXT, Block, BlockEncoder
from streamproxy.errors import APIError
from streamproxy.filters.base import FilterFactory

_dumps = orjson.dumps
_encode = msgspec.json.Encoder().encode

_ID_PREFIX = {TEXT: "msg_", CALL: "fc_"}
_DELTA_EVENT = {TEXT: b"response.output_text.delta", CALL: b"response.function_call_arguments.delta"}
_REASONING_DELTA = b"response.reasoning_text.delta"
_TEXT_TAIL = b',"logprobs":[]' + _SEQ


class ResponsesEncoder(BlockEncoder):
    def __init__(self, shell: Response, filters: FilterFactory | None = None, *, emit: bool = True, id_seed: str | None = None) -> None:
        super().__init__(filters, emit=emit, id_seed=id_seed)
        self.shell = shell  # everything the request fixes: id, model, echoed settings
        self.seq = 0
        self._seed = id_seed if id_seed is not None else os.urandom(6).hex()  # the items' ids (and with one given, the calls')
        self._failure: ResponseError | None = None

    # -- framing ----------------------------------------------------------
    def _frame(self, event: bytes, head: bytes) -> bytes:
        """`head` is a JSON object without its closing brace; the sequence number closes it."""
        n = self.seq
        self.seq = n + 1
        return sse.event_frame(event, head + _SEQ + str(n).encode() + b"}")

    def _event(self, name: str, body: dict[str, Any]) -> bytes:
        return self._frame(name.encode(), _encode({"type": name, **body})[:-1])

    # -- the Response object ---------------------------------------------
    def _item(self, block: Block, *, added: bool = False) -> Any:
        """The block as an output item; as `output_item.added` announces it: no content yet."""
        status = "in_progress" if block.open else "completed" if block.complete else "incomplete"
        if block.kind == TEXT:
            return OutputMessage(id=block.item_id, status=status, content=[] if added else [OutputText(text=block.text)])
        if block.kind == CALL:
            return FunctionCallItem(id=block.item_id, status=status, arguments=block.text, call_id=block.id, name=block.name)
        return ReasoningItem(id=block.item_id, status=status, content=[] if added else [ReasoningText(text=block.text)])

    def usage(self) -> ResponseUsage:
        return ResponseUsage(
            input_tokens=self.prompt_tokens,
            input_tokens_details=InputTokensDetails(cached_tokens=self.cached_tokens),
            output_tokens=self.tokens,
            output_tokens_details=OutputTokensDetails(reasoning_tokens=self.pipeline.reasoning_tokens or 0),
            total_tokens=self.prompt_tokens + self.tokens,
        )

    def response(self) -> Response:
        """The Response as it stands: in progress, completed, incomplete or failed."""
        if not self.started and self.reason is None and self._failure is None:
            return self.shell
        output = [self._item(b) for b in self.blocks]
        if self._failure is not None:
            return msgspec.structs.replace(self.shell, status="failed", output=output, error=self._failure, usage=self.usage())
        if self.reason is None:
            return msgspec.structs.replace(self.shell, status="in_progress", output=output)
        if self.truncated:
            return msgspec.structs.replace(
                self.shell,
                status="incomplete",
                incomplete_details=IncompleteDetails(reason="max_output_tokens"),
                output=output,
                usage=self.usage(),
            )
        return msgspec.structs.replace(self.shell, status="completed", output=output, usage=self.usage())

    def final_json(self) -> bytes:
        """The non-stream answer (after the last step)."""
        if self.reason is None:
            self.finish()
        return _encode(self.response())

    # -- events -----------------------------------------------------------
    def _start(self) -> bytes:
        response = self.shell
        return self._event("response.created", {"response": response}) + self._event("response.in_progress", {"response": response})

    def _open(self, block: Block) -> bytes:
        position = block.position
        block.item_id = item_id = _ID_PREFIX.get(block.kind, "rs_") + self._seed + str(position)
        event = _DELTA_EVENT.get(block.kind, _REASONING_DELTA)
        head = b'event: %s\ndata: {"type":"%s","item_id":"%s","output_index":%d,' % (event, event, item_id.encode(), position)
        if block.kind != CALL:
            head += b'"content_index":0,'
        block.head = head + b'"delta":'  # the whole frame up to the delta string
        if not self.emit:
            return b""
        out = self._event("response.output_item.added", {"output_index": position, "item": self._item(block, added=True)})
        if block.kind == CALL:
            return out
        part = OutputText(text="") if block.kind == TEXT else ReasoningText(text="")
        return out + self._event(
            "response.content_part.added", {"item_id": item_id, "output_index": position, "content_index": 0, "part": part}
        )

    def _delta(self, block: Block, text: str) -> bytes:
        n = self.seq
        self.seq = n + 1
        tail = _TEXT_TAIL if block.kind == TEXT else _SEQ
        return block.head + _dumps(text) + tail + str(n).encode() + b"}\n\n"

    def _close(self, block: Block) -> bytes:
        position, item_id, text = block.position, block.item_id, block.text
        where = {"item_id": item_id, "output_index": position}
        if block.kind == CALL:
            out = self._event("response.function_call_arguments.done", {**where, "arguments": text})
        elif block.kind == TEXT:
            out = self._event("response.output_text.done", {**where, "content_index": 0, "text": text, "logprobs": []})
            out += self._event("response.content_part.done", {**where, "content_index": 0, "part": OutputText(text=text)})
        else:
            out = self._event("response.reasoning_text.done", {**where, "content_index": 0, "text": text})
            out += self._event("response.content_part.done", {**where, "content_index": 0, "part": ReasoningText(text=text)})
        return out + self._event("response.output_item.done", {"output_index": position, "item": self._item(block)})

    def _finish(self) -> bytes:
        name = "response.incomplete" if self.truncated else "response.completed"
        return self._event(name, {"response": self.response()})

    def _error(self, exc: APIError) -> bytes:
        code, message = failure(exc)
        self._failure = ResponseError(code=code, message=message)
        if self.current is not None:  # cut off: the failed response shows it as incomplete
            self.current.open = False
            self.current = None
        out = failed_events(exc, self.seq, _encode(self.response()))
        self.seq += 2
        return out
