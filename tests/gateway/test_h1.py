"""The gateway's HTTP/1.1 client core (`gateway/h1.py`), sans-IO: exact request bytes, and
responses fed whole, a byte at a time and in every two-way split, with the same result;
every malformed response a ProtocolError (never another exception), whatever the split.
(tests/fuzz/test_h1_differential.py holds the parser against llhttp.)"""

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
        (b"HTTP/1.1 200 OK\r\n bad: folded\r\n\r\n", "obs-fold"),
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


def refused(raw: bytes, message: str, *, eof: bool = False) -> None:
    """`raw` is a ProtocolError saying `message`, fed whole, a byte at a time, and in every two-way split."""
    for pieces in splits(raw):
        with pytest.raises(ProtocolError, match=message):
            parse(pieces, eof=eof)


# Inputs that raised a bare ValueError (not a ProtocolError) out of feed(): str.isdigit() takes
# superscript digits that int() refuses, and int() refuses strings of over 4300 digits.
@pytest.mark.parametrize(
    "raw, message",
    [
        (b"HTTP/1.1 2\xb20 OK\r\nContent-Length: 0\r\n\r\n", "not an HTTP/1.x status line"),
        (b"HTTP/1.1 \xb9\xb2\xb3 OK\r\nContent-Length: 0\r\n\r\n", "not an HTTP/1.x status line"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: \xb2\r\n\r\n", "bad Content-Length"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 1\xb9\r\n\r\n", "bad Content-Length"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: " + b"1" * 5000 + b"\r\n\r\n", "Content-Length too large"),
    ],
    ids=["status-superscript", "status-all-superscript", "length-superscript", "length-digit-superscript", "length-5000-digits"],
)
def test_former_value_errors_are_protocol_errors(raw, message):
    refused(raw, message)


# Chunk sizes Python's int(x, 16) took and RFC 9112 7.1 (chunk-size = 1*HEXDIG) does not.
@pytest.mark.parametrize("size", [b"0x3", b"0X3", b"1_0", b" 3", b"+3", b"3 ", b"3\t", b"-3", b"\t3", b"0x_3"])
def test_loose_chunk_sizes_are_refused(size):
    refused(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + size + b"\r\nabcdefghijklmnop\r\n0\r\n\r\n", "bad chunk size line")


TE = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"


@pytest.mark.parametrize(
    "raw, message",
    [
        # the status line
        (b"HTTP/1.2 200 OK\r\n\r\n", "status line"),
        (b"HTTP/2.0 200 OK\r\n\r\n", "status line"),
        (b"http/1.1 200 OK\r\n\r\n", "status line"),
        (b"HTTP/1.1  200 OK\r\n\r\n", "status line"),
        (b"HTTP/1.1 20 OK\r\n\r\n", "status line"),
        (b"HTTP/1.1 099 OK\r\n\r\n", "status line"),
        (b"HTTP/1.1 600 OK\r\n\r\n", "status line"),
        (b"HTTP/1.1 200 O\x01K\r\n\r\n", "status line"),
        (b"HTTP/1.1 200 O\x7fK\r\n\r\n", "status line"),
        (b"HTTP/1.1 200 O\rK\r\n\r\n", "status line"),
        (b"HTTP/1.1 200 OK\nContent-Length: 0\r\n\r\n", "status line"),
        (b"\r\nHTTP/1.1 200 OK\r\n\r\n", "status line"),
        (b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\n\r\n", "unexpected interim response"),
        # field lines
        (b"HTTP/1.1 200 OK\r\nContent-Length : 0\r\n\r\n", "malformed header line"),
        (b"HTTP/1.1 200 OK\r\nX(: a\r\n\r\n", "malformed header line"),
        (b"HTTP/1.1 200 OK\r\nX\x80: a\r\n\r\n", "malformed header line"),
        (b"HTTP/1.1 200 OK\r\n: a\r\n\r\n", "malformed header line"),
        (b"HTTP/1.1 200 OK\r\nX: a\r\n\tb\r\nContent-Length: 0\r\n\r\n", "obs-fold"),
        (b"HTTP/1.1 200 OK\r\nX: a\x00b\r\n\r\n", "malformed header line"),
        (b"HTTP/1.1 200 OK\r\nX: a\x0bb\r\n\r\n", "malformed header line"),
        (b"HTTP/1.1 200 OK\r\nX: a\x7fb\r\n\r\n", "malformed header line"),
        (b"HTTP/1.1 200 OK\r\nX: a\rb\r\n\r\n", "malformed header line"),
        (b"HTTP/1.1 200 OK\r\nX: a\nContent-Length: 0\r\n\r\n", "malformed header line"),
        # Content-Length and Transfer-Encoding
        (b"HTTP/1.1 200 OK\r\nContent-Length: +3\r\n\r\nabc", "bad Content-Length"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 0x3\r\n\r\nabc", "bad Content-Length"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: \r\n\r\n", "bad Content-Length"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 3 3\r\n\r\nabc", "bad Content-Length"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabc", "bad Content-Length"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 3, 4\r\n\r\nabc", "bad Content-Length"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 1, 01\r\n\r\na", "bad Content-Length"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 1,\r\n\r\na", "bad Content-Length"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 18446744073709551616\r\n\r\n", "too large"),
        (b"HTTP/1.1 204 No Content\r\nContent-Length: x\r\n\r\n", "bad Content-Length"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n", "both"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n", "unsupported Transfer-Encoding"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n", "unsupported Transfer-Encoding"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, chunked\r\n\r\n0\r\n\r\n", "unsupported Transfer-Encoding"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", "unsupported Transfer-Encoding"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: xchunked\r\n\r\n", "unsupported Transfer-Encoding"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked,\r\n\r\n0\r\n\r\n", "unsupported Transfer-Encoding"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked;q=1\r\n\r\n0\r\n\r\n", "unsupported Transfer-Encoding"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding:\r\n\r\n", "unsupported Transfer-Encoding"),
        # chunks
        (TE + b"3;\r\nabc\r\n0\r\n\r\n", "bad chunk size line"),
        (TE + b"3;a=(\r\nabc\r\n0\r\n\r\n", "bad chunk size line"),
        (TE + b'3;a="b\r\nabc\r\n0\r\n\r\n', "bad chunk size line"),
        (TE + b"3;a=b \r\nabc\r\n0\r\n\r\n", "bad chunk size line"),
        (TE + b"\r\n", "bad chunk size line"),
        (TE + b"3\nabc\r\n0\r\n\r\n", "bad chunk size line"),
        (TE + b"1" * 17 + b"\r\n", "too large"),
        (TE + b"3;" + b"a" * 1100 + b"\r\nabc\r\n0\r\n\r\n", "bad chunk size line|too long"),
        (TE + b"3" + b";a" * 500 + b" \r\nabc\r\n0\r\n\r\n", "bad chunk size line"),  # (one pass: possessive patterns)
        (TE + b"3\r\nabc\n0\r\n\r\n", "does not end with CRLF"),
        (TE + b"3\r\nabc\r0\r\n\r\n", "does not end with CRLF"),
        (TE + b"3\r\nabc0\r\n\r\n", "does not end with CRLF"),
        # trailers
        (TE + b"0\r\nX : t\r\n\r\n", "malformed header line"),
        (TE + b"0\r\nX: t\x00\r\n\r\n", "malformed header line"),
        (TE + b"0\r\n\n", "before the end"),  # a bare LF: the line never ends
        (TE + b"0\r\n\nX: 1\r\n\r\n", "malformed header line"),
        (TE + b"0\r\n\r\n\r\n", "after the end"),
    ],
)
def test_malformed_responses_are_protocol_errors_in_any_split(raw, message):
    refused(raw, message, eof=True)


@pytest.mark.parametrize(
    "raw, body, headers",
    [
        (b"HTTP/1.1 200\r\nContent-Length: 1\r\n\r\na", b"a", {"content-length": "1"}),  # no reason, no SP
        (b"HTTP/1.1 200 \r\nContent-Length:1\r\n\r\na", b"a", {"content-length": "1"}),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\na", b"a", {"content-length": "1, 1"}),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 01, 01\t\r\n\r\na", b"a", {"content-length": "01, 01"}),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 18446744073709551615\r\n\r\n", b"", {"content-length": "18446744073709551615"}),
        (b"HTTP/1.1 200 OK\r\nX:\t \xe9 \x80\xff\t\r\nY:\r\nContent-Length: 0\r\n\r\n", b"",
         {"x": "\xe9 \x80\xff", "y": "", "content-length": "0"}),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding:\tChunked \t\r\n\r\n"
         + b"3 ; a = b ;c; d=\"q\\\" \\x\"\r\nabc\r\n" + b"0" * 30 + b"2;x\r\nde\r\n0;e\r\nT: 1\r\n\r\n",
         b"abcde", {"transfer-encoding": "Chunked"}),
        (TE + b"ffffffffffffffff\r\nabc", b"abc", {"transfer-encoding": "chunked"}),
    ],
    ids=["no-reason", "empty-reason", "same-length-twice", "same-length-listed", "largest-length", "field-values",
         "chunk-extensions", "largest-chunk"],
)
def test_what_the_grammar_allows_is_read_in_any_split(raw, body, headers):
    for pieces in splits(raw):
        parser, got = parse(pieces)
        assert (parser.status, got, parser.headers) == (200, body, headers)


@pytest.mark.parametrize(
    "connection, version, keep_alive",
    [("closed", b"1.1", True), ("keep-alive, close", b"1.1", False), ("Upgrade, CLOSE", b"1.1", False),
     ("keep-alive-ish", b"1.0", False), ("upgrade,keep-alive", b"1.0", True)],
)
def test_connection_is_a_list_of_tokens(connection, version, keep_alive):
    parser, _ = parse([b"HTTP/%s 200 OK\r\nConnection: %s\r\nContent-Length: 0\r\n\r\n" % (version, connection.encode())])
    assert parser.keep_alive is keep_alive


def test_the_head_limit_holds_in_any_split():
    line = b"X: " + b"a" * (MAX_HEAD - len(b"HTTP/1.1 200 OK\r\n") - len(b"X: ")) + b"\r\n\r\n"
    at_limit = b"HTTP/1.1 200 OK\r\n" + line  # the head, without its blank line, is MAX_HEAD bytes
    over = at_limit.replace(b"X: ", b"X: a")
    for cut in (1, MAX_HEAD - 2, MAX_HEAD, MAX_HEAD + 1, MAX_HEAD + 3, len(at_limit)):
        parser, _ = parse([at_limit[:cut], at_limit[cut:]], eof=True)
        assert parser.complete
        with pytest.raises(ProtocolError, match="head is too long"):
            parse([over[:cut], over[cut:]])


def test_trailers_are_bounded_in_any_split():
    trailers = b"".join(b"T%d: %s\r\n" % (i, b"v" * 1000) for i in range(70))  # past MAX_HEAD in all
    raw = TE + b"0\r\n" + trailers + b"\r\n"
    for pieces in ([raw], [raw[i : i + 100] for i in range(0, len(raw), 100)]):
        with pytest.raises(ProtocolError, match="trailers are too long"):
            parse(pieces)
