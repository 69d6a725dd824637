"""HTTP/1.1, the client side, sans-IO: a request's bytes, and a response parser fed bytes.

`request_bytes` writes a request head and body. `ResponseParser.feed(data)`
takes whatever one read gave (any split: a byte at a time or many messages'
worth) and returns the body bytes found in it, decoded from its framing
(Content-Length, chunked, or until the connection closes); `head` says when
the status line and headers are in (`status`, `headers` with lower-cased
names), `complete` when the body ended, `keep_alive` whether the connection
may carry another request. `feed_eof` ends a body read until close, and is an
error for any other body cut short. Bytes after the end of the response are an
error too (a replica does not push unasked answers). Nothing here knows of
sockets or time: `wire` does the I/O.
"""

from __future__ import annotations

MAX_HEAD = 64 * 1024  # a replica's status line and headers, at most (nginx's proxy_buffer_size is smaller)
_MAX_SIZE_LINE = 1024


class ProtocolError(ValueError):
    """The replica's bytes are not an HTTP/1.1 response we can read."""


def request_bytes(method: str, target: str, host: str, headers: dict[str, str], body: bytes) -> bytes:
    lines = [f"{method} {target} HTTP/1.1", f"Host: {host}", f"Content-Length: {len(body)}"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


# Parser states.
_HEAD, _LENGTH, _CHUNK_SIZE, _CHUNK_DATA, _CHUNK_END, _TRAILERS, _UNTIL_CLOSE, _DONE = range(8)


class ResponseParser:
    __slots__ = ("status", "reason", "headers", "keep_alive", "head", "complete", "_state", "_buf", "_left", "_head_only")

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
        data = self._buf + data if self._buf else data
        self._buf = b""
        if state == _HEAD:
            end = data.find(b"\r\n\r\n")
            if end < 0:
                if len(data) > MAX_HEAD:
                    raise ProtocolError("the replica's response head is too long")
                self._buf = data
                return b""
            self._read_head(data[:end])
            data = data[end + 4 :]
            if self._state == _DONE:
                if data:
                    raise ProtocolError("the replica sent bytes after the end of its response")
                return b""
            if self._state == _UNTIL_CLOSE:
                return data
            if self._state == _LENGTH:
                return self._length(data)
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

    def _read_head(self, head: bytes) -> None:
        try:
            text = head.decode("latin-1")
        except UnicodeDecodeError:  # pragma: no cover - latin-1 decodes any byte
            raise ProtocolError("unreadable response head") from None
        lines = text.split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit() or len(parts[1]) != 3:
            raise ProtocolError(f"not an HTTP/1.x status line: {lines[0][:80]!r}")
        version, self.status, self.reason = parts[0], int(parts[1]), parts[2] if len(parts) > 2 else ""
        headers = self.headers
        for line in lines[1:]:
            name, colon, value = line.partition(":")
            if not colon or not name or name != name.strip():
                raise ProtocolError(f"malformed header line: {line[:80]!r}")
            key = name.lower()
            value = value.strip()
            headers[key] = f"{headers[key]}, {value}" if key in headers else value
        connection = headers.get("connection", "").lower()
        self.keep_alive = "close" not in connection if version == "HTTP/1.1" else "keep-alive" in connection
        self.head = True
        if self._head_only or self.status in (204, 304) or 100 <= self.status < 200:
            if 100 <= self.status < 200:
                raise ProtocolError(f"unexpected interim response {self.status}")
            self._state = _DONE
            self.complete = True
        elif "chunked" in headers.get("transfer-encoding", "").lower():
            self._state = _CHUNK_SIZE
        elif "content-length" in headers:
            length = headers["content-length"]
            if not length.isdigit():
                raise ProtocolError(f"bad Content-Length: {length[:40]!r}")
            self._left = int(length)
            self._state = _LENGTH if self._left else _DONE
            self.complete = not self._left
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
                    self._keep(data[pos:])
                    pos = n
                    break
                line = data[pos:eol]
                semi = line.find(b";")  # chunk extensions: ignored
                try:
                    size = int(line if semi < 0 else line[:semi], 16)
                except ValueError:
                    raise ProtocolError(f"bad chunk size line: {line[:40]!r}") from None
                if size < 0:
                    raise ProtocolError("negative chunk size")
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
                if len(need) < 2:
                    self._keep(need)
                    pos = n
                    break
                if need != b"\r\n":
                    raise ProtocolError("a chunk does not end with CRLF")
                pos += 2
                state = _CHUNK_SIZE
            elif state == _TRAILERS:  # trailer lines (ignored) up to an empty one
                eol = data.find(b"\r\n", pos)
                if eol < 0:
                    self._keep(data[pos:])
                    pos = n
                    break
                if eol == pos:
                    state = _DONE
                pos = eol + 2
            else:  # _DONE
                raise ProtocolError("the replica sent bytes after the end of its response")
        self._state = state
        if state == _DONE:
            self.complete = True
        return out[0] if len(out) == 1 else b"".join(out)

    def _keep(self, rest: bytes) -> None:
        if len(rest) > _MAX_SIZE_LINE:
            raise ProtocolError("a chunk size or trailer line is too long")
        self._buf = rest
