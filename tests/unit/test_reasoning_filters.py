"""Reasoning splitters (qwen3, deepseek_r1), sans-IO, and how they compose.

Each splitter runs through a real `Pipeline` (UTF-8 carry + chain) over
scripted model output: whole, cut in two at every position, and one byte at
a time. Whatever the cuts, the client must get the same reasoning and the
same content, byte for byte, and the thinking must never reach the content
(nor the tool parser after the splitter). The expected splits follow vLLM's
own parsers (checked against vllm/reasoning and vllm/parser/qwen3.py).
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from streamproxy.filters.base import CONTENT, REASONING, TOOL_CALL, Part, Pipeline, reasoning
from streamproxy.filters.chain import chat_filters, known_reasoning_parser, reasoning_spec
from streamproxy.filters.hermes import HermesParser
from streamproxy.filters.reasoning import OWN_REASONING, ThinkSplitter
from streamproxy.filters.stopseq import StopSequenceFilter
from tests.unit.filter_support import TOOLS, bytewise, every_split, outcome, run


def splitter(name: str, **kwargs):
    make = OWN_REASONING[name](kwargs)
    assert make is not None
    return lambda: [make()]


def split(parts: list[Part]) -> tuple[str, str]:
    """(reasoning, content) as a client reassembles them; reasoning never follows content."""
    seen_content = False
    for p in parts:
        if p.kind == CONTENT and p.text:
            seen_content = True
        assert not (p.kind == REASONING and seen_content), parts
        assert p.text or p.kind not in (CONTENT, REASONING), parts
    return "".join(p.text for p in parts if p.kind == REASONING), "".join(p.text for p in parts if p.kind == CONTENT)


# (parser, model output, reasoning, content)
CASES = [
    ("qwen3", "<think>\nLet me think.\n</think>\n\nHello é!", "\nLet me think.\n", "\n\nHello é!"),
    ("qwen3", "template opened it</think>answer", "template opened it", "answer"),
    ("qwen3", "a<think>b<think>c</think>d", "abc", "d"),  # every <think> inside is dropped
    ("qwen3", "abc</think>d<think>e</think>f", "abc", "d<think>ef"),  # a late </think> is dropped
    ("qwen3", "only thinking, cut off", "only thinking, cut off", ""),
    ("qwen3", "ends on half a tag </thi", "ends on half a tag </thi", ""),
    ("qwen3", "done</think>x</thi", "done", "x</thi"),
    ("qwen3", "plan<tool_call>{}</tool_call>", "plan", "<tool_call>{}</tool_call>"),  # a call ends the thinking
    ("qwen3", "lookalikes <thin </thinker> <tool_cal", "lookalikes <thin </thinker> <tool_cal", ""),
    ("deepseek_r1", "<think>\nHmm.\n</think>\n\nAnswer", "\nHmm.\n", "\n\nAnswer"),
    ("deepseek_r1", "no opening tag: the template wrote it</think>Answer", "no opening tag: the template wrote it", "Answer"),
    ("deepseek_r1", "a<think>b<think>c</think>d", "ab<think>c", "d"),  # only the first <think> is dropped
    ("deepseek_r1", "abc</think>d</think>e", "abc", "d</think>e"),  # after the thinking: all content
    ("deepseek_r1", "plan<tool_call>{}</tool_call>", "plan<tool_call>{}</tool_call>", ""),
    ("deepseek_r1", "", "", ""),
    ("deepseek_r1", "</think>", "", ""),
]


@pytest.mark.parametrize(("name", "text", "thought", "answer"), CASES)
def test_split_whole_every_cut_and_bytewise(name, text, thought, answer):
    make = splitter(name)
    assert split(run(make, [text])[0]) == (thought, answer)
    for pieces in every_split(text):
        assert split(run(make, pieces)[0]) == (thought, answer), pieces
    assert split(run(make, bytewise(text))[0]) == (thought, answer)
    assert split(run(make, list(text))[0]) == (thought, answer)


def test_tags_cut_at_every_position_inside_one_stream():
    """Three pieces, cut twice anywhere: tags and multi-byte characters land split in every way."""
    text = "<think>é</think>ü"
    for i in range(len(text.encode()) + 1):
        for j in range(i, len(text.encode()) + 1):
            data = text.encode()
            pieces = [data[:i], data[i:j], data[j:]]
            for name in ("qwen3", "deepseek_r1"):
                assert split(run(splitter(name), pieces)[0]) == ("é", "ü"), (name, pieces)


def test_finish_reason_passes_through():
    assert run(splitter("qwen3"), ["a</think>b"], "length")[1] == "length"


def test_qwen3_with_thinking_off_needs_no_splitter():
    assert OWN_REASONING["qwen3"]({"enable_thinking": False}) is None
    assert OWN_REASONING["qwen3"]({"enable_thinking": True}) is not None
    assert OWN_REASONING["deepseek_r1"]({"enable_thinking": False}) is not None  # R1 always thinks
    assert reasoning_spec("qwen3", tokenizer=None, template_kwargs={"enable_thinking": False}) is None
    assert reasoning_spec(None, tokenizer=None, template_kwargs={}) is None
    assert reasoning_spec("", tokenizer=None, template_kwargs={}) is None


def test_own_names_are_known_without_vllm(parser_registry):
    assert known_reasoning_parser("qwen3")
    assert known_reasoning_parser("deepseek_r1")
    assert not known_reasoning_parser("granite")
    with pytest.raises(ValueError, match="unknown reasoning parser 'granite' \\(ours: deepseek_r1, qwen3\\)"):
        reasoning_spec("granite", tokenizer=None, template_kwargs={})


def test_other_parts_pass_through_in_order():
    marker = Part(TOOL_CALL, "", 0, "call_x", "f")
    s = ThinkSplitter()
    assert s.feed([Part(CONTENT, "hm"), marker, Part(CONTENT, "</think>ok")]) == [reasoning("hm"), marker, Part(CONTENT, "ok")]


# -- counting the thinking's tokens -----------------------------------------------


def feed_tokens(make, tokens: list[str]) -> tuple[list[Part], Pipeline]:
    pipe = Pipeline(make())
    parts: list[Part] = []
    for n, token in enumerate(tokens):
        parts += pipe.feed(token, [n])
    parts += pipe.finish("stop")[0]
    return parts, pipe


def test_reasoning_tokens_are_the_tokens_between_the_tags():
    _, pipe = feed_tokens(splitter("qwen3"), ["<think>", "Let", " me", " think", "</think>", "\n\n", "Hi"])
    assert pipe.reasoning_tokens == 3
    _, pipe = feed_tokens(splitter("deepseek_r1"), ["Hmm", ".", "</think>", "Yes"])
    assert pipe.reasoning_tokens == 2
    _, pipe = feed_tokens(splitter("deepseek_r1"), ["all", " thinking"])
    assert pipe.reasoning_tokens == 2
    assert Pipeline([HermesParser(TOOLS)]).reasoning_tokens is None  # no splitter: nothing to report
    assert Pipeline([]).reasoning_tokens is None


# -- the chain: splitter first, tool parser after it -----------------------------------

CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'


def chain(name: str):
    spec = reasoning_spec(name, tokenizer=None, template_kwargs={})
    return lambda: [spec(), HermesParser(TOOLS)]


@pytest.mark.parametrize("name", ["qwen3", "deepseek_r1"])
def test_think_then_call(name):
    text = "<think>The user wants weather.</think>\n\n" + CALL
    cuts: list[Sequence[str | bytes]] = [[text], *every_split(text), bytewise(text)]
    for pieces in cuts:
        parts, reason = run(chain(name), pieces)
        assert reason == "tool_calls"
        assert "".join(p.text for p in parts if p.kind == REASONING) == "The user wants weather."
        assert outcome(parts) == ("", [("get_weather", '{"city": "Paris"}')])


@pytest.mark.parametrize("name", ["qwen3", "deepseek_r1"])
def test_a_call_written_inside_the_thinking_is_not_a_call(name):
    # qwen3 ends its thinking at <tool_call> (vLLM's rule), so use a call's JSON without the tag there.
    thought = 'maybe {"name": "get_time"}; or ' + ("" if name == "qwen3" else CALL)
    text = f"<think>{thought}</think>It is sunny."
    cuts: list[Sequence[str | bytes]] = [[text], *every_split(text), bytewise(text)]
    for pieces in cuts:
        parts, reason = run(chain(name), pieces)
        assert reason == "stop"
        assert "".join(p.text for p in parts if p.kind == REASONING) == thought
        assert outcome(parts) == ("It is sunny.", [])


def test_qwen3_call_straight_from_the_thinking():
    text = "<think>call it" + CALL
    for pieces in [[text], *every_split(text)]:
        parts, reason = run(chain("qwen3"), pieces)
        assert "".join(p.text for p in parts if p.kind == REASONING) == "call it"
        assert outcome(parts)[1] == [("get_weather", '{"city": "Paris"}')] and reason == "tool_calls"


def test_chat_filters_put_the_splitter_first():
    spec = reasoning_spec("qwen3", tokenizer=None, template_kwargs={})
    only = chat_filters(None, None, spec)
    assert only is not None and [type(f) for f in only()] == [ThinkSplitter]
    assert chat_filters(None, None, None) is None  # the encoders' fast path stays
    made = only()
    assert made[0] is not only()[0]  # a fresh splitter per choice


# -- with the Anthropic stop-sequence filter -----------------------------------------------


def test_stop_sequence_filter_goes_before_the_splitter():
    """The engine stops on a stop string wherever it appears, thinking included. The stop
    filter sees the raw text, so it strips the string from the thinking too; after the
    splitter it would only see content and the stop string would stay in the reasoning."""
    text = "<think>I will say STOP"  # the engine stopped on "STOP" (kept in its output for us)
    spec = reasoning_spec("qwen3", tokenizer=None, template_kwargs={})
    for pieces in [[text], *every_split(text)]:
        stops = StopSequenceFilter(["STOP"])

        def stop_first(stops: StopSequenceFilter = stops) -> list:
            return [stops, spec()]

        parts, _ = run(stop_first, pieces)
        assert split(parts) == ("I will say ", "") and stops.matched == "STOP"
    stops = StopSequenceFilter(["STOP"])
    parts, _ = run(lambda: [spec(), stops], [text])
    assert split(parts)[0] == "I will say STOP"  # the wrong order leaks it
