"""Reasoning from the splitter to the wire, sans-IO: chat chunks, the non-stream
accumulator, template kwargs, flags, and the Responses / Anthropic request mapping.

Chat chunks carry the thinking as `delta.reasoning` and, unless turned off,
`delta.reasoning_content`; they must still fit OpenAI's chunk schema, and the
thinking never appears in `delta.content`.
"""

from __future__ import annotations

import json

import pytest

from engine_adapter.base import Delta
from streamproxy.apis.anthropic.convert import to_chat as anthropic_chat
from streamproxy.apis.anthropic.protocol import decode_request as decode_anthropic
from streamproxy.apis.responses.convert import to_chat as responses_chat
from streamproxy.apis.responses.protocol import decode_request as decode_responses
from streamproxy.cli import build
from streamproxy.config import expand_config_file
from streamproxy.core import params as P
from streamproxy.core.accumulate import ChoiceAccumulator
from streamproxy.core.stream import ChatStreamEncoder
from streamproxy.errors import InvalidRequest
from streamproxy.filters.chain import chat_filters, reasoning_spec
from streamproxy.protocol.openai_chat import decode_request as decode_chat
from tests.support import sse, validate

THINK_THEN_ANSWER = ["<think>", "Let", " me", " see", "</think>", "\n\n", "Hello", " é"]


def filters(name: str = "qwen3", **template_kwargs):
    return chat_filters(None, None, reasoning_spec(name, tokenizer=None, template_kwargs=template_kwargs))


def deltas(tokens: list[str], index: int = 0) -> list[Delta]:
    out = [Delta(index, t, 1, None, [n]) for n, t in enumerate(tokens)]
    out[-1].finish_reason = "stop"
    return out


def chunks(encoder: ChatStreamEncoder, steps: list[Delta]) -> list[dict]:
    data = encoder.start() + b"".join(encoder.step([d]) for d in steps) + encoder.finish()
    payloads = sse.payloads(data)
    for p in payloads:
        validate("CreateChatCompletionStreamResponse", p)
    return payloads


def encoder(**kw) -> ChatStreamEncoder:
    args = dict(response_id="chatcmpl-x", created=1700000000, model="m", n=1, system_fingerprint="fp", filters=filters())
    args.update(kw)
    return ChatStreamEncoder(**args)


def test_chat_chunks_carry_reasoning_under_both_names():
    payloads = chunks(encoder(include_usage=True), deltas(THINK_THEN_ANSWER))
    thinking = [p["choices"][0]["delta"] for p in payloads if p["choices"] and "reasoning" in p["choices"][0]["delta"]]
    assert thinking and all(d["reasoning"] == d["reasoning_content"] and set(d) == {"reasoning", "reasoning_content"} for d in thinking)
    assert "".join(d["reasoning"] for d in thinking) == "Let me see"
    content = "".join(p["choices"][0]["delta"].get("content") or "" for p in payloads if p["choices"])
    assert content == "\n\nHello é"
    usage = payloads[-1]["usage"]
    assert usage["completion_tokens"] == len(THINK_THEN_ANSWER)
    assert usage["completion_tokens_details"] == {"reasoning_tokens": 3}
    validate("CompletionUsage", usage)


def test_reasoning_content_field_can_be_turned_off():
    enc = encoder()
    enc.reasoning_content = False
    payloads = chunks(enc, deltas(THINK_THEN_ANSWER))
    deltas_ = [p["choices"][0]["delta"] for p in payloads]
    assert not any("reasoning_content" in d for d in deltas_)
    assert "".join(d.get("reasoning", "") for d in deltas_) == "Let me see"


def test_exact_reasoning_chunk_bytes():
    enc = encoder()
    enc.start()
    out = enc.step([Delta(0, "<think>a\"b", 2, None, [0, 1])])
    assert out.endswith(b',"choices":[{"index":0,"delta":{"reasoning":"a\\"b","reasoning_content":"a\\"b"},"logprobs":null,"finish_reason":null}]}\n\n')


def test_no_parser_keeps_the_plain_fast_path_and_the_usage_shape():
    enc = ChatStreamEncoder(response_id="x", created=1, model="m", n=1, include_usage=True)
    assert enc._one == enc._one_plain
    payloads = chunks(enc, deltas(THINK_THEN_ANSWER))
    assert "completion_tokens_details" not in payloads[-1]["usage"]
    assert "<think>" in "".join(p["choices"][0]["delta"].get("content") or "" for p in payloads if p["choices"])


def test_n2_keeps_each_choices_thinking_apart():
    enc = encoder(n=2, include_usage=True)
    steps = [d for pair in zip(deltas(THINK_THEN_ANSWER, 0), deltas(["No", "</think>", "Yes"], 1) + [None] * 5) for d in pair if d]
    payloads = chunks(enc, steps)
    for index, (thought, answer) in enumerate([("Let me see", "\n\nHello é"), ("No", "Yes")]):
        ds = [p["choices"][0]["delta"] for p in payloads if p["choices"] and p["choices"][0]["index"] == index]
        assert "".join(d.get("reasoning", "") for d in ds) == thought
        assert "".join(d.get("content") or "" for d in ds) == answer
    assert payloads[-1]["usage"]["completion_tokens_details"] == {"reasoning_tokens": 4}


def test_accumulator_gathers_reasoning_apart_from_content():
    acc = ChoiceAccumulator(1, filters())
    for d in deltas(THINK_THEN_ANSWER):
        acc.step([d])
    assert (acc.reasoning(0), acc.text(0), acc.reasoning_tokens) == ("Let me see", "\n\nHello é", 3)
    plain = ChoiceAccumulator(1)
    plain.step(deltas(["hi"]))
    assert (plain.reasoning(0), plain.reasoning_tokens) == (None, None)


# -- template kwargs ----------------------------------------------------------------------


def chat_request(**body):
    return decode_chat(json.dumps({"messages": [{"role": "user", "content": "x"}], **body}))


@pytest.mark.parametrize(
    ("defaults", "body", "expected"),
    [
        (None, {}, {}),
        ({"enable_thinking": False}, {}, {"enable_thinking": False}),
        ({"enable_thinking": False, "x": 1}, {"chat_template_kwargs": {"enable_thinking": True}}, {"enable_thinking": True, "x": 1}),
        ({"enable_thinking": False}, {"reasoning_effort": "high"}, {"enable_thinking": True, "reasoning_effort": "high"}),
        (None, {"reasoning_effort": "none"}, {"enable_thinking": False, "reasoning_effort": "none"}),
        # The request's own switch wins over what the effort implies.
        (None, {"reasoning_effort": "low", "chat_template_kwargs": {"enable_thinking": False}}, {"enable_thinking": False, "reasoning_effort": "low"}),
    ],
)
def test_template_kwargs_merge(defaults, body, expected):
    assert P.template_kwargs(chat_request(**body), defaults) == expected
    if defaults:
        assert P.template_kwargs(chat_request(**body), defaults) is not defaults


def test_unknown_effort_is_a_400_naming_it():
    with pytest.raises(InvalidRequest) as info:
        P.template_kwargs(chat_request(reasoning_effort="extreme"), None)
    assert info.value.param == "reasoning_effort" and "extreme" in info.value.message


def test_responses_effort_and_anthropic_thinking_map_onto_reasoning_effort():
    r = responses_chat(decode_responses(json.dumps({"input": "x", "reasoning": {"effort": "high"}})))
    assert P.template_kwargs(r, None) == {"enable_thinking": True, "reasoning_effort": "high"}
    r = responses_chat(decode_responses(json.dumps({"input": "x", "reasoning": {"effort": "none"}})))
    assert P.template_kwargs(r, None)["enable_thinking"] is False
    base = {"max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}
    a = anthropic_chat(decode_anthropic(json.dumps({**base, "thinking": {"type": "enabled", "budget_tokens": 2048}})))
    assert P.template_kwargs(a, {"enable_thinking": False}) == {"enable_thinking": True, "reasoning_effort": "medium"}
    a = anthropic_chat(decode_anthropic(json.dumps({**base, "output_config": {"effort": "low"}})))
    assert P.template_kwargs(a, None) == {"enable_thinking": True, "reasoning_effort": "low"}
    a = anthropic_chat(decode_anthropic(json.dumps({**base, "thinking": {"type": "disabled"}})))
    assert P.template_kwargs(a, {"enable_thinking": True}) == {"enable_thinking": False}


# -- flags ------------------------------------------------------------------------------------


def test_flags_reach_the_settings():
    settings, _ = build(["--engine", "fake"])
    assert (settings.reasoning_parser, settings.reasoning_content_field, settings.default_chat_template_kwargs) == (None, True, None)
    settings, _ = build(
        ["--engine", "fake", "--reasoning-parser", "deepseek_r1", "--no-reasoning-content-field",
         "--default-chat-template-kwargs", '{"enable_thinking": false}']
    )
    assert (settings.reasoning_parser, settings.reasoning_content_field) == ("deepseek_r1", False)
    assert settings.default_chat_template_kwargs == {"enable_thinking": False}


def test_bad_flags_are_refused_at_start(capsys):
    with pytest.raises(SystemExit, match="unknown --reasoning-parser 'nope'"):
        build(["--engine", "fake", "--reasoning-parser", "nope"])
    with pytest.raises(SystemExit):
        build(["--engine", "fake", "--default-chat-template-kwargs", "[1]"])
    assert "expected a JSON object" in capsys.readouterr().err


def test_config_file_takes_the_kwargs_as_a_mapping(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("reasoning_parser: qwen3\ndefault_chat_template_kwargs:\n  enable_thinking: false\n")
    argv = expand_config_file(["serve", "--config", str(path)])
    settings, _ = build(argv[1:] + ["--engine", "fake"])
    assert settings.reasoning_parser == "qwen3" and settings.default_chat_template_kwargs == {"enable_thinking": False}
