"""The gateway's response parser (`gateway/h1.py`) against llhttp (through httptools), fed the same bytes.

Inputs: valid responses built from the grammar (every framing, chunk extensions,
trailers, OWS, obs-text), the same mutated a few bytes at a time where the
grammar has its edges (around CR, LF, colons, semicolons, spaces, digits, or
a whole dangerous header line put in), and random bytes. Ours is fed each
input whole, in random pieces and a byte at a time, then told of the close:
the three must agree exactly. llhttp is fed it a byte at a time and stopped
at the end of its first response.

Then both must give the same verdict (a response read, or an error), and when
both read one, the same status, reason, headers (names lower-cased, values
without the OWS around them, repeated fields joined with ", "), keep-alive
and body. Where the two disagree on purpose, the difference is one of
DIFFERENCES below, each named, explained, and tied to the input's feature
that causes it and to the side that refuses it: nothing is skipped silently,
and `test_each_difference_is_real` shows llhttp still behaves that way.

httptools exposes no `llhttp_finish`: at the end of the input a response
that llhttp has not finished is read until the close exactly when
llhttp_message_needs_eof (llhttp's src/native/http.c) says so; `_needs_eof`
is that function over the headers llhttp reported.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

import httptools
import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamproxy.gateway.h1 import MAX_HEAD, ProtocolError, ResponseParser
from tests.fuzz.fuzz_support import budget, chunkings


@dataclass(frozen=True)
class Outcome:
    ok: bool
    status: int = 0
    reason: str = ""
    headers: tuple[tuple[str, str], ...] = ()
    keep_alive: bool | None = None
    body: bytes = b""
    why: str = field(default="", compare=False)  # the error
    rest: bytes = field(default=b"", compare=False)  # what llhttp left unread after its response


def ours(pieces: list[bytes]) -> Outcome:
    parser = ResponseParser()
    body = []
    try:
        for piece in pieces:
            body.append(parser.feed(piece))
        keep_alive = parser.keep_alive
        parser.feed_eof()
    except ProtocolError as exc:  # any other exception fails the test
        return Outcome(False, why=str(exc))
    return Outcome(True, parser.status, parser.reason, tuple(parser.headers.items()), keep_alive, b"".join(body))


class _Llhttp:
    """httptools' callbacks, recorded."""

    def __init__(self) -> None:
        self.reason = b""
        self.fields: list[tuple[bytes, bytes]] = []
        self.head = False
        self.keep_alive: bool | None = None
        self.body = b""
        self.complete = False
        self.parser = httptools.HttpResponseParser(self)

    def on_status(self, data: bytes) -> None:
        self.reason += data

    def on_header(self, name: bytes, value: bytes) -> None:
        if not self.head:  # after the head: trailers, which neither side keeps
            self.fields.append((name, value))

    def on_headers_complete(self) -> None:
        self.head = True
        self.keep_alive = self.parser.should_keep_alive()

    def on_body(self, data: bytes) -> None:
        self.body += data

    def on_message_complete(self) -> None:
        self.complete = True


def llhttp(raw: bytes) -> Outcome:
    sink = _Llhttp()
    for at in range(len(raw)):
        if sink.complete:
            break
        try:
            sink.parser.feed_data(raw[at : at + 1])
        except httptools.HttpParserUpgrade:
            return Outcome(False, why="upgrade")
        except httptools.HttpParserError as exc:
            return Outcome(False, why=str(exc))
    else:
        at = len(raw)
    if not sink.complete and not (sink.head and _needs_eof(sink.parser.get_status_code(), sink.fields)):
        return Outcome(False, why="Invalid EOF state")
    headers: dict[str, str] = {}
    for name, value in sink.fields:
        key, text = name.decode("latin-1").lower(), value.decode("latin-1").strip(" \t")
        headers[key] = f"{headers[key]}, {text}" if key in headers else text
    return Outcome(True, sink.parser.get_status_code(), sink.reason.decode("latin-1"), tuple(headers.items()), sink.keep_alive,
                   sink.body, rest=raw[at:])


def _needs_eof(status: int, fields: list[tuple[bytes, bytes]]) -> bool:
    if status // 100 == 1 or status in (204, 304):
        return False
    codings = [v for n, v in fields if n.lower() == b"transfer-encoding"]
    if codings:  # F_CHUNKED: `chunked` last in the last field, with spaces (not HTAB) after it
        return _LLHTTP_CHUNKED.fullmatch(codings[-1]) is None
    return not any(n.lower() == b"content-length" for n, _ in fields)


_LLHTTP_CHUNKED = re.compile(rb"(?:.*,)?[ \t]*chunked *", re.IGNORECASE | re.DOTALL)


# --- the deliberate differences ---------------------------------------------------


class Difference(NamedTuple):
    name: str
    why: str
    refused_by: tuple[str, ...]  # "ours" or "llhttp": the side that refuses what the other reads; "neither": both read it, differently
    applies: Callable[[bytes, Outcome, Outcome], bool]  # (input, ours, llhttp's) -> it is this difference


_STATUS = re.compile(rb"HTTP/(\d)\.(\d) (\d\d\d)(?: ([^\r\n]*))?\r\n")


def _status_line(raw: bytes) -> re.Match[bytes] | None:
    return _STATUS.match(raw)


def _version(raw: bytes, mine: Outcome, theirs: Outcome) -> bool:
    m = _status_line(raw)
    return m is not None and (m[1], m[2]) not in ((b"1", b"0"), (b"1", b"1"))


def _reason(raw: bytes, mine: Outcome, theirs: Outcome) -> bool:
    m = _status_line(raw)
    return m is not None and m[4] is not None and re.search(rb"[\x00-\x08\x0a-\x1f\x7f]", m[4]) is not None


def _chunk_lines(raw: bytes) -> list[bytes]:
    """The chunk size lines of a chunked response that ours read."""
    pos, lines = raw.index(b"\r\n\r\n") + 4, []
    while True:
        eol = raw.index(b"\r\n", pos)
        line = raw[pos:eol]
        lines.append(line)
        size = int(re.match(rb"[0-9A-Fa-f]+", line)[0], 16)  # type: ignore[index]
        if size == 0:
            return lines
        pos = eol + 2 + size + 2


def _bws(raw: bytes, mine: Outcome, theirs: Outcome) -> bool:
    headers = dict(mine.headers)
    return "transfer-encoding" in headers and any(re.search(rb"[ \t][;=]|[;=][ \t]", line) for line in _chunk_lines(raw))


def _ext_grammar(raw: bytes, mine: Outcome, theirs: Outcome) -> bool:
    """We refused a chunk size line whose size is fine: the dispute is in its extensions."""
    if not mine.why.startswith("bad chunk size line: "):
        return False
    line = ast.literal_eval(mine.why.removeprefix("bad chunk size line: "))
    return re.match(rb"[0-9A-Fa-f]+;", line) is not None


DIFFERENCES = [
    Difference("VERSIONS", "llhttp reads HTTP/0.9 and HTTP/2.0 status lines as well; a replica speaks HTTP/1.0 or 1.1, "
               "and anything else is not a response we know how to frame", ("ours",), _version),
    Difference("STATUS_RANGE", "llhttp takes any three digits; RFC 9110 15: valid status codes are 100 to 599", ("ours",),
               lambda raw, mine, theirs: not 100 <= theirs.status <= 599),
    Difference("REASON_CHARS", "llhttp takes any byte but CR and LF in the reason phrase; RFC 9112 4: reason-phrase is "
               "HTAB / SP / VCHAR / obs-text (no NUL, no other CTL)", ("ours",), _reason),
    Difference("LEADING_EMPTY_LINES", "llhttp skips CR and LF bytes before the status line (RFC 9112 2.2 lets a server "
               "skip empty lines before a request); a response starts with its status line", ("ours",),
               lambda raw, mine, theirs: raw.startswith((b"\r", b"\n"))),
    Difference("INTERIM", "llhttp reads a 1xx as a whole response (and 101 as an upgrade); we ask for no interim "
               "response and no upgrade, so one is an error", ("ours",), lambda raw, mine, theirs: 100 <= theirs.status <= 199),
    Difference("TRANSFER_CODINGS", "llhttp reads a body in codings other than chunked until the close, and takes "
               "chunked more than once; we cannot undo another coding (the body would go out still coded) and RFC "
               "9112 6.1 forbids chunked twice, so any Transfer-Encoding but one `chunked` is refused", ("ours",),
               lambda raw, mine, theirs: mine.why.startswith("unsupported Transfer-Encoding")),
    Difference("DATA_AFTER_END", "llhttp would read the bytes after a response as the next one (pipelining, stray "
               "CRLFs skipped); we ask one request at a time, so they are an error", ("ours",),
               lambda raw, mine, theirs: bool(theirs.rest) and "after the end" in mine.why),
    Difference("HEAD_LIMITS", "llhttp has no limit on the head or the trailers; ours are MAX_HEAD bytes each", ("ours",),
               lambda raw, mine, theirs: "too long" in mine.why),
    Difference("REPEATED_CONTENT_LENGTH", "llhttp refuses every repeated Content-Length (and a list in one field); RFC "
               "9110 8.6 lets a recipient take the same value repeated, as we do (different values are an error on "
               "both sides)", ("llhttp",), lambda raw, mine, theirs: "," in dict(mine.headers).get("content-length", "")),
    Difference("TE_TRAILING_HTAB", "llhttp does not take `chunked` followed by an HTAB for chunked (it trims a space, "
               "not an HTAB) and reads the body until the close; RFC 9110 5.5: the OWS around a field value (SP or "
               "HTAB) is not part of it, so the body is chunked (and may break the chunked grammar)", ("neither", "ours"),
               lambda raw, mine, theirs: re.search(rb"(?i)\r\ntransfer-encoding:[ \t]*chunked *\t", raw) is not None),
    Difference("CONTENT_LENGTH_TRAILER", "llhttp refuses a Content-Length trailer field in a chunked response (its "
               "check of the header section runs over the trailers too); RFC 9110 6.5.1: trailers do not frame the "
               "message, and we drop every trailer", ("llhttp",),
               lambda raw, mine, theirs: theirs.why == "Content-Length can't be present with Transfer-Encoding"
               and "content-length" not in dict(mine.headers)),
    Difference("CHUNK_EXT_GRAMMAR", "llhttp takes empty extension names and values (`1;;a`, `1;=b`, `1;a=`) and a "
               "quote in a token value (`1;a=b\"x\"`); RFC 9112 7.1.1: a chunk-ext-name is a token, a chunk-ext-val a "
               "token or a quoted-string", ("ours",), _ext_grammar),
    Difference("CHUNK_EXT_BWS", "llhttp refuses whitespace around `;` and `=` in chunk extensions; RFC 9112 7.1.1 "
               "has BWS there (a recipient must parse and remove it), so we read it", ("llhttp",), _bws),
]


def explained(raw: bytes, mine: Outcome, theirs: Outcome) -> list[str]:
    """The differences that account for `mine` and `theirs` disagreeing on `raw`."""
    refused_by = "neither" if mine.ok and theirs.ok else "llhttp" if mine.ok else "ours"
    return [d.name for d in DIFFERENCES if refused_by in d.refused_by and d.applies(raw, mine, theirs)]


def check(raw: bytes, pieces: list[bytes]) -> None:
    mine = ours([raw])
    assert ours(pieces) == mine, pieces
    assert ours([raw[i : i + 1] for i in range(len(raw))]) == mine
    theirs = llhttp(raw)
    if mine != theirs:
        assert explained(raw, mine, theirs), f"\n{raw!r}\n  ours:   {mine}\n  llhttp: {theirs}"


# --- inputs ------------------------------------------------------------------------

_TCHARS = b"!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
_tokens = st.binary(min_size=1, max_size=6).map(lambda b: bytes(_TCHARS[c % len(_TCHARS)] for c in b))
_VCHARS = bytes([9, *range(0x20, 0x7F), *range(0x80, 0x100)])
_texts = st.binary(max_size=12).map(lambda b: bytes(_VCHARS[c % len(_VCHARS)] for c in b).strip(b" \t"))
_ows = st.sampled_from([b"", b"", b" ", b"\t", b"  ", b" \t"])

_names = st.sampled_from([b"Content-Type", b"X-Request-Id", b"Retry-After", b"Connection", b"Cache-Control", b"x-dup", b"X-DUP"]) | _tokens
_values = st.sampled_from([b"text/event-stream", b"application/json", b"close", b"keep-alive", b"Keep-Alive, x", b"", b"a, b",
                           b"caf\xe9", b"\x80\xff", b"1"]) | _texts
_quoted = st.sampled_from([b'""', b'"a b"', b'"a\\"b"', b'"\\\\"', b'"\xe9\t"'])
_extensions = st.lists(
    st.tuples(_tokens, st.none() | _tokens | _quoted, st.sampled_from([b""] * 30 + [b" ", b"\t"])).map(
        lambda e: e[2] + b";" + e[2] + e[0] + (b"" if e[1] is None else e[2] + b"=" + e[2] + e[1])),
    max_size=2,
).map(b"".join)
_bodies = st.binary(max_size=48) | st.sampled_from([b'data: {"a":1}\n\n', b"data: [DONE]\n\n", b"\r\n", b"0\r\n\r\n", b""])


@st.composite
def _chunk(draw: st.DrawFn, data: bytes) -> bytes:
    size = draw(st.sampled_from([b"%x", b"%X"])) % len(data)
    return b"0" * draw(st.integers(0, 2)) + size + draw(_extensions) + b"\r\n" + data + b"\r\n"


@st.composite
def responses(draw: st.DrawFn) -> bytes:
    """A response the grammar allows (at times with what only one side allows: see DIFFERENCES)."""
    version = draw(st.sampled_from([b"1.1", b"1.1", b"1.0"]))
    status = draw(st.sampled_from([200, 200, 200, 201, 204, 304, 400, 404, 429, 500, 503, 599]))
    reason = draw(st.none() | st.sampled_from([b"OK", b"", b"Not Found", b"Too Many\tRequests", b"caf\xe9", b" x "]))
    head = b"HTTP/%s %d" % (version, status) + (b"" if reason is None else b" " + reason) + b"\r\n"
    for name, value in draw(st.lists(st.tuples(_names, _values), max_size=4)):
        head += name + b":" + draw(_ows) + value + draw(_ows) + b"\r\n"
    body = draw(_bodies)
    framing = draw(st.sampled_from(["length", "length", "chunked", "chunked", "chunked", "close"]))
    if framing == "length":
        head += b"Content-Length:" + draw(_ows) + b"%d" % len(body) + draw(_ows) + b"\r\n"
        if draw(st.integers(0, 19)) == 0:  # the same again (REPEATED_CONTENT_LENGTH)
            head += b"Content-Length: %d\r\n" % len(body)
        return head + b"\r\n" + (b"" if status in (204, 304) else body)
    if framing == "close":
        return head + b"\r\n" + (b"" if status in (204, 304) else body)
    te = draw(st.sampled_from([b"chunked", b"Chunked", b"CHUNKED"]))
    head += b"Transfer-Encoding:" + draw(_ows) + te + draw(st.sampled_from([b""] * 12 + [b" ", b"\t"])) + b"\r\n"  # (TE_TRAILING_HTAB)
    if status in (204, 304):
        return head + b"\r\n"
    cuts = sorted(set(draw(st.lists(st.integers(1, max(1, len(body) - 1)), max_size=3))))
    pieces = [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True) if body[a:b]]
    chunks = b"".join([draw(_chunk(p)) for p in pieces])
    last = b"0" * draw(st.integers(1, 2)) + draw(_extensions) + b"\r\n"
    trailers = b"".join(n + b":" + draw(_ows) + v + b"\r\n" for n, v in draw(st.lists(st.tuples(_names, _values), max_size=2)))
    return head + b"\r\n" + chunks + last + trailers + b"\r\n"


# Bytes at the grammar's edges, and whole lines that change the framing.
_EDGE_BYTES = st.sampled_from([b"\r", b"\n", b"\r\n", b"\x00", b" ", b"\t", b":", b";", b"=", b'"', b"\\", b",", b"0", b"9",
                               b"x", b"X", b"_", b"+", b"-", b"F", b"g", b"\x7f", b"\x80", b"\xff", b"\x0b", b"\x0c", b"1.", b"/"])
_LINES = st.sampled_from([b"Content-Length: 3", b"Content-Length: +3", b"Content-Length: 0x3", b"Content-Length: 3, 3",
                          b"Content-Length: 3, 4", b"Content-Length:", b"Transfer-Encoding: chunked", b"Transfer-Encoding: gzip",
                          b"Transfer-Encoding: gzip, chunked", b"Transfer-Encoding: chunked, gzip", b"Connection: close",
                          b"Connection: keep-alive", b" folded", b"\tfolded", b"X : y", b"X\x00: y", b": y", b"X: a\rb",
                          b"HTTP/1.1 200 OK", b"0", b"3;a", b"3 ;a"])
_STRUCTURE = b"\r\n:; \t=\""


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    """A valid response changed in one to three places, most of them next to a structural byte."""
    raw = draw(responses())
    for _ in range(draw(st.sampled_from([1, 1, 1, 2, 3]))):
        edges: list[int] = [i + d for i, c in enumerate(raw) if c in _STRUCTURE for d in (0, 1)]
        near_edge = bool(edges) and draw(st.integers(0, 3)) > 0
        at = min(draw(st.sampled_from(edges)), len(raw)) if near_edge else draw(st.integers(0, len(raw)))
        op = draw(st.sampled_from(["insert", "insert", "delete", "replace", "replace", "line", "repeat", "cut"]))
        if op == "insert":
            raw = raw[:at] + draw(_EDGE_BYTES | st.binary(min_size=1, max_size=2)) + raw[at:]
        elif op == "delete":
            raw = raw[:at] + raw[at + draw(st.integers(1, 2)) :]
        elif op == "replace":
            raw = raw[:at] + draw(_EDGE_BYTES | st.binary(min_size=1, max_size=1)) + raw[at + 1 :]
        elif op == "line":  # a whole line, after a CRLF
            crlfs = [m.end() for m in re.finditer(rb"\r\n", raw)]
            if crlfs:
                at = draw(st.sampled_from(crlfs))
                raw = raw[:at] + draw(_LINES) + b"\r\n" + raw[at:]
        elif op == "repeat":
            raw = raw[:at] + raw[at : at + draw(st.integers(1, 8))] + raw[at:]
        else:
            raw = raw[:at]
    return raw


_random = st.binary(max_size=80) | st.binary(max_size=60).map(lambda b: b"HTTP/1.1 " + b) | st.binary(max_size=40).map(
    lambda b: b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + b)


# --- the properties ----------------------------------------------------------------


@budget(150)
@given(st.data(), responses())
def test_valid_responses_read_the_same(data, raw):
    check(raw, data.draw(chunkings(raw)))


@budget(400)
@given(st.data(), mutated())
def test_mutated_responses_get_the_same_verdict(data, raw):
    check(raw, data.draw(chunkings(raw)))


@budget(100)
@given(st.data(), _random)
def test_random_bytes_get_the_same_verdict(data, raw):
    check(raw, data.draw(chunkings(raw)))


@pytest.mark.parametrize(
    "raw",
    [
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0x3\r\nabc\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1_0\r\nabcdefghijklmnop\r\n0\r\n\r\n",
        b"HTTP/1.1 2\xb20 OK\r\nContent-Length: 0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: \xb9\r\n\r\n",
    ],
    ids=["chunk-0x3", "chunk-1_0", "status-superscript", "length-superscript"],
)
def test_what_the_issue_found_gets_llhttps_verdict(raw):
    check(raw, [raw])
    assert not ours([raw]).ok


# Each difference, shown on one input: llhttp still behaves so, and the difference explains it.
SHOWN = {
    "VERSIONS": b"HTTP/2.0 200 OK\r\nContent-Length: 0\r\n\r\n",
    "STATUS_RANGE": b"HTTP/1.1 600 OK\r\nContent-Length: 0\r\n\r\n",
    "REASON_CHARS": b"HTTP/1.1 200 O\x01K\r\nContent-Length: 0\r\n\r\n",
    "LEADING_EMPTY_LINES": b"\r\nHTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
    "INTERIM": b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n",
    "TRANSFER_CODINGS": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\nabc",
    "DATA_AFTER_END": b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nab",
    "HEAD_LIMITS": b"HTTP/1.1 200 OK\r\nX: " + b"a" * MAX_HEAD + b"\r\nContent-Length: 0\r\n\r\n",
    "REPEATED_CONTENT_LENGTH": b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\na",
    "TE_TRAILING_HTAB": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\t\r\n\r\n1\r\na\r\n0\r\n\r\n",
    "CONTENT_LENGTH_TRAILER": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nContent-Length: 3\r\n\r\n",
    "CHUNK_EXT_GRAMMAR": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1;;a\r\na\r\n0\r\n\r\n",
    "CHUNK_EXT_BWS": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1 ; a = b\r\na\r\n0\r\n\r\n",
}


@pytest.mark.parametrize("difference", DIFFERENCES, ids=lambda d: d.name)
def test_each_difference_is_real(difference):
    raw = SHOWN[difference.name]
    mine, theirs = ours([raw]), llhttp(raw)
    assert (mine.ok, theirs.ok) == {"ours": (False, True), "llhttp": (True, False), "neither": (True, True)}[difference.refused_by[0]]
    assert mine != theirs
    assert difference.name in explained(raw, mine, theirs)
