"""Server-Sent Events framing, both ways.

Encoding is a byte concatenation: `data: ` + payload + `\n\n`. The constant
frames (`[DONE]`, the keepalive comment) are pre-encoded once. The payload
must be a single line of JSON (JSON encoders never emit raw newlines), so no
escaping is needed on the hot path.

`SSEParser` is the sans-IO reader (for tests and for upstream servers): feed
it bytes in any slicing, it yields `(event, data)` pairs per the WHATWG
rules (LF, CRLF or CR line ends; comments; multi-line data joined by `\n`).
"""

from __future__ import annotations

DONE = b"data: [DONE]\n\n"
KEEPALIVE = b": keepalive\n\n"


def frame(payload: bytes) -> bytes:
    return b"data: " + payload + b"\n\n"


def event_frame(event: bytes, payload: bytes) -> bytes:
    """A named event (`event: x`), as the Responses and Anthropic APIs use."""
    return b"event: " + event + b"\ndata: " + payload + b"\n\n"


class SSEParser:
    """Incremental SSE parser: `feed(bytes) -> list[(event, data)]`."""

    __slots__ = ("_buf", "_event", "_data", "_saw_cr")

    def __init__(self) -> None:
        self._buf = b""
        self._event: str | None = None
        self._data: list[str] = []
        self._saw_cr = False

    def feed(self, chunk: bytes) -> list[tuple[str | None, str]]:
        events: list[tuple[str | None, str]] = []
        buf = self._buf + chunk
        start = 0
        i = 0
        n = len(buf)
        while i < n:
            c = buf[i]
            if c == 0x0A and self._saw_cr:  # the LF of a CRLF already handled
                self._saw_cr = False
                start = i = i + 1
                continue
            self._saw_cr = False
            if c == 0x0A or c == 0x0D:
                self._line(buf[start:i].decode("utf-8", "replace"), events)
                self._saw_cr = c == 0x0D
                start = i + 1
            i += 1
        self._buf = buf[start:]
        return events

    def _line(self, line: str, events: list[tuple[str | None, str]]) -> None:
        if not line:
            if self._data:
                events.append((self._event, "\n".join(self._data)))
            self._event = None
            self._data = []
            return
        if line[0] == ":":
            return
        field, _, value = line.partition(":")
        if value[:1] == " ":
            value = value[1:]
        if field == "data":
            self._data.append(value)
        elif field == "event":
            self._event = value
