"""ChoiceAccumulator: the non-streaming answer, built from the same Deltas."""

from __future__ import annotations

import pytest

from engine_adapter.base import Delta
from streamproxy.core.accumulate import ChoiceAccumulator

TEXT = "aé€😀"
DATA = TEXT.encode("utf-8")


def test_fresh_accumulator_is_empty():
    acc = ChoiceAccumulator(2)
    assert (acc.text(0), acc.text(1)) == ("", "")
    assert acc.finish_reasons == [None, None]
    assert acc.tokens == [0, 0]
    assert acc.completion_tokens == 0
    assert (acc.prompt_tokens, acc.cached_tokens) == (0, 0)


def test_text_tokens_and_finish_reason_of_one_choice():
    acc = ChoiceAccumulator(1)
    acc.step([Delta(0, "Hel", 1)])
    acc.step([Delta(0, "lo", 2, "stop")])
    assert acc.text(0) == "Hello"
    assert acc.tokens == [3]
    assert acc.finish_reasons == ["stop"]
    assert acc.completion_tokens == 3


def test_several_deltas_in_one_step():
    acc = ChoiceAccumulator(1)
    acc.step([Delta(0, "a", 1), Delta(0, "b", 1), Delta(0, "", 0, "length")])
    assert (acc.text(0), acc.tokens, acc.finish_reasons) == ("ab", [2], ["length"])


def test_choices_are_kept_apart():
    acc = ChoiceAccumulator(2)
    acc.step([Delta(0, "x", 1), Delta(1, "yy", 2)])
    acc.step([Delta(1, "!", 1, "length"), Delta(0, "z", 1, "stop")])
    assert (acc.text(0), acc.text(1)) == ("xz", "yy!")
    assert acc.tokens == [2, 3]
    assert acc.finish_reasons == ["stop", "length"]
    assert acc.completion_tokens == 5


@pytest.mark.parametrize("cut", range(1, len(DATA)))
def test_bytes_split_anywhere_give_whole_text(cut):
    acc = ChoiceAccumulator(1)
    acc.step([Delta(0, DATA[:cut], 1)])
    acc.step([Delta(0, DATA[cut:], 1, "stop")])
    assert acc.text(0) == TEXT


def test_bytes_byte_at_a_time_give_whole_text():
    acc = ChoiceAccumulator(1)
    for i in range(len(DATA)):
        acc.step([Delta(0, DATA[i : i + 1], 1)])
    acc.step([Delta(0, b"", 0, "stop")])
    assert acc.text(0) == TEXT
    assert acc.tokens == [len(DATA)]


def test_dangling_bytes_at_finish_become_replacement_character():
    acc = ChoiceAccumulator(1)
    acc.step([Delta(0, b"ok\xf0\x9f", 1, "stop")])
    assert acc.text(0) == "ok\ufffd"


def test_unfinished_choice_has_no_reason_and_keeps_pending_bytes_out():
    acc = ChoiceAccumulator(1)
    acc.step([Delta(0, b"a\xe2\x82", 1)])
    assert acc.text(0) == "a"
    assert acc.finish_reasons == [None]
