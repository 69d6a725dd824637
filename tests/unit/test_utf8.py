"""Utf8Carry: bytes in any slicing come out as whole characters only."""

from __future__ import annotations

import pytest

from streamproxy.core.utf8 import Utf8Carry

# One character of each UTF-8 length: 1, 2, 3 and 4 bytes.
TEXT = "aé€😀"
DATA = TEXT.encode("utf-8")
REPLACEMENT = "\ufffd"


def test_sample_covers_every_utf8_length():
    assert [len(c.encode("utf-8")) for c in TEXT] == [1, 2, 3, 4]


def test_byte_at_a_time_emits_only_whole_characters():
    carry = Utf8Carry()
    outputs = [carry.feed(DATA[i : i + 1]) for i in range(len(DATA))]
    assert outputs == ["a", "", "é", "", "", "€", "", "", "", "😀"]
    assert carry.flush() == ""


@pytest.mark.parametrize("cut", range(len(DATA) + 1))
def test_every_two_way_split_reassembles_exactly(cut):
    carry = Utf8Carry()
    first = carry.feed(DATA[:cut])
    second = carry.feed(DATA[cut:])
    tail = carry.flush()
    for piece in (first, second):
        assert REPLACEMENT not in piece
        piece.encode("utf-8")  # a lone surrogate or half character would fail here
    assert tail == ""
    assert first + second == TEXT


@pytest.mark.parametrize("cut1", range(len(DATA) + 1))
def test_every_three_way_split_reassembles_exactly(cut1):
    for cut2 in range(cut1, len(DATA) + 1):
        carry = Utf8Carry()
        pieces = [carry.feed(DATA[:cut1]), carry.feed(DATA[cut1:cut2]), carry.feed(DATA[cut2:]), carry.flush()]
        assert all(REPLACEMENT not in p for p in pieces)
        assert "".join(pieces) == TEXT


def test_pending_is_true_only_inside_a_character():
    carry = Utf8Carry()
    assert carry.pending is False
    carry.feed("€".encode()[:2])
    assert carry.pending is True
    carry.feed("€".encode()[2:])
    assert carry.pending is False


def test_invalid_byte_becomes_replacement_character():
    assert Utf8Carry().feed(b"a\xffb") == "a\ufffdb"


def test_lone_continuation_byte_becomes_replacement_character():
    assert Utf8Carry().feed(b"\x80x") == "\ufffdx"


def test_truncated_sequence_followed_by_ascii_becomes_replacement_then_ascii():
    assert Utf8Carry().feed(b"\xe2\x82a") == "\ufffda"


def test_flush_turns_dangling_tail_into_replacement_character():
    carry = Utf8Carry()
    assert carry.feed(b"ok\xf0\x9f") == "ok"
    assert carry.flush() == "\ufffd"


def test_flush_resets_so_the_carry_can_be_reused():
    carry = Utf8Carry()
    carry.feed(b"\xe2")
    carry.flush()
    assert carry.pending is False
    assert carry.feed("é".encode()) == "é"


def test_flush_with_nothing_pending_is_empty():
    carry = Utf8Carry()
    carry.feed(b"abc")
    assert carry.flush() == ""


def test_str_passes_through_unchanged():
    carry = Utf8Carry()
    assert carry.feed(TEXT) == TEXT
    assert carry.feed("") == ""
    assert carry.pending is False


def test_empty_bytes_give_empty_text():
    assert Utf8Carry().feed(b"") == ""


def test_str_after_dangling_bytes_keeps_stream_order():
    # The dangling tail can never be completed before "x", so it must come out
    # (as U+FFFD) before "x", not after it.
    carry = Utf8Carry()
    out = carry.feed(b"\xe2\x82") + carry.feed("x") + carry.flush()
    assert out == "\ufffdx"
