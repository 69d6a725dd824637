"""The tests' one SSE parser: frames, events, data payloads and JSON chunks of a body.

`parse(body)` reads any SSE body the way a client does, and reports what is
wrong instead of raising: it splits at blank lines, reads each line as a
comment (`: keepalive`) or a field (`event:`, `data:`; several `data:`
lines join with a newline, as the SSE spec says), and returns the frames
plus readable problems (no blank line at the end, an empty frame, a field
this server never sends, a carriage return). tests/compat's wire checker
uses it as is.

Everything else here is a strict view for tests of this server's own
streams, built on `parse`, asserting the framing as it goes: the body ends
on a frame boundary, there are no problems, and (for the chat and
completions streams) every frame is one `data: ` line or one comment line.

    frames(body)          the raw frames, comments included: [b'data: {...}', b': keepalive', ...]
    arrivals(pieces)      the same for a body read in timed pieces, each frame with its arrival time
    data(body)            the bytes after `data: ` of each data frame (comments skipped)
    payloads(body)        the JSON of each data frame before the single, final `data: [DONE]`
    named_events(body)    [(event name, JSON payload)] of a Responses or Anthropic stream

The parser is written apart from streamproxy's own (streamproxy.core.sse),
so a bug there cannot hide itself here. It works on bytes: tests that pin
exact bytes compare the body itself, not what this module makes of it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from itertools import accumulate
from typing import Any

DONE_FRAME = b"data: [DONE]"
KEEPALIVE_FRAME = b": keepalive"


@dataclass(frozen=True)
class Frame:
    """One frame (event) of an SSE body."""

    raw: bytes  # as sent, without the blank line that ends it
    event: str | None = None  # the `event:` field
    data: bytes | None = None  # the `data:` lines joined with b"\n"; None when there is none
    comments: tuple[bytes, ...] = ()  # comment lines, as sent (with their ':')

    @property
    def is_comment(self) -> bool:
        """Only comments: a keepalive, nothing a client hands on."""
        return self.event is None and self.data is None

    @property
    def is_done(self) -> bool:
        return self.data == b"[DONE]"

    def json(self) -> Any:
        assert self.data is not None, self.raw
        return json.loads(self.data)


def _frame(raw: bytes, problems: list[str]) -> Frame:
    event: str | None = None
    data: list[bytes] = []
    comments: list[bytes] = []
    if b"\r" in raw:
        problems.append(f"carriage return in frame {raw[:80]!r}")
    for line in raw.split(b"\n"):
        if line.startswith(b":"):
            comments.append(line)
            continue
        name, colon, value = line.partition(b":")
        if colon and value.startswith(b" "):
            value = value[1:]
        if name == b"data":
            data.append(value)
        elif name == b"event" and event is None:
            event = value.decode("utf-8", "replace")
        else:
            problems.append(f"unexpected SSE field {name.decode('utf-8', 'replace')!r} in event {raw[:80]!r}")
    return Frame(raw, event, b"\n".join(data) if data else None, tuple(comments))


def parse(body: bytes) -> tuple[list[Frame], list[str]]:
    """Every frame of `body` (an unterminated tail too) and the framing problems found."""
    problems: list[str] = []
    if not body:
        return [], problems
    blocks = body.split(b"\n\n")
    if blocks[-1] == b"":
        blocks.pop()
    else:
        problems.append(f"stream does not end with a blank line: {body[-60:]!r}")
    frames: list[Frame] = []
    for raw in blocks:
        if not raw.strip(b"\n"):
            problems.append(f"empty frame (an extra blank line) before frame {len(frames)}")
            continue
        if raw.startswith(b"\n"):
            problems.append(f"frame starts with a blank line: {raw[:80]!r}")
            raw = raw.lstrip(b"\n")
        frames.append(_frame(raw, problems))
    return frames, problems


def events(body: bytes) -> list[Frame]:
    """Every frame of a well-formed body, comments included; asserts there are no problems."""
    assert body.endswith(b"\n\n"), f"does not end on a frame boundary: {body[-120:]!r}"
    frames, problems = parse(body)
    assert not problems, problems
    return frames


def frames(body: bytes) -> list[bytes]:
    """The raw frames (without their blank-line terminator), comments included.

    Asserts each is a single `data: ` line or a single comment line: this
    server's chat and completions streams never send anything else.
    """
    out = []
    for frame in events(body):
        assert b"\n" not in frame.raw, frame.raw
        assert frame.raw.startswith(b"data: ") or frame.raw.startswith(b":"), frame.raw
        out.append(frame.raw)
    return out


def arrivals(chunks: list[tuple[float, bytes]]) -> list[tuple[float, bytes]]:
    """`frames` of a body read in timed pieces: each frame with the time of the piece that completed it."""
    body = b"".join(piece for _, piece in chunks)
    ends = list(accumulate(len(piece) for _, piece in chunks))
    out = []
    end = k = 0
    for raw in frames(body):
        end += len(raw) + 2
        while ends[k] < end:
            k += 1
        out.append((chunks[k][0], raw))
    return out


def data(body: bytes, *, comments: bool = True) -> list[bytes]:
    """What follows `data: ` in each data frame; comments are skipped (or, with `comments=False`, refused)."""
    out = []
    for raw in frames(body):
        if raw.startswith(b":"):
            assert comments, f"a comment frame where none may be: {raw!r}"
            continue
        out.append(raw[len(b"data: ") :])
    return out


def payloads(body: bytes, *, done: bool = True, comments: bool = True) -> list[Any]:
    """The JSON of each data frame.

    With `done` (the default) the stream must end with `data: [DONE]`, exactly
    once, and it is left out; with `done=False` (a stream cut short, or the
    frames of a single step) there must be none.
    """
    items = data(body, comments=comments)
    if done:
        assert items and items[-1] == b"[DONE]", items[-3:]
        assert items.count(b"[DONE]") == 1, "data: [DONE] before the end of the stream"
        items = items[:-1]
    else:
        assert b"[DONE]" not in items, items
    return [json.loads(item) for item in items]


def named_events(body: bytes) -> list[tuple[str, dict[str, Any]]]:
    """(event, payload) of a stream of named events (Responses, Anthropic), comments skipped.

    Asserts the framing: each frame is `event: X` then one `data:` line (or
    one comment line), and the payload's `type` is the event's name.
    """
    out: list[tuple[str, dict[str, Any]]] = []
    for frame in events(body):
        if frame.is_comment:
            assert b"\n" not in frame.raw, frame.raw
            continue
        lines = frame.raw.split(b"\n")
        assert len(lines) == 2 and lines[0].startswith(b"event: ") and lines[1].startswith(b"data: "), frame.raw
        assert frame.event is not None
        payload = frame.json()
        assert payload["type"] == frame.event, (frame.event, payload)
        out.append((frame.event, payload))
    return out


def verdict(body: bytes) -> str:
    """How a chat or completions stream ended: 'done' (a finish_reason, then [DONE]) or
    'error' (an error event, then [DONE]); anything else fails."""
    items = payloads(body)
    last = items[-1]
    if "error" in last:
        assert set(last["error"]) == {"message", "type", "param", "code"}, last
        return "error"
    assert last["choices"] == [] or last["choices"][0]["finish_reason"] is not None, last
    return "done"
