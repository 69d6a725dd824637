"""Relaying a replica's SSE stream: whole events out, with the gateway's few edits.

`SSERelay.feed(bytes) -> bytes` takes what one read from the replica gave
and returns the complete events in it (a partial event waits for the rest),
so the gateway never writes half an event and can put its own heartbeat or
error event between two of them. Per read, not per event, it does:
  - the model rename: one `bytes.replace` of `"model":"<served>"` by the
    public name (a JSON string value is escaped, so the pattern only ever
    matches the key itself);
  - a look for `"usage":{` and, only in the events that carry it (once or
    twice per stream), a JSON decode for metering; the usage chunk the
    client did not ask for (the gateway asked for it) is removed;
  - a look for the API's end marker (`data: [DONE]`, `message_stop`,
    `response.completed`), so a stream the replica cut is told apart from
    one that ended.
Nothing else is decoded or re-encoded. `Usage.from_json` reads the usage
shapes of the three APIs. Sans-IO.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any

import orjson

from streamproxy.apis.anthropic import errors as anthropic_errors
from streamproxy.apis.anthropic.stream import PING as ANTHROPIC_PING
from streamproxy.core import sse
from streamproxy.errors import APIError


class Api(Enum):
    OPENAI = "openai"  # chat and legacy completions: data-only events, [DONE]
    RESPONSES = "responses"
    ANTHROPIC = "anthropic"


_DONE = {
    Api.OPENAI: (b"data: [DONE]",),
    Api.RESPONSES: (b"event: response.completed", b"event: response.incomplete", b"event: response.failed"),
    Api.ANTHROPIC: (b"event: message_stop",),
}
# The events that carry generated text in the typed-event APIs (their other events are structure).
_DELTAS = {
    Api.OPENAI: (),
    Api.RESPONSES: (b"event: response.output_text.delta", b"event: response.reasoning_text.delta", b"event: response.function_call_arguments.delta"),
    Api.ANTHROPIC: (b"event: content_block_delta",),
}
_USAGE = b'"usage":{'
_USAGE_ONLY = b'"choices":[]'


@dataclass(slots=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    billed: bool = False  # True: the replica reported it; False: the gateway counted events

    def take(self, usage: dict[str, Any]) -> None:
        """Merge one usage object (OpenAI, Responses or Anthropic shape)."""
        if "prompt_tokens" in usage or "completion_tokens" in usage:  # OpenAI
            self.prompt_tokens = int(usage.get("prompt_tokens") or 0)
            self.completion_tokens = int(usage.get("completion_tokens") or 0)
            self.cached_tokens = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
        elif "cache_read_input_tokens" in usage or "cache_creation_input_tokens" in usage:  # Anthropic
            cached = int(usage.get("cache_read_input_tokens") or 0)
            fresh = int(usage.get("input_tokens") or 0) + int(usage.get("cache_creation_input_tokens") or 0)
            if fresh or cached:
                self.prompt_tokens, self.cached_tokens = fresh + cached, cached
            self.completion_tokens = max(self.completion_tokens, int(usage.get("output_tokens") or 0))
        else:  # Responses (input tokens include the cached ones), or Anthropic's message_delta
            if "input_tokens" in usage:
                self.prompt_tokens = int(usage.get("input_tokens") or 0)
                self.cached_tokens = int((usage.get("input_tokens_details") or {}).get("cached_tokens") or 0)
            self.completion_tokens = max(self.completion_tokens, int(usage.get("output_tokens") or 0))
        self.billed = True

    def take_body(self, body: bytes) -> None:
        """A non-streamed answer's usage (top level; Responses: the response's)."""
        try:
            data = orjson.loads(body)
        except orjson.JSONDecodeError:
            return
        if isinstance(data, dict):
            usage = data.get("usage")
            if isinstance(usage, dict):
                self.take(usage)


class SSERelay:
    __slots__ = (
        "api", "usage", "done", "events", "comments", "deltas",
        "_buf", "_sep", "_sep_comment", "_renames", "_strip_usage", "_delta_markers", "_done_markers",
    )

    def __init__(self, api: Api, *, served: str, public: str, strip_usage: bool) -> None:
        self.api = api
        self.usage = Usage()
        self.done = False  # the API's end marker went by
        self.events = 0  # events relayed (comments included)
        self.comments = 0  # of those, comment-only events (the replica's keepalives)
        self.deltas = 0  # of those, text-carrying events (Responses, Anthropic)
        self._delta_markers = _DELTAS[api]
        self._done_markers = _DONE[api]
        self._buf = b""
        self._sep: bytes | None = None  # b"\n\n", or b"\r\n\r\n" for a CRLF replica
        self._sep_comment = b"\n\n:"  # an event that starts as a comment, after a separator
        self._renames: list[tuple[bytes, bytes]] = []
        if served != public:
            for colon in (b":", b": "):
                self._renames.append((b'"model"' + colon + orjson.dumps(served), b'"model"' + colon + orjson.dumps(public)))
        self._strip_usage = strip_usage

    def feed(self, data: bytes) -> bytes:
        buf = self._buf + data if self._buf else data
        sep = self._sep or self._separator(buf)
        end = buf.rfind(sep)
        if end < 0:
            self._buf = buf
            return b""
        end += len(sep)
        block, self._buf = buf[:end], buf[end:]
        self.events += block.count(sep)
        self.comments += block.startswith(b":") + block.count(self._sep_comment)
        for marker in self._delta_markers:
            self.deltas += block.count(marker)
        for old, new in self._renames:
            block = block.replace(old, new)
        if _USAGE in block:
            block = self._meter(block, sep)
        if not self.done:
            for marker in self._done_markers:
                if marker in block:
                    self.done = True
        return block

    @property
    def pending(self) -> bool:
        """Bytes of an unfinished event are held (the replica stopped mid-event)."""
        return bool(self._buf.strip())

    def counted(self) -> None:
        """No usage came from the replica (the stream was cut): count what was relayed, an event a
        token. Chat and completions: every event less the replica's comments (keepalives), the
        opening event (the role chunk) and the end marker (`[DONE]`) if it came. Responses and
        Anthropic: their text-carrying delta events only (the rest is structure)."""
        if self.usage.billed:
            return
        if self._delta_markers:
            self.usage.completion_tokens = self.deltas
        else:
            self.usage.completion_tokens = max(self.events - self.comments - 1 - self.done, 0)

    def _separator(self, buf: bytes) -> bytes:
        lf = buf.find(b"\n")
        if lf < 0:
            return b"\n\n"
        self._sep = b"\r\n\r\n" if lf > 0 and buf[lf - 1 : lf] == b"\r" else b"\n\n"
        self._sep_comment = self._sep + b":"
        return self._sep

    def _meter(self, block: bytes, sep: bytes) -> bytes:
        """Read the usage of the events that carry one; drop the usage-only chunk if unasked."""
        out: list[bytes] = []
        for event in block.split(sep)[:-1]:
            if _USAGE in event:
                payload = _data(event)
                if payload is not None:
                    self._read_usage(payload)
                    if self._strip_usage and self.api is Api.OPENAI and _USAGE_ONLY in payload:
                        continue
            out.append(event + sep)
        return b"".join(out)

    def _read_usage(self, payload: bytes) -> None:
        try:
            data = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return
        if not isinstance(data, dict):
            return
        usage = data.get("usage")
        if usage is None:
            inner = data.get("response") or data.get("message")  # Responses' final event, Anthropic's message_start
            usage = inner.get("usage") if isinstance(inner, dict) else None
        if isinstance(usage, dict):
            self.usage.take(usage)


def _data(event: bytes) -> bytes | None:
    """The `data:` field of one event (single-line data, as every replica here sends it)."""
    start = event.find(b"data:")
    if start < 0:
        return None
    line_end = event.find(b"\n", start)
    return event[start + 5 : line_end if line_end >= 0 else len(event)].strip()


def error_event(api: Api, exc: APIError, sequence_number: int = 0) -> bytes:
    """An in-band error after the first byte, ending the stream in the route's shape."""
    if api is Api.ANTHROPIC:
        return sse.event_frame(b"error", anthropic_errors.error_json(exc))
    if api is Api.RESPONSES:
        code = exc.code or "server_error"
        payload = {"type": "error", "code": code, "message": exc.message, "param": exc.param, "sequence_number": sequence_number}
        return sse.event_frame(b"error", orjson.dumps(payload))
    return sse.frame(exc.to_json()) + sse.DONE


def keepalive(api: Api) -> bytes:
    """What the gateway sends while the replica is silent (Anthropic clients expect pings)."""
    return ANTHROPIC_PING if api is Api.ANTHROPIC else sse.KEEPALIVE
