"""HTTP/1.1, the client side, sans-IO: a request's bytes, and a strict response parser fed bytes.

`request_bytes` writes a request. `ResponseParser.feed(data)` takes any split of the input and returns
the body bytes in it, decoded from its framing (Content-Length, chunked, or until close); `head`,
`complete` and `keep_alive` say where it is; `feed_eof` ends a close-delimited body (an error for any
other). Strict per RFC 9112/9110: anything else is a `ProtocolError` (`wire` makes it
`upstream_unavailable`): CRLF lines, HTTP/1.0-1.1, no 1xx, token field names, no obs-fold or CTL,
Content-Length digits below 2**64 (repeated only equal), `chunked` alone and never with
Content-Length, heads and trailers at most MAX_HEAD bytes, nothing after the end.
tests/fuzz/test_h1_differential.py holds it against llhttp and names each deliberate difference.
"""

from __future__ import annotations

import re

MAX_HEAD = 64 * 1024  # a replica's status line and headers, at most (nginx's proxy_buffer_size is smaller); trailers too
_MAX_SIZE_LINE = 1024  # a chunk size line, extensions included
_MAX_LENGTH = 1 << 64  # a Content-Length or chunk size at or past this is refused (as llhttp does)

# RFC 9110 5.6.2 token, 5.5 field-vchar / obs-text, 5.6.4 quoted-string; RFC 9112 4 status-line,
# 7.1.1 chunk-ext. The head is matched as latin-1 text (one character per byte).
_TOKEN = r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+"
_TEXT = r"[\t\x20-\x7e\x80-\xff]*"  # HTAB, SP, VCHAR, obs-text: a reason phrase, a field value
_STATUS_LINE = re.compile(r"HTTP/1\.([01]) ([1-5][0-9][0-9])(?: (" + _TEXT + r"))?")
_NAME = re.compile(_TOKEN)
_VALUE = re.compile(_TEXT)
_QUOTED = r'"(?:[\t \x21\x23-\x5b\x5d-\x7e\x80-\xff]|\\[\t \x21-\x7e\x80-\xff])*+"'
# Possessive (*+, ++, ?+): no backtracking, so a long bad line costs one pass.
_CHUNK_SIZE_LINE = re.compile(
    r"[0-9A-Fa-f]++((?:[ \t]*+;[ \t]*+" + _TOKEN + r"+(?:[ \t]*+=[ \t]*+(?:" + _TOKEN + "+|" + _QUOTED + r"))?+)*+)"
)
_DIGITS = re.compile(r"[0-9]+")
_NAMES: dict[str, str] = {}  # field names found to be tokens -> lower-cased: a replica sends the same few


class ProtocolError(ValueError):
    """The replica's bytes are not an HTTP/1.1 response we can read."""


def request_bytes(method: str, target: str, host: str, headers: dict[str, str], body: bytes) -> bytes:
    lines = [f"{method} {target} HTTP/1.1", f"Host: {host}", f"Content-Length: {len(body)}"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


# Parser states.
_HEAD, _LENGTH, _CHUNK_SIZE, _CHUNK_DATA, _CHUNK_END, _TRAILERS, _UNTIL_CLOSE, _DONE = range(8)


class ResponseParser:
    __slots__ = ("status", "reason", "headers", "keep_alive", "head", "complete",
                 "_state", "_buf", "_left", "_head_only", "_trailers")

    def __init__(self, *, head_only: bool = False) -> None:
        self.status = 0
        self.reason = ""
        self.headers: dict[str, str] = {}
        self.keep_alive = True
        self.head = False  # the status line and headers are in
        self.complete = False  # the body ended
        self._state = _HEAD
        self._buf = b""  # bytes not yet consumed (an unfinished head, size line or trailer)
        self._left = 0  # body bytes still due (Content-Length), or of the current chunk
        self._head_only = head_only  # a HEAD request: no body, whatever the headers say
        self._trailers = 0  # bytes of trailer lines read so far

    def feed(self, data: bytes) -> bytes:
        """The body bytes in `data` (b"" if none); raises ProtocolError."""
        state = self._state
        if state == _CHUNK_SIZE and not self._buf:  # the hot path: whole chunks, one or more
            return self._chunks(data)
        if state == _UNTIL_CLOSE:
            return data
        if state == _LENGTH:
            return self._length(data)
        if state == _DONE:
            if data:
                raise ProtocolError("the replica sent bytes after the end of its response")
            return b""
        if state == _HEAD:
            old = len(self._buf)
            data = self._buf + data if old else data
            self._buf = b""
            end = data.find(b"\r\n\r\n", old - 3 if old > 3 else 0)
            if end < 0:
                if len(data) - 3 > MAX_HEAD:  # the head is at least this long, whatever comes next
                    raise ProtocolError("the replica's response head is too long")
                self._buf = data
                return b""
            if end > MAX_HEAD:
                raise ProtocolError("the replica's response head is too long")
            self._read_head(data[:end].decode("latin-1"))
            data = data[end + 4 :]
            if self._state == _DONE:
                if data:
                    raise ProtocolError("the replica sent bytes after the end of its response")
                return b""
            if self._state == _UNTIL_CLOSE:
                return data
            if self._state == _LENGTH:
                return self._length(data)
        elif self._buf:
            data = self._buf + data
            self._buf = b""
        return self._chunks(data)

    def feed_eof(self) -> None:
        """The connection closed: the end of a body read until close, else an error if unfinished."""
        if self._state == _UNTIL_CLOSE:
            self._state = _DONE
            self.complete = True
            self.keep_alive = False
        elif self._state != _DONE:
            raise ProtocolError("the replica closed the connection before the end of its response")

    # -- the head ---------------------------------------------------------------------

    def _read_head(self, head: str) -> None:
        lines = head.split("\r\n")
        status = _STATUS_LINE.fullmatch(lines[0])
        if status is None:
            raise ProtocolError(f"not an HTTP/1.x status line: {lines[0][:80]!r}")
        self.status = int(status[2])
        self.reason = status[3] or ""
        headers = self.headers
        _fields(lines, 1, headers)
        self.keep_alive = status[1] == "1"  # HTTP/1.1 keeps the connection unless told, 1.0 only when told
        if "connection" in headers:
            options = {t.strip(" \t") for t in headers["connection"].lower().split(",")}
            self.keep_alive = "close" not in options if self.keep_alive else "keep-alive" in options
        # Framing, checked whether or not this response has a body (RFC 9112 6.1, 6.3).
        chunked = "transfer-encoding" in headers
        if chunked:
            if headers["transfer-encoding"].lower() != "chunked":  # one field line, one coding (OWS stripped)
                raise ProtocolError(f"unsupported Transfer-Encoding: {headers['transfer-encoding'][:40]!r}")
            if "content-length" in headers:
                raise ProtocolError("both Transfer-Encoding and Content-Length")
        length = -1
        if "content-length" in headers:  # one value, or the same one repeated (RFC 9110 8.6)
            values = {v.strip(" \t") for v in headers["content-length"].split(",")}
            digits = values.pop()
            if values or not _DIGITS.fullmatch(digits):
                raise ProtocolError(f"bad Content-Length: {headers['content-length'][:40]!r}")
            digits = digits.lstrip("0")
            if len(digits) > 20 or int(digits or "0") >= _MAX_LENGTH:  # (int() refuses over 4300 digits)
                raise ProtocolError("Content-Length too large")
            length = int(digits or "0")
        if 100 <= self.status < 200:
            raise ProtocolError(f"unexpected interim response {self.status}")
        self.head = True
        if self._head_only or self.status in (204, 304):
            self._state = _DONE
            self.complete = True
        elif chunked:
            self._state = _CHUNK_SIZE
        elif length >= 0:
            self._left = length
            self._state = _LENGTH if length else _DONE
            self.complete = not length
        else:
            self._state = _UNTIL_CLOSE
            self.keep_alive = False

    # -- the body ---------------------------------------------------------------------

    def _length(self, data: bytes) -> bytes:
        left = self._left
        if len(data) < left:
            self._left = left - len(data)
            return data
        if len(data) > left:
            raise ProtocolError("the replica sent bytes after the end of its response")
        self._left = 0
        self._state = _DONE
        self.complete = True
        return data

    def _chunks(self, data: bytes) -> bytes:
        """Walk the chunked framing; the payloads found, joined."""
        out: list[bytes] = []
        pos = 0
        n = len(data)
        state = self._state
        while pos < n:
            if state == _CHUNK_SIZE:
                eol = data.find(b"\r\n", pos)
                if eol < 0:
                    self._keep(data[pos:], _MAX_SIZE_LINE, "a chunk size line is too long")
                    break
                line = data[pos:eol]
                # The common line, hex digits alone: isalnum() is ASCII-only for bytes, and int(x, 16)
                # refuses any letter past f but takes a 0x prefix (so a leading 0, past two bytes, is
                # the other way: the size grammar with its extensions).
                if line.isalnum() and len(line) <= 16 and (line[0] != 48 or len(line) < 3):
                    try:
                        size = int(line, 16)
                    except ValueError:
                        size = _chunk_size(line)
                else:
                    size = _chunk_size(line)
                pos = eol + 2
                if size == 0:
                    state = _TRAILERS
                    continue
                end = pos + size
                if end + 2 <= n:  # the whole chunk is here
                    if data[end : end + 2] != b"\r\n":
                        raise ProtocolError("a chunk does not end with CRLF")
                    out.append(data[pos:end])
                    pos = end + 2
                    continue
                self._left = size
                state = _CHUNK_DATA
            elif state == _CHUNK_DATA:
                take = min(self._left, n - pos)
                out.append(data[pos : pos + take])
                pos += take
                self._left -= take
                if not self._left:
                    state = _CHUNK_END
            elif state == _CHUNK_END:
                need = data[pos : pos + 2]
                if need != b"\r\n":
                    if need != b"\r":
                        raise ProtocolError("a chunk does not end with CRLF")
                    self._buf = need
                    break
                pos += 2
                state = _CHUNK_SIZE
            elif state == _TRAILERS:  # field lines, read and dropped, up to an empty one
                eol = data.find(b"\r\n", pos)
                if eol < 0:
                    self._keep(data[pos:], MAX_HEAD - self._trailers, "the replica's trailers are too long")
                    break
                if eol == pos:
                    state = _DONE
                else:
                    self._trailers += eol + 2 - pos
                    if self._trailers > MAX_HEAD:
                        raise ProtocolError("the replica's trailers are too long")
                    _fields([data[pos:eol].decode("latin-1")], 0, {})
                pos = eol + 2
            else:  # _DONE
                raise ProtocolError("the replica sent bytes after the end of its response")
        self._state = state
        if state == _DONE:
            self.complete = True
        return out[0] if len(out) == 1 else b"".join(out)

    def _keep(self, rest: bytes, limit: int, too_long: str) -> None:
        """Hold an unfinished line; a line that will be over `limit` whatever comes is an error now."""
        if len(rest) - 1 > limit:  # its last byte may be the CR of its CRLF
            raise ProtocolError(too_long)
        self._buf = rest


def _fields(lines: list[str], start: int, headers: dict[str, str]) -> None:
    """Field lines (from lines[start]) into `headers`: lower-cased names, values without the OWS
    around them, repeated fields joined with ", " (RFC 9110 5.3)."""
    for i in range(start, len(lines)):
        name, colon, value = lines[i].partition(":")
        key = _NAMES.get(name)
        if key is None or not colon:
            if not colon or _NAME.fullmatch(name) is None:
                if name[:1] in (" ", "\t"):
                    raise ProtocolError(f"obs-fold (a header line continued on the next): {lines[i][:80]!r}")
                raise ProtocolError(f"malformed header line: {lines[i][:80]!r}")
            key = name.lower()
            if len(_NAMES) < 256:
                _NAMES[name] = key
        value = value.strip(" \t")
        # isprintable(): only characters the grammar allows (it is False for HTAB, CTLs and some obs-text: the regex decides)
        if not value.isprintable() and _VALUE.fullmatch(value) is None:
            raise ProtocolError(f"malformed header line: {lines[i][:80]!r}")
        headers[key] = f"{headers[key]}, {value}" if key in headers else value


def _chunk_size(line: bytes) -> int:
    """The size on a chunk size line that is not hex digits alone: 1*HEXDIG, then extensions (ignored)."""
    text = line.decode("latin-1")
    match = _CHUNK_SIZE_LINE.fullmatch(text)
    if match is None or len(line) > _MAX_SIZE_LINE:
        raise ProtocolError(f"bad chunk size line: {line[:40]!r}")
    size = int(text[: match.start(1)], 16)
    if size >= _MAX_LENGTH:
        raise ProtocolError("a chunk size is too large")
    return size
