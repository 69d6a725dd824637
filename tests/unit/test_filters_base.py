"""The filter pipeline and the incremental JSON scanner."""

from __future__ import annotations

import pytest

from streamproxy.filters.base import CONTENT, TOOL_ARGS, TOOL_CALL, Part, Pipeline, content, merge_content, tool_args, tool_call
from streamproxy.filters.jsonscan import ValueScan, members, value_end

VALUES = ['{"a": [1, {"b": "}]\\"\\\\"}], "c": null}', '[1, 2, [3]]', '"x\\"y"', "-12.5e3", "true", "{}"]


@pytest.mark.parametrize("value", VALUES)
def test_value_scan_finds_the_end_at_every_split(value):
    text = value + ' , "next"'
    for cut in range(len(text) + 1):
        scan = ValueScan()
        used = scan.feed(text[:cut])
        if not scan.done:
            assert used == cut
            used += scan.feed(text[cut:])
        assert scan.done
        assert text[:used] == value


def test_value_scan_scalar_ends_at_end_of_input():
    scan = ValueScan()
    assert scan.feed("123") == 3 and not scan.done
    assert scan.end_of_input() and scan.done


def test_value_end():
    assert value_end('x {"a": "}"} y', 2) == 12
    assert value_end('{"a": ', 0) == -1


def test_members_keep_raw_text():
    assert members(' {"name": "f", "arguments": {"x":  1 }, "n": -1} ') == {"name": '"f"', "arguments": '{"x":  1 }', "n": "-1"}
    assert members("{}") == {}
    for bad in ("[]", '{"a" 1}', '{"a": 1', '{"a": 1} x', '{a: 1}'):
        assert members(bad) is None, bad


class Upper:
    """A toy filter: upper-cases content, holds the last character back."""

    def __init__(self) -> None:
        self.held = ""

    def feed(self, parts):
        out = []
        for p in parts:
            if p.kind == CONTENT:
                text = self.held + p.text
                self.held = text[-1:]
                out.append(content(text[:-1].upper()))
            else:
                out.append(p)
        return out

    def flush(self):
        held, self.held = self.held, ""
        return [content(held.upper())] if held else []

    def finish_reason(self, reason):
        return reason + "!"


def test_pipeline_carries_utf8_and_chains_filters():
    pipe = Pipeline([Upper(), Upper()])
    out = []
    for b in "héllo".encode():
        out += pipe.feed(bytes([b]))
    tail, reason = pipe.finish("stop")
    assert "".join(p.text for p in out + tail) == "HÉLLO"
    assert reason == "stop!!"
    # The first filter's flushed text still went through the second one.
    assert all(p.kind == CONTENT for p in out + tail)


def test_pipeline_without_filters_is_the_carry():
    pipe = Pipeline([])
    assert [p.text for p in pipe.feed(b"\xc3")] == []
    assert [p.text for p in pipe.feed(b"\xa9")] == ["é"]
    tail, reason = pipe.finish("length")
    assert (tail, reason) == ([], "length")


def test_merge_content_joins_neighbours_only():
    parts = [content("a"), content("b"), *tool_call(0, "f", "call_x"), tool_args(0, "{"), tool_args(0, "}"), tool_args(1, "x"), content("c")]
    merged = merge_content(parts)
    assert [(p.kind, p.text, p.index) for p in merged] == [
        (CONTENT, "ab", 0),
        (TOOL_CALL, "", 0),
        (TOOL_ARGS, "{}", 0),
        (TOOL_ARGS, "x", 1),
        (CONTENT, "c", 0),
    ]


def test_call_ids_are_call_plus_24_hex():
    (part,) = tool_call(0, "f")
    assert part.id is not None
    assert part.id.startswith("call_") and len(part.id) == 29
    int(part.id[5:], 16)
    assert Part(TOOL_CALL, "", 0, "a", "f") == Part(TOOL_CALL, "", 0, "b", "f")  # ids are random: not compared
