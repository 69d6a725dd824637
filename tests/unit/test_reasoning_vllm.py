"""vLLM's reasoning-parser registry through the adapter filter (`engine_adapter/vllm_parsers.py`).

Sans-IO like the other filter tests, but it imports vLLM (about 13 s), so it
runs with the engine tests (`-m engine`). A tiny tokenizer stands in for a
model's: the think tags are single tokens (as in Qwen3 and DeepSeek-R1),
every other piece of text one made-up token. vLLM's parsers, driven one
token at a time through our filter, must split like ours.
"""

from __future__ import annotations

import pytest

from streamproxy.filters.base import CONTENT, REASONING, Pipeline
from streamproxy.filters.chain import chat_filters, known_reasoning_parser, reasoning_spec
from streamproxy.filters.hermes import HermesParser
from tests.unit.filter_support import TOOLS, outcome

pytestmark = [pytest.mark.engine, pytest.mark.vllm_sources, pytest.mark.usefixtures("vllm_parsers")]

VOCAB = {"<think>": 1, "</think>": 2, "<tool_call>": 3, "</tool_call>": 4, "<|im_start|>": 5, "<|im_end|>": 6}


class TinyTokenizer:
    def __init__(self) -> None:
        self.pieces = {v: k for k, v in VOCAB.items()}

    def get_vocab(self) -> dict[str, int]:
        return dict(VOCAB)

    def token_id(self, piece: str) -> int:
        token = VOCAB.get(piece)
        if token is None:
            token = 100 + len(self.pieces)
            self.pieces[token] = piece
        return token

    def decode(self, ids: list[int], **kwargs) -> str:
        return "".join(self.pieces[i] for i in ids)

    def convert_ids_to_tokens(self, ids: list[int], **kwargs) -> list[str]:
        return [self.pieces[i] for i in ids]


TOK = TinyTokenizer()
THINK = ["<think>", "\nLet", " me", " think.\n", "</think>", "\n\n", "Hello", "!"]
NO_OPEN = ["Hmm", ", ok", "</think>", "Answer"]
CALL = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
THEN_CALL = ["<think>", "need", " weather", "</think>", "\n\n", "<tool_call>", CALL, "</tool_call>"]


def run_tokens(make, tokens: list[str]):
    pipe = Pipeline(make())
    parts = []
    for piece in tokens:
        parts += pipe.feed(piece, [TOK.token_id(piece)])
    tail, reason = pipe.finish("stop")
    parts += tail
    thought = "".join(p.text for p in parts if p.kind == REASONING)
    return thought, parts, reason, pipe


def content(parts) -> str:
    return "".join(p.text for p in parts if p.kind == CONTENT)


def own_and_vllm(name: str, **kwargs):
    ours = reasoning_spec(name, tokenizer=TOK, template_kwargs=kwargs)
    theirs = reasoning_spec("vllm:" + name, tokenizer=TOK, template_kwargs=kwargs)
    return ours, theirs


def test_registry_names_are_known():
    assert known_reasoning_parser("vllm:qwen3") and known_reasoning_parser("granite")
    assert not known_reasoning_parser("no_such_parser")


@pytest.mark.parametrize(("name", "tokens"), [("qwen3", THINK), ("deepseek_r1", THINK), ("qwen3", NO_OPEN), ("deepseek_r1", NO_OPEN)])
def test_vllm_parsers_split_like_ours(name, tokens):
    ours, theirs = own_and_vllm(name)
    mine = run_tokens(lambda: [ours()], tokens)
    vllm = run_tokens(lambda: [theirs()], tokens)
    assert (vllm[0], content(vllm[1])) == (mine[0], content(mine[1]))
    assert vllm[0] and "<think>" not in content(vllm[1])
    assert mine[3].reasoning_tokens > 0
    if "<think>" in tokens:  # vLLM counts only between the two tags it saw
        assert vllm[3].reasoning_tokens == mine[3].reasoning_tokens


def test_qwen3_thinking_off_through_vllm():
    theirs = reasoning_spec("vllm:qwen3", tokenizer=TOK, template_kwargs={"enable_thinking": False})
    thought, parts, _, _ = run_tokens(lambda: [theirs()], ["Plain", " answer"])
    assert thought == "" and "".join(p.text for p in parts) == "Plain answer"


def test_special_tokens_are_kept_for_parser_engine_parsers():
    assert reasoning_spec("vllm:qwen3", tokenizer=TOK, template_kwargs={}).keep_special_tokens  # its engine reads tags as tokens
    assert not reasoning_spec("vllm:deepseek_r1", tokenizer=TOK, template_kwargs={}).keep_special_tokens
    assert not reasoning_spec("qwen3", tokenizer=TOK, template_kwargs={}).keep_special_tokens


def test_vllm_splitter_then_our_tool_parser():
    spec = reasoning_spec("vllm:deepseek_r1", tokenizer=TOK, template_kwargs={})

    class Plan:
        mode, schemas, parallel = "auto", {"get_weather": None}, True

    make = chat_filters(Plan, lambda tools, parallel: HermesParser(TOOLS, parallel=parallel), spec)
    thought, parts, reason, _ = run_tokens(make, THEN_CALL)
    assert thought == "need weather" and reason == "tool_calls"
    assert outcome(parts) == ("", [("get_weather", '{"city": "Paris"}')])


@pytest.mark.parametrize("name", ["qwen3", "deepseek_r1"])
def test_a_prompt_that_closes_the_thinking_starts_in_content(name):
    """As vLLM's streaming path: the parser sees the rendered prompt first (`set_prompt_token_ids`
    from 0.33), and when the prompt already closes the thinking (thinking switched off by the
    template, or continue_final_message) the whole answer is content."""
    prompt = [TOK.token_id(p) for p in ["<|im_start|>", "user", "<|im_end|>", "<think>", "\n\n", "</think>", "\n\n"]]
    spec = reasoning_spec("vllm:" + name, tokenizer=TOK, template_kwargs={}, prompt_ids=prompt)
    thought, parts, _, _ = run_tokens(lambda: [spec()], ["Hello", " there", "!"])
    assert (thought, content(parts)) == ("", "Hello there!")
    # the same prompt without the closing tag: the answer is read as before (here: thinking, then content)
    open_prompt = prompt[:-3]
    spec = reasoning_spec("vllm:" + name, tokenizer=TOK, template_kwargs={}, prompt_ids=open_prompt)
    thought, parts, _, _ = run_tokens(lambda: [spec()], ["Hmm", "</think>", "Hello", "!"])
    assert (thought, content(parts)) == ("Hmm", "Hello!")
