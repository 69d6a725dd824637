"""Relaying a replica's SSE stream: whole events out, with the gateway's few edits.

`SSERelay.feed(bytes) -> bytes` returns the complete events of a read (a partial one waits), so the
gateway can put its own heartbeat or error between two. Per read: the model rename (one `bytes.replace`
of `"model":"<served>"`), usage decoded only in events that carry `"usage":{` (and the usage chunk the
client did not ask for removed), a look for the API's end marker (a cut stream is told from an ended
one), the events that end a choice (`api.finish`: a non-null `finish_reason`) decoded for why
(`finishes`, the access log's `finish_reason`; shared by a migrated stream's relays), and, for
Responses, the `kept` events decoded so a break ends as serve ends one. Nothing else is decoded. Each API's stream facts are its `apis.spec.ApiSpec`, shared with serve. Sans-IO.
"""

from __future__ import annotations

from typing import Any

import orjson

from streamproxy.apis.spec import ApiSpec, Usage
from streamproxy.errors import APIError

_USAGE = b'"usage":{'


def meter_body(api: ApiSpec, body: bytes, usage: Usage, finishes: dict[int, str] | None = None) -> None:
    """A non-streamed answer's usage (top level; Responses: the response's) and why its choices ended."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return
    if isinstance(data, dict):
        api.read_usage(data, usage)
        if finishes is not None:
            api.read_finish(data, finishes)


class SSERelay:
    __slots__ = (
        "api", "usage", "done", "events", "comments", "deltas", "kept", "finishes",
        "_buf", "_sep", "_sep_comment", "_renames", "_usage_only", "_delta_markers", "_done_markers", "_kept_markers",
        "_finish_markers",
    )

    def __init__(self, api: ApiSpec, *, served: str, public: str, strip_usage: bool,
                 finishes: dict[int, str] | None = None, keep: bool = True) -> None:
        self.api = api
        self.usage = Usage()
        self.finishes: dict[int, str] = {} if finishes is None else finishes  # choice index -> why it ended
        self._finish_markers = api.finish
        self.done = False  # the API's end marker went by
        self.events = 0  # events relayed (comments included)
        self.comments = 0  # of those, comment-only events (the replica's keepalives)
        self.deltas = 0  # of those, text-carrying events (Responses, Anthropic)
        self._delta_markers = api.deltas
        self._done_markers = api.done
        self.kept: list[dict[str, Any]] = []  # the events the API's in-band error is made of (api.kept)
        self._kept_markers = api.kept if keep else ()  # (keep=False: the caller `keep`s what the client got)
        self._buf = b""
        self._sep: bytes | None = None  # b"\n\n", or b"\r\n\r\n" for a CRLF replica
        self._sep_comment = b"\n\n:"  # an event that starts as a comment, after a separator
        self._renames: list[tuple[bytes, bytes]] = []
        if served != public:
            for colon in (b":", b": "):
                self._renames.append((b'"model"' + colon + orjson.dumps(served), b'"model"' + colon + orjson.dumps(public)))
        self._usage_only = api.usage_only if strip_usage else None  # the chunk to drop

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
        for marker in self._kept_markers:
            if marker in block:
                self._keep(block, sep, self._kept_markers)
                break
        for marker in self._finish_markers:
            if marker in block:
                self._finished(block, sep)
                break
        if not self.done:
            for marker in self._done_markers:
                if marker in block:
                    self.done = True
        return block

    def error(self, exc: APIError, sequence_number: int | None = None) -> bytes:
        """The in-band error that ends the client's stream here, numbered after the events relayed (or
        `sequence_number`: a migrating stream's, which knows what the client had)."""
        number = self.events - self.comments if sequence_number is None else sequence_number
        return self.api.error(exc, number, self.kept)

    def keep(self, block: bytes) -> None:
        """Keep the `kept` events of a block the client gets (a relay made with keep=False: a migrating
        stream's, whose record may hold events back)."""
        for marker in self.api.kept:
            if marker in block:
                self._keep(block, self._sep or b"\n\n", self.api.kept)
                break

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
                data = _json(event)
                if data is not None:
                    self.api.read_usage(data, self.usage)
                    if self._usage_only is not None and self._usage_only in event:
                        continue
            out.append(event + sep)
        return b"".join(out)

    def _keep(self, block: bytes, sep: bytes, markers: tuple[bytes, ...]) -> None:
        for event in block.split(sep)[:-1]:
            if event.startswith(markers):
                data = _json(event)
                if data is not None:
                    self.kept.append(data)


    def _finished(self, block: bytes, sep: bytes) -> None:
        markers = self._finish_markers
        for event in block.split(sep)[:-1]:
            if any(marker in event for marker in markers):
                data = _json(event)
                if data is not None:
                    self.api.read_finish(data, self.finishes)


def _json(event: bytes) -> dict[str, Any] | None:
    payload = _data(event)
    if payload is None:
        return None
    try:
        data = orjson.loads(payload)
    except orjson.JSONDecodeError:
        return None
    return data if isinstance(data, dict) else None


def _data(event: bytes) -> bytes | None:
    """The `data:` field of one event (single-line data, as every replica here sends it)."""
    start = event.find(b"data:")
    if start < 0:
        return None
    line_end = event.find(b"\n", start)
    return event[start + 5 : line_end if line_end >= 0 else len(event)].strip()
