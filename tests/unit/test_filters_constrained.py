"""Constrained tool calls (tool_choice required / named): streamed as generated.

The engine forces the JSON shape; the emitters must turn it into tool-call
fragments without holding anything back, and the argument pieces must
concatenate to exactly the JSON the model wrote, whatever the cuts.
"""

from __future__ import annotations

import pytest

from streamproxy.filters.base import CONTENT, TOOL_ARGS, TOOL_CALL, Pipeline
from streamproxy.filters.constrained import NamedToolEmitter, RequiredToolEmitter
from tests.unit.filter_support import bytewise, every_split, outcome, run

NAMED = '{"city": "Paris", "note": "a}\\"[b", "days": [1, {"x": null}]}'
REQUIRED = (
    '[{"name": "get_weather", "parameters": ' + NAMED + '}, '
    '{"name":"get_time","parameters":{}},\n {"parameters": {"tz": "UTC"}, "name": "get_time"}]'
)
REQUIRED_CALLS = [("get_weather", NAMED), ("get_time", "{}"), ("get_time", '{"tz": "UTC"}')]


def named():
    return [NamedToolEmitter("get_weather")]


def required():
    return [RequiredToolEmitter()]


def test_named_whole():
    parts, reason = run(named, ["  " + NAMED + " \n"])
    assert outcome(parts) == ("", [("get_weather", NAMED)])
    assert reason == "stop"  # OpenAI keeps "stop" for a named function


@pytest.mark.parametrize("pieces", every_split(NAMED) + [bytewise(NAMED)], ids=lambda p: str(len(p[0])) if len(p) == 2 else "bytes")
def test_named_split_anywhere(pieces):
    parts, _ = run(named, pieces)
    assert outcome(parts) == ("", [("get_weather", NAMED)])


def test_named_streams_arguments_as_they_come():
    pipe = Pipeline(named())
    first = pipe.feed('{"ci')
    assert [(p.kind, p.name, p.text) for p in first] == [(TOOL_CALL, "get_weather", ""), (TOOL_ARGS, None, '{"ci')]
    assert [(p.kind, p.text) for p in pipe.feed('ty": "P')] == [(TOOL_ARGS, 'ty": "P')]
    assert [(p.kind, p.text) for p in pipe.feed('aris"}')] == [(TOOL_ARGS, 'aris"}')]
    assert pipe.finish("stop") == ([], "stop")


def test_named_cut_off_keeps_length():
    parts, reason = run(named, ['{"city": "Pa'], reason="length")
    assert outcome(parts) == ("", [("get_weather", '{"city": "Pa')])
    assert reason == "length"


def test_named_nothing_generated_is_no_call():
    assert run(named, [""], reason="length") == ([], "length")


def test_required_whole():
    parts, reason = run(required, [REQUIRED])
    assert outcome(parts) == ("", REQUIRED_CALLS)
    assert reason == "tool_calls"


@pytest.mark.parametrize("cut", range(len(REQUIRED) + 1))
def test_required_split_anywhere(cut):
    parts, reason = run(required, [REQUIRED[:cut], REQUIRED[cut:]])
    assert outcome(parts) == ("", REQUIRED_CALLS)
    assert reason == "tool_calls"


def test_required_byte_at_a_time():
    parts, _ = run(required, bytewise(REQUIRED))
    assert outcome(parts) == ("", REQUIRED_CALLS)


def test_required_streams_arguments_before_the_element_closes():
    pipe = Pipeline(required())
    got = pipe.feed('[{"name": "get_weather", "parameters": {"city"')
    assert [(p.kind, p.text) for p in got] == [(TOOL_CALL, ""), (TOOL_ARGS, '{"city"')]
    assert got[0].name == "get_weather" and got[0].index == 0


def test_required_non_ascii_arguments_split_inside_a_character():
    text = '[{"name": "get_weather", "parameters": {"city": "Zürich 東京"}}]'
    parts, _ = run(required, bytewise(text))
    assert outcome(parts) == ("", [("get_weather", '{"city": "Zürich 東京"}')])


def test_required_off_shape_output_becomes_content():
    # An engine without structured outputs: the rest is handed on, not lost.
    parts, reason = run(required, ["Sorry, I cannot."])
    assert outcome(parts) == ("Sorry, I cannot.", [])
    assert reason == "stop"


def test_required_cut_off_keeps_length_and_partial_arguments():
    parts, reason = run(required, ['[{"name": "get_weather", "parameters": {"city": "Pa'], reason="length")
    assert outcome(parts) == ("", [("get_weather", '{"city": "Pa')])
    assert reason == "length"


def test_emitters_pass_other_parts_through():
    from streamproxy.filters.base import Part

    marker = Part(99, "x")
    for emitter in (NamedToolEmitter("f"), RequiredToolEmitter()):
        assert emitter.feed([marker]) == [marker]
        assert all(p.kind != CONTENT for p in emitter.flush())
