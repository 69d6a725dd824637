"""The tool-call parsers, reasoning splitters and constrained emitters: the same answer whatever the chunking.

Each text is glued from the pieces that matter to the filter (its tags, a
valid call, half a tag, braces, quotes and escapes, plain words, multi-byte
characters), then fed whole and cut at random places, as str pieces and as
UTF-8 byte pieces through a `Pipeline` (so the carry sits in front, as in
the encoders). What a client would see, neighbouring pieces joined, and the
finish reason must be the same every time; calls come in order, each
before its arguments.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamproxy.filters.base import TOOL_ARGS, TOOL_CALL, Part, Pipeline
from streamproxy.filters.constrained import NamedToolEmitter, RequiredToolEmitter
from streamproxy.filters.hermes import HermesParser
from streamproxy.filters.llama3_json import Llama3JsonParser
from streamproxy.filters.mistral import MistralParser
from streamproxy.filters.pythonic import PythonicParser
from streamproxy.filters.reasoning import ThinkSplitter, qwen3
from streamproxy.filters.stopseq import StopSequenceFilter
from streamproxy.filters.toolset import ToolSet
from tests.fuzz.fuzz_support import budget, chunkings

CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOLS = ToolSet({"f": CITY, "g": None})
COMMON = ["a", "Hi ", " ", "\n", "é", "😀", "{", "}", "[", "]", '"', "\\", ",", ":", "<", ">", "/"]

FRAGMENTS: dict[str, list[str]] = {
    "think": ["<think>", "</think>", "<tool_call>", "</", "think>", "<th"],
    "hermes": [
        "<tool_call>", "</tool_call>", '{"name": "f", "arguments": {"city": "P"}}', '{"name": "g", "arguments": {}}',
        '{"name": "f", "arguments": "{\\"city\\": \\"Q\\"}"}', '{"name": "nope", "arguments": {}}', "<tool", "_call>", "</tool_call",
        '"</tool_call>"',
    ],
    "llama3": ["<|python_tag|>", '{"name": "f", "parameters": {"city": "P"}}', '{"name": "g", "arguments": {}}', ";", "<|python", "{\"name\""],
    "mistral": [
        "[TOOL_CALLS]", '[{"name": "f", "arguments": {"city": "P"}}]', "f", "g", "[ARGS]", "[CALL_ID]", "c1", '{"city": "P"}', "{}",
        "[TOOL_", "[AR",
    ],
    "pythonic": ['[f(city="P")]', '[g(), f(city="Q")]', "f(", "g()", ")", 'city="P"', "'", "None", "True", "x=1"],
    "named": ['{"city": "P"}', '"city"', '"P"', "1", "true", "null"],
    "required": [
        '[{"name": "f", "parameters": {"city": "P"}}]', '{"name": "g", "parameters": {}}', '"name"', '"parameters"', '"f"', '"g"',
        '{"parameters": {"city": "Q"}, "name": "f"}',
    ],
    "stop": ["END", "EN", "D", "x"],
}

FILTERS: dict[str, Callable[[], list[Any]]] = {
    "deepseek_r1": lambda: [ThinkSplitter()],
    "qwen3": lambda: [qwen3({})()],  # type: ignore[misc]
    "hermes": lambda: [HermesParser(TOOLS)],
    "hermes_one": lambda: [HermesParser(TOOLS, parallel=False)],
    "llama3": lambda: [Llama3JsonParser(TOOLS)],
    "mistral": lambda: [MistralParser(TOOLS)],
    "pythonic": lambda: [PythonicParser(TOOLS)],
    "named": lambda: [NamedToolEmitter("f")],
    "required": lambda: [RequiredToolEmitter()],
    "stop": lambda: [StopSequenceFilter(["END", "x"])],
    "qwen3+hermes": lambda: [qwen3({})(), HermesParser(TOOLS)],  # type: ignore[misc]
}
WORDS_FOR = {
    "deepseek_r1": "think", "qwen3": "think", "hermes": "hermes", "hermes_one": "hermes", "llama3": "llama3", "mistral": "mistral",
    "pythonic": "pythonic", "named": "named", "required": "required", "stop": "stop",
}


def texts_for(name: str) -> st.SearchStrategy[str]:
    words = [w for part in name.split("+") for w in FRAGMENTS[WORDS_FOR.get(part, part)]] + COMMON
    return st.lists(st.sampled_from(words) | st.text(max_size=3), max_size=10).map("".join)


def run(name: str, pieces: list[str] | list[bytes], reason: str) -> tuple[list[tuple[Any, ...]], str]:
    pipe = Pipeline(FILTERS[name]())
    parts: list[Part] = []
    for piece in pieces:
        parts += pipe.feed(piece)
    tail, final = pipe.finish(reason)
    return seen(parts + tail), final


def seen(parts: list[Part]) -> list[tuple[Any, ...]]:
    """What a client sees: (kind, index, name, text), neighbouring pieces of one kind joined; checks call order."""
    out: list[list[Any]] = []
    calls = 0
    for p in parts:
        if p.kind == TOOL_CALL:
            assert p.index == calls and p.name and p.id, p
            calls += 1
            out.append([p.kind, p.index, p.name, ""])
            continue
        if p.kind == TOOL_ARGS:
            assert p.index < calls, "arguments before their call"
        if out and out[-1][0] == p.kind and out[-1][1] == p.index and p.kind != TOOL_CALL:
            out[-1][3] += p.text
        else:
            out.append([p.kind, p.index, None, p.text])
    return [tuple(x) for x in out if x[3] or x[0] == TOOL_CALL]


@pytest.mark.parametrize("name", sorted(FILTERS))
@budget(80)
@given(data=st.data(), reason=st.sampled_from(["stop", "length"]))
def test_any_chunking_gives_the_same_answer(name, data, reason):
    text = data.draw(texts_for(name), label="text")
    whole = run(name, [text], reason)
    assert run(name, data.draw(chunkings(text), label="str pieces"), reason) == whole
    assert run(name, data.draw(chunkings(text.encode()), label="byte pieces"), reason) == whole
    assert run(name, list(text), reason) == whole  # a character at a time
