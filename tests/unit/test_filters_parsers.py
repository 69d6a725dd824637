"""Auto-mode tool-call parsers, sans-IO: hermes, llama3_json, mistral, pythonic.

Each parser is run through a real `Pipeline` (UTF-8 carry + chain) with
scripted model output: whole, cut in two at every position, and one byte
at a time. Whatever the cuts, the client must see the same content and the
same calls; invalid calls come back as content with the engine's reason.
"""

from __future__ import annotations

import pytest

from streamproxy.filters.base import CONTENT, TOOL_ARGS, TOOL_CALL, Part, Pipeline
from streamproxy.filters.hermes import HermesParser
from streamproxy.filters.llama3_json import Llama3JsonParser
from streamproxy.filters.mistral import MistralParser
from streamproxy.filters.pythonic import PythonicParser
from tests.unit.filter_support import TOOLS, bytewise, every_split, outcome, run


def hermes(parallel: bool = True):
    return lambda: [HermesParser(TOOLS, parallel=parallel)]


def llama():
    return lambda: [Llama3JsonParser(TOOLS)]


def mistral():
    return lambda: [MistralParser(TOOLS)]


def pythonic():
    return lambda: [PythonicParser(TOOLS)]


PARIS = '{"city": "Paris"}'
ROME = '{"city": "Rome", "days": 2}'

# (parser, model output, expected content, expected calls)
CASES = [
    ("hermes", hermes(), f'<tool_call>\n{{"name": "get_weather", "arguments": {PARIS}}}\n</tool_call>', "", [("get_weather", PARIS)]),
    (
        "hermes-text-then-two",
        hermes(),
        f'Let me check. é\n\n<tool_call>{{"name": "get_weather", "arguments": {PARIS}}}</tool_call>\n'
        f'<tool_call>{{"arguments": {ROME}, "name": "get_weather"}}</tool_call>',
        "Let me check. é",
        [("get_weather", PARIS), ("get_weather", ROME)],
    ),
    (
        "hermes-braces-and-tags-in-strings",
        hermes(),
        '<tool_call>{"name": "get_weather", "arguments": {"city": "a}</tool_call>\\"{b"}}</tool_call>',
        "",
        [("get_weather", '{"city": "a}</tool_call>\\"{b"}')],
    ),
    (
        "hermes-arguments-as-json-string",
        hermes(),
        '<tool_call>{"name": "get_weather", "arguments": "{\\"city\\": \\"Oslo\\"}"}</tool_call>',
        "",
        [("get_weather", '{"city": "Oslo"}')],
    ),
    ("hermes-unclosed-but-complete", hermes(), '<tool_call>{"name": "get_time", "arguments": {}}', "", [("get_time", "{}")]),
    ("hermes-text-after-call", hermes(), '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>\n\nDone.', "Done.", [("get_time", "{}")]),
    ("hermes-lookalike-tag", hermes(), "a <tool_cal b <tool_call", "a <tool_cal b <tool_call", []),
    ("llama3", llama(), f'{{"name": "get_weather", "parameters": {PARIS}}}', "", [("get_weather", PARIS)]),
    (
        "llama3-python-tag-two",
        llama(),
        f'<|python_tag|>{{"name": "get_weather", "parameters": {PARIS}}}; {{"name": "get_weather", "parameters": {ROME}}}',
        "",
        [("get_weather", PARIS), ("get_weather", ROME)],
    ),
    ("llama3-plain-text", llama(), "  The weather is {fine}.", "  The weather is {fine}.", []),
    ("mistral-v11", mistral(), f"Sure [TOOL_CALLS]get_weather[ARGS]{PARIS}", "Sure", [("get_weather", PARIS)]),
    (
        "mistral-v11-two-with-call-id",
        mistral(),
        f"[TOOL_CALLS]get_weather[CALL_ID]a1B2c3D4e[ARGS]{PARIS}[TOOL_CALLS]get_weather[ARGS]{ROME}",
        "",
        [("get_weather", PARIS), ("get_weather", ROME)],
    ),
    (
        "mistral-array",
        mistral(),
        f'[TOOL_CALLS] [{{"name": "get_weather", "arguments": {PARIS}}}, {{"name": "get_time", "arguments": {{}}}}]',
        "",
        [("get_weather", PARIS), ("get_time", "{}")],
    ),
    ("mistral-text", mistral(), "no [TOOL tags [here]", "no [TOOL tags [here]", []),
    (
        "pythonic-two",
        pythonic(),
        '[get_weather(city="Paris"), get_weather(city=\'Ro]me\', days=2)]',
        "",
        [("get_weather", PARIS), ("get_weather", '{"city": "Ro]me", "days": 2}')],
    ),
    ("pythonic-no-args", pythonic(), "[get_time()]", "", [("get_time", "{}")]),
    ("pythonic-text", pythonic(), "Hello [world]", "Hello [world]", []),
]
IDS = [c[0] for c in CASES]


@pytest.mark.parametrize(("name", "make", "text", "content", "calls"), CASES, ids=IDS)
def test_whole(name, make, text, content, calls):
    parts, reason = run(make, [text])
    assert outcome(parts) == (content, calls)
    assert reason == ("tool_calls" if calls else "stop")


@pytest.mark.parametrize(("name", "make", "text", "content", "calls"), CASES, ids=IDS)
def test_split_at_every_position(name, make, text, content, calls):
    for pieces in every_split(text):
        parts, reason = run(make, pieces)
        assert outcome(parts) == (content, calls), pieces
        assert reason == ("tool_calls" if calls else "stop")


@pytest.mark.parametrize(("name", "make", "text", "content", "calls"), CASES, ids=IDS)
def test_byte_at_a_time(name, make, text, content, calls):
    parts, reason = run(make, bytewise(text))
    assert outcome(parts) == (content, calls)


@pytest.mark.parametrize(("name", "make", "text", "content", "calls"), CASES, ids=IDS)
def test_a_call_is_one_start_then_one_arguments_piece(name, make, text, content, calls):
    parts, _ = run(make, bytewise(text))
    kinds = [p.kind for p in parts if p.kind != CONTENT]
    assert kinds == [TOOL_CALL, TOOL_ARGS] * len(calls)


def test_content_streams_before_the_call_completes():
    p = Pipeline([HermesParser(TOOLS)])
    assert outcome(p.feed("Hello <tool")) == ("Hello", [])  # "<tool" may be a tag: held
    assert outcome(p.feed('_call>{"name": "get_time", ')) == ("", [])
    assert outcome(p.feed('"arguments": {}}</tool_call>')) == ("", [("get_time", "{}")])
    parts, reason = p.finish("stop")
    assert (parts, reason) == ([], "tool_calls")


def test_held_tag_prefix_is_released_when_it_is_not_a_tag():
    p = Pipeline([HermesParser(TOOLS)])
    assert outcome(p.feed("x <tool_c")) == ("x", [])
    assert outcome(p.feed("ar is red")) == (" <tool_car is red", [])


# -- invalid calls come back as content --------------------------------------------------

INVALID = [
    ("hermes-not-json", hermes(), '<tool_call>{"name": "get_weather", "arguments": {city: Paris}}</tool_call>'),
    ("hermes-unknown-tool", hermes(), f'<tool_call>{{"name": "launch", "arguments": {PARIS}}}</tool_call>'),
    ("hermes-schema-missing-required", hermes(), '<tool_call>{"name": "get_weather", "arguments": {"days": 3}}</tool_call>'),
    ("hermes-schema-wrong-type", hermes(), '<tool_call>{"name": "get_weather", "arguments": {"city": 5}}</tool_call>'),
    ("hermes-schema-extra-property", hermes(), '<tool_call>{"name": "get_weather", "arguments": {"city": "a", "x": 1}}</tool_call>'),
    ("hermes-arguments-not-object", hermes(), '<tool_call>{"name": "get_time", "arguments": [1]}</tool_call>'),
    ("hermes-nan", hermes(), '<tool_call>{"name": "get_weather", "arguments": {"city": "a", "days": NaN}}</tool_call>'),
    ("hermes-no-name", hermes(), '<tool_call>{"arguments": {}}</tool_call>'),
    ("llama3-unknown", llama(), '{"name": "nope", "parameters": {}}'),
    ("llama3-plain-json-answer", llama(), '{"answer": 42}'),
    ("mistral-bad-args", mistral(), "[TOOL_CALLS]get_weather[ARGS]{\"city\": 1}"),
    ("pythonic-positional", pythonic(), '[get_weather("Paris")]'),
    ("pythonic-not-a-call", pythonic(), "[1, 2, 3]"),
]


@pytest.mark.parametrize(("name", "make", "text"), INVALID, ids=[c[0] for c in INVALID])
def test_invalid_call_is_returned_as_content_with_stop(name, make, text):
    for pieces in ([text], bytewise(text)):
        parts, reason = run(make, pieces)
        assert outcome(parts) == (text, [])
        assert reason == "stop"


def test_one_invalid_block_does_not_spoil_a_valid_one():
    bad = '<tool_call>{"name": "nope", "arguments": {}}</tool_call>'
    text = f'<tool_call>{{"name": "get_time", "arguments": {{}}}}</tool_call>{bad}'
    parts, reason = run(hermes(), [text])
    assert outcome(parts) == (bad, [("get_time", "{}")])
    assert reason == "tool_calls"


@pytest.mark.parametrize(
    ("make", "text"),
    [
        (hermes(), 'ok <tool_call>{"name": "get_weather", "arguments": {"city": "Par'),
        (llama(), '{"name": "get_weather", "parameters": {"city": "Par'),
        (mistral(), '[TOOL_CALLS]get_weather[ARGS]{"city": "Par'),
        (pythonic(), '[get_weather(city="Par'),
    ],
    ids=["hermes", "llama3", "mistral", "pythonic"],
)
def test_cut_off_call_is_content_and_length_stays(make, text):
    parts, reason = run(make, [text], reason="length")
    assert outcome(parts) == (text, [])
    assert reason == "length"


def test_parallel_false_sends_only_the_first_call():
    text = '<tool_call>{"name": "get_time", "arguments": {}}</tool_call><tool_call>{"name": "get_weather", "arguments": {"city": "x"}}</tool_call>'
    parts, reason = run(hermes(parallel=False), [text])
    assert outcome(parts) == ("", [("get_time", "{}")])
    assert reason == "tool_calls"


def test_call_ids_are_unique():
    text = '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>' * 3
    parts, _ = run(hermes(), [text])
    ids = [p.id for p in parts if p.kind == TOOL_CALL]
    assert len(ids) == 3 and len(set(ids)) == 3


def test_whitespace_only_answer_is_kept_when_there_is_no_call():
    for make in (hermes(), llama(), mistral(), pythonic()):
        parts, reason = run(make, [" \n "])
        assert outcome(parts) == (" \n ", []) and reason == "stop"


def test_non_content_parts_pass_through_in_order():
    marker = Part(99, "thinking")
    parser = HermesParser(TOOLS)
    assert parser.feed([marker]) == [marker]
