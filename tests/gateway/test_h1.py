"""The gateway's HTTP/1.1 client core (`gateway/h1.py`), sans-IO: exact request bytes, and
responses fed whole, a byte at a time and in every two-way split, with the same result."""

from __future__ import annotations

import pytest

from streamproxy.gateway.h1 import MAX_HEAD, ProtocolError, ResponseParser, request_bytes

CHUNKED = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\nX-Dup: a\r\nx-dup: b\r\n\r\n"
    b"f\r\ndata: {\"a\":1}\n\n\r\n"
    b"f;ext=1\r\ndata: \xf0\x9f\x8c\x8a\xe2\x82\xac\n\n\r\n"  # a chunk extension, ignored; UTF-8 bytes untouched
    b"e\r\ndata: [DONE]\n\n\r\n"
    b"0\r\nX-Trailer: t\r\n\r\n"
)
CHUNKED_BODY = b'data: {"a":1}\n\n' + b"data: \xf0\x9f\x8c\x8a\xe2\x82\xac\n\n" + b"data: [DONE]\n\n"
LENGTH = b'HTTP/1.1 400 Bad Request\r\ncontent-length: 27\r\nRetry-After: 3\r\n\r\n{"error":{"message":"bad"}}'
UNTIL_CLOSE = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\ndata: 1\n\ndata: 2\n\n"


def parse(pieces: list[bytes], *, eof: bool = False) -> tuple[ResponseParser, bytes]:
    parser = ResponseParser()
    body = b"".join(parser.feed(p) for p in pieces)
    if eof:
        parser.feed_eof()
    return parser, body


def splits(raw: bytes) -> list[list[bytes]]:
    return [[raw], [raw[i : i + 1] for i in range(len(raw))]] + [[raw[:cut], raw[cut:]] for cut in range(1, len(raw))]


def test_request_bytes_are_exact():
    raw = request_bytes("POST", "/v1/chat/completions", "127.0.0.1:8001", {"Content-Type": "application/json", "X-Request-Id": "r1"}, b'{"a":1}')
    assert raw == (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:8001\r\nContent-Length: 7\r\n"
        b"Content-Type: application/json\r\nX-Request-Id: r1\r\n\r\n{\"a\":1}"
    )


@pytest.mark.parametrize("pieces", splits(CHUNKED), ids=lambda p: f"{len(p)}-pieces-{len(p[0])}")
def test_a_chunked_stream_in_any_split(pieces):
    parser, body = parse(pieces)
    assert body == CHUNKED_BODY
    assert (parser.status, parser.reason, parser.complete, parser.keep_alive) == (200, "OK", True, True)
    assert parser.headers == {"content-type": "text/event-stream", "transfer-encoding": "chunked", "x-dup": "a, b"}


@pytest.mark.parametrize("pieces", splits(LENGTH), ids=lambda p: f"{len(p)}-pieces-{len(p[0])}")
def test_a_content_length_body_in_any_split(pieces):
    parser, body = parse(pieces)
    assert body == b'{"error":{"message":"bad"}}'
    assert (parser.status, parser.headers["retry-after"], parser.complete, parser.keep_alive) == (400, "3", True, True)


def test_the_head_is_known_before_any_body_byte():
    parser = ResponseParser()
    assert parser.feed(CHUNKED[: CHUNKED.index(b"\r\n\r\n") + 3]) == b"" and not parser.head
    assert parser.feed(b"\n") == b"" and parser.head and parser.status == 200 and not parser.complete


@pytest.mark.parametrize("pieces", splits(UNTIL_CLOSE)[:8])
def test_a_body_read_until_close_ends_at_eof_and_the_connection_is_not_reused(pieces):
    parser, body = parse(pieces)
    assert body == b"data: 1\n\ndata: 2\n\n" and not parser.complete
    parser.feed_eof()
    assert parser.complete and not parser.keep_alive


@pytest.mark.parametrize(
    "raw, keep_alive",
    [
        (b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", True),
        (b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n", False),
        (b"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n", False),
        (b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 0\r\n\r\n", True),
        (b"HTTP/1.1 204 No Content\r\n\r\n", True),
    ],
)
def test_empty_bodies_and_keep_alive(raw, keep_alive):
    parser, body = parse([raw])
    assert (body, parser.complete, parser.keep_alive) == (b"", True, keep_alive)


def test_a_head_request_has_no_body_whatever_the_headers_say():
    parser = ResponseParser(head_only=True)
    assert parser.feed(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n") == b"" and parser.complete


@pytest.mark.parametrize(
    "raw, message",
    [
        (b"SSH-2.0-OpenSSH\r\n\r\n", "not an HTTP/1.x status line"),
        (b"HTTP/1.1 2000 OK\r\n\r\n", "not an HTTP/1.x status line"),
        (b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n", "malformed header line"),
        (b"HTTP/1.1 200 OK\r\n bad: folded\r\n\r\n", "malformed header line"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: ten\r\n\r\n", "bad Content-Length"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "bad chunk size line"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcX\r\n", "does not end with CRLF"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nabc", "after the end"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nHTTP/1.1", "after the end"),
        (b"HTTP/1.1 100 Continue\r\n\r\n", "unexpected interim response"),
    ],
)
def test_what_is_not_a_response_we_can_read_is_a_protocol_error(raw, message):
    with pytest.raises(ProtocolError, match=message):
        parse([raw])
    with pytest.raises(ProtocolError, match=message):  # the same, a byte at a time
        parse([raw[i : i + 1] for i in range(len(raw))])


def test_an_endless_head_is_refused():
    parser = ResponseParser()
    parser.feed(b"HTTP/1.1 200 OK\r\n")
    with pytest.raises(ProtocolError, match="too long"):
        parser.feed(b"X-Pad: " + b"a" * MAX_HEAD)


@pytest.mark.parametrize("raw", [CHUNKED[:-10], LENGTH[:-3], CHUNKED[:20]])
def test_eof_before_the_end_is_an_error(raw):
    parser, _ = parse([raw])
    with pytest.raises(ProtocolError, match="before the end"):
        parser.feed_eof()
