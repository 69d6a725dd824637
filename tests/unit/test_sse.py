"""SSE framing constants and the incremental SSEParser (WHATWG rules)."""

from __future__ import annotations

import pytest

from streamproxy.core import sse
from streamproxy.core.sse import SSEParser

# ---------------------------------------------------------------- encoding


def test_done_frame_exact_bytes():
    assert sse.DONE == b"data: [DONE]\n\n"


def test_keepalive_is_a_comment_frame():
    assert sse.KEEPALIVE == b": keepalive\n\n"


def test_frame_wraps_payload():
    assert sse.frame(b'{"a":1}') == b'data: {"a":1}\n\n'


def test_event_frame_names_the_event():
    assert sse.event_frame(b"message_start", b"{}") == b"event: message_start\ndata: {}\n\n"


def test_frame_round_trips_through_parser():
    assert SSEParser().feed(sse.frame(b'{"x":"y"}') + sse.KEEPALIVE + sse.DONE) == [(None, '{"x":"y"}'), (None, "[DONE]")]


# ---------------------------------------------------------------- parsing

# Written with LF; the tests re-write the line ends as CRLF or CR.
STREAM_LF = (
    ": a comment line\n"
    "event: ping\n"
    'data: {"a":1}\n'
    "\n"
    "data: first line\n"
    "data: second line\n"
    "\n"
    ": comment between fields\n"
    "data:no-space\n"
    "id: 7\n"
    "retry: 100\n"
    "\n"
    "event: done\n"
    "data: é€😀\n"
    "\n"
)
EXPECTED = [
    ("ping", '{"a":1}'),
    (None, "first line\nsecond line"),
    (None, "no-space"),
    ("done", "é€😀"),
]
ENDINGS = {"LF": "\n", "CRLF": "\r\n", "CR": "\r"}


def _encoded(ending: str) -> bytes:
    return STREAM_LF.replace("\n", ENDINGS[ending]).encode("utf-8")


@pytest.mark.parametrize("ending", ENDINGS)
def test_whole_stream_in_one_feed(ending):
    assert SSEParser().feed(_encoded(ending)) == EXPECTED


@pytest.mark.parametrize("ending", ENDINGS)
def test_byte_at_a_time(ending):
    data = _encoded(ending)
    parser = SSEParser()
    events = []
    for i in range(len(data)):
        events += parser.feed(data[i : i + 1])
    assert events == EXPECTED


@pytest.mark.parametrize("ending", ENDINGS)
def test_every_two_way_split(ending):
    data = _encoded(ending)
    for cut in range(len(data) + 1):
        parser = SSEParser()
        events = parser.feed(data[:cut]) + parser.feed(data[cut:])
        assert events == EXPECTED, f"split at byte {cut}"


def test_crlf_split_between_cr_and_lf_is_one_line_end():
    parser = SSEParser()
    assert parser.feed(b"data: a\r") == []
    assert parser.feed(b"\n") == []  # the LF of the CRLF, not a blank line
    assert parser.feed(b"\n") == [(None, "a")]


def test_mixed_line_endings_in_one_stream():
    assert SSEParser().feed(b"data: a\r\ndata: b\rdata: c\n\r\n") == [(None, "a\nb\nc")]


def test_event_is_emitted_only_at_the_blank_line():
    parser = SSEParser()
    assert parser.feed(b"data: x\n") == []
    assert parser.feed(b"\n") == [(None, "x")]


def test_unterminated_event_is_not_emitted():
    assert SSEParser().feed(b"data: never finished\n") == []


def test_only_one_leading_space_is_stripped():
    assert SSEParser().feed(b"data:  two\n\n") == [(None, " two")]


def test_data_line_without_colon_is_empty_data():
    assert SSEParser().feed(b"data\n\n") == [(None, "")]


def test_empty_data_field_dispatches_empty_string():
    assert SSEParser().feed(b"data:\n\n") == [(None, "")]


def test_empty_data_lines_join_with_newline():
    assert SSEParser().feed(b"data:\ndata:\n\n") == [(None, "\n")]


def test_event_without_data_is_dropped_and_does_not_leak():
    assert SSEParser().feed(b"event: lonely\n\ndata: x\n\n") == [(None, "x")]


def test_event_name_resets_after_dispatch():
    assert SSEParser().feed(b"event: a\ndata: 1\n\ndata: 2\n\n") == [("a", "1"), (None, "2")]


def test_comment_only_frames_give_no_events():
    assert SSEParser().feed(sse.KEEPALIVE * 3) == []


def test_unknown_fields_are_ignored():
    assert SSEParser().feed(b"foo: bar\ndata: x\nid: 1\n\n") == [(None, "x")]


def test_colon_inside_value_is_kept():
    assert SSEParser().feed(b"data: a: b:c\n\n") == [(None, "a: b:c")]


def test_field_names_are_case_sensitive():
    assert SSEParser().feed(b"Data: x\ndata: y\n\n") == [(None, "y")]
