"""HTTP/1.1 chunked framing for bytes written straight to the transport.

Once aiohttp has sent a chunked response's headers (`prepare()`; `writer.can_write_direct`),
serve's push path, the gateway's relay and the keepalive ticker write frames to
the transport themselves: each is `size-in-hex CRLF data CRLF`. The size lines of
the usual sizes are made once (`SIZE_LINES`, indexed by the size below
`SIZE_LINES_N`): a per-token writer joins them inline, everything else calls
`chunk_frame`.
"""

from __future__ import annotations

SIZE_LINES_N = 2048
SIZE_LINES = [b"%x\r\n" % n for n in range(SIZE_LINES_N)]


def chunk_frame(data: bytes) -> bytes:
    """`data` as one HTTP/1.1 chunk (non-empty `data`: an empty chunk would end the body)."""
    size = len(data)
    return b"".join((SIZE_LINES[size], data, b"\r\n")) if size < SIZE_LINES_N else b"%x\r\n%b\r\n" % (size, data)
