"""params: request structs -> GenerationParams and chat messages."""

from __future__ import annotations

import pytest

from engine_adapter.base import GenerationParams
from streamproxy.core import params as P
from streamproxy.errors import ContextLengthExceeded, InvalidRequest
from streamproxy.protocol import openai_chat, openai_completions
from streamproxy.protocol.openai_chat import ChatCompletionRequest, ChatMessage, ContentPart, FunctionCall, ToolCall
from streamproxy.protocol.openai_completions import CompletionRequest

USER = [ChatMessage(role="user", content="hi")]


def chat_req(**kw) -> ChatCompletionRequest:
    return ChatCompletionRequest(messages=USER, **kw)


def sample(req=None, *, prompt_len=10, max_model_len=100, requested=None, max_n=4, vocab_size=None, logprobs=None):
    return P.sampling_params(
        req if req is not None else chat_req(),
        prompt_len=prompt_len,
        max_model_len=max_model_len,
        requested_max_tokens=requested,
        max_n=max_n,
        vocab_size=vocab_size,
        logprobs=logprobs,
    )


def rejected(**kw) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as info:
        sample(**kw)
    assert info.value.status == 400
    assert info.value.type == "invalid_request_error"
    return info.value


# ---------------------------------------------------------------- bounds

OUT_OF_RANGE = [
    ("n", 0),
    ("n", 5),
    ("temperature", -0.1),
    ("temperature", 2.01),
    ("top_p", 0.0),
    ("top_p", 1.01),
    ("top_k", -2),
    ("min_p", -0.01),
    ("min_p", 1.01),
    ("presence_penalty", -2.01),
    ("presence_penalty", 2.01),
    ("frequency_penalty", -2.01),
    ("frequency_penalty", 2.01),
    ("repetition_penalty", 0.0),
    ("repetition_penalty", 2.01),
    ("min_tokens", -1),
    ("min_tokens", 91),  # more than max_tokens (the 90 tokens of room left)
    ("seed", 2**64),
    ("seed", -(2**63) - 1),
]


@pytest.mark.parametrize(("field", "value"), OUT_OF_RANGE)
def test_out_of_range_parameter_names_itself(field, value):
    err = rejected(req=chat_req(**{field: value}))
    assert err.param == field


@pytest.mark.parametrize(("field", "value"), OUT_OF_RANGE)
def test_out_of_range_parameter_rejected_for_completions_too(field, value):
    with pytest.raises(InvalidRequest) as info:
        sample(CompletionRequest(prompt="x", **{field: value}))
    assert info.value.param == field


IN_RANGE = [
    ("n", 1),
    ("n", 4),
    ("temperature", 0.0),
    ("temperature", 2.0),
    ("top_p", 1.0),
    ("top_p", 0.01),
    ("min_p", 0.0),
    ("min_p", 1.0),
    ("presence_penalty", -2.0),
    ("presence_penalty", 2.0),
    ("frequency_penalty", -2.0),
    ("frequency_penalty", 2.0),
    ("repetition_penalty", 2.0),
    ("repetition_penalty", 0.5),
    ("min_tokens", 90),
    ("seed", 2**64 - 1),
    ("seed", -(2**63)),
]


@pytest.mark.parametrize(("field", "value"), IN_RANGE)
def test_boundary_values_are_accepted(field, value):
    params = sample(chat_req(**{field: value}))
    assert getattr(params, field) == value


def test_temperature_message_names_bounds_and_value():
    err = rejected(req=chat_req(temperature=3.0))
    assert err.message == "'temperature' must be between 0 and 2, got 3"


def test_n_message_names_the_server_limit():
    assert rejected(req=chat_req(n=9), max_n=8).message == "'n' must be between 1 and 8, got 9"


def test_top_k_minus_one_means_disabled():
    assert sample(chat_req(top_k=-1)).top_k == 0


def test_top_k_positive_passes_through():
    assert sample(chat_req(top_k=40)).top_k == 40


def test_unset_fields_keep_engine_defaults():
    params = sample(chat_req())
    default = GenerationParams(max_tokens=90)
    assert params == default


def test_set_fields_override_defaults():
    params = sample(chat_req(temperature=0.0, top_p=0.5, presence_penalty=1.0, seed=7, ignore_eos=True, min_tokens=3))
    assert (params.temperature, params.top_p, params.presence_penalty, params.seed, params.ignore_eos, params.min_tokens) == (
        0.0, 0.5, 1.0, 7, True, 3
    )


def test_logprobs_argument_is_passed_on():
    assert sample(logprobs=5).logprobs == 5


# ---------------------------------------------------------------- stop


def test_stop_string_becomes_a_list():
    assert sample(chat_req(stop="END")).stop == ["END"]


def test_stop_list_passes_through():
    assert sample(chat_req(stop=["a", "b"])).stop == ["a", "b"]


def test_no_stop_is_empty_list():
    assert sample(chat_req()).stop == []


def test_empty_stop_string_is_rejected_as_stop():
    assert rejected(req=chat_req(stop="")).param == "stop"


def test_empty_stop_in_list_names_its_index():
    assert rejected(req=chat_req(stop=["a", ""])).param == "stop[1]"


def test_stop_token_ids_pass_through():
    assert sample(chat_req(stop_token_ids=[2, 3])).stop_token_ids == [2, 3]


# ---------------------------------------------------------------- logit_bias


def test_logit_bias_keys_become_ints():
    assert sample(chat_req(logit_bias={"5": 1.5, "7": -100.0})).logit_bias == {5: 1.5, 7: -100.0}


def test_empty_logit_bias_is_none():
    assert sample(chat_req(logit_bias={})).logit_bias is None


@pytest.mark.parametrize("bias", [{"x": 1.0}, {"-1": 1.0}, {"5": 100.5}, {"5": -101.0}, {"100": 1.0}])
def test_bad_logit_bias_is_rejected(bias):
    assert rejected(req=chat_req(logit_bias=bias), vocab_size=100).param == "logit_bias"


# ---------------------------------------------------------------- max_tokens / context


def test_max_tokens_defaults_to_rest_of_context():
    assert sample(prompt_len=30, max_model_len=100).max_tokens == 70


def test_requested_max_tokens_is_used():
    assert sample(requested=16).max_tokens == 16


def test_max_tokens_may_fill_the_context_exactly():
    assert sample(prompt_len=10, max_model_len=100, requested=90).max_tokens == 90


def test_max_tokens_below_one_is_rejected():
    err = rejected(requested=0)
    assert err.param == "max_tokens"
    assert not isinstance(err, ContextLengthExceeded)


def test_max_tokens_past_context_names_both_lengths():
    with pytest.raises(ContextLengthExceeded) as info:
        sample(prompt_len=10, max_model_len=100, requested=91)
    err = info.value
    assert (err.status, err.type, err.code, err.param) == (400, "invalid_request_error", "context_length_exceeded", "max_tokens")
    assert err.message == (
        "This model's maximum context length is 100 tokens. However, you requested 101 tokens "
        "(10 in the prompt, 91 for the completion). Please reduce the prompt or max_tokens."
    )


def test_prompt_filling_the_context_is_rejected_for_chat():
    with pytest.raises(ContextLengthExceeded) as info:
        sample(prompt_len=100, max_model_len=100)
    assert info.value.param == "messages"
    assert info.value.message == (
        "This model's maximum context length is 100 tokens, but the prompt has 100 tokens. Please shorten the prompt."
    )


def test_prompt_too_long_names_prompt_for_completions():
    with pytest.raises(ContextLengthExceeded) as info:
        sample(CompletionRequest(prompt="x"), prompt_len=120, max_model_len=100)
    assert info.value.param == "prompt"
    assert "100 tokens" in info.value.message and "120 tokens" in info.value.message


def test_completion_request_default_max_tokens_is_16():
    req = openai_completions.decode_request(b'{"prompt":"x"}')
    assert req.max_tokens == 16
    assert sample(req, requested=req.max_tokens).max_tokens == 16


# ---------------------------------------------------------------- chat_max_tokens / chat_logprobs


def test_max_completion_tokens_is_max_tokens():
    assert P.chat_max_tokens(chat_req(max_completion_tokens=12)) == 12


def test_max_completion_tokens_wins_over_max_tokens():
    assert P.chat_max_tokens(chat_req(max_tokens=5, max_completion_tokens=12)) == 12


def test_max_tokens_alone():
    assert P.chat_max_tokens(chat_req(max_tokens=5)) == 5


def test_no_max_tokens_is_none():
    assert P.chat_max_tokens(chat_req()) is None


def test_max_completion_tokens_from_the_wire():
    req = openai_chat.decode_request(b'{"messages":[{"role":"user","content":"hi"}],"max_completion_tokens":7}')
    assert sample(req, requested=P.chat_max_tokens(req)).max_tokens == 7


def test_logprobs_off_is_none():
    assert P.chat_logprobs(chat_req()) is None


def test_logprobs_on_without_top_is_zero():
    assert P.chat_logprobs(chat_req(logprobs=True)) == 0


def test_top_logprobs_is_the_count():
    assert P.chat_logprobs(chat_req(logprobs=True, top_logprobs=5)) == 5


@pytest.mark.parametrize("kw", [{"logprobs": True, "top_logprobs": 21}, {"logprobs": True, "top_logprobs": -1}, {"top_logprobs": 3}])
def test_bad_top_logprobs_is_rejected(kw):
    with pytest.raises(InvalidRequest) as info:
        P.chat_logprobs(chat_req(**kw))
    assert info.value.param == "top_logprobs"


# ---------------------------------------------------------------- chat_messages


def test_plain_messages_become_dicts():
    msgs = [ChatMessage(role="system", content="be brief"), ChatMessage(role="user", content="hi")]
    assert P.chat_messages(msgs) == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]


def test_developer_becomes_system():
    assert P.chat_messages([ChatMessage(role="developer", content="rules")]) == [{"role": "system", "content": "rules"}]


def test_invalid_role_names_its_message():
    msgs = [ChatMessage(role="user", content="hi"), ChatMessage(role="robot", content="beep")]
    with pytest.raises(InvalidRequest) as info:
        P.chat_messages(msgs)
    assert info.value.param == "messages[1].role"
    assert info.value.status == 400
    assert "'robot'" in info.value.message


def test_empty_messages_are_rejected():
    with pytest.raises(InvalidRequest) as info:
        P.chat_messages([])
    assert info.value.param == "messages"


def test_text_parts_are_joined_with_newline():
    parts = [ContentPart(type="text", text="one"), ContentPart(type="text", text="two")]
    assert P.chat_messages([ChatMessage(role="user", content=parts)]) == [{"role": "user", "content": "one\ntwo"}]


def test_text_parts_from_the_wire():
    req = openai_chat.decode_request(
        b'{"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}]}'
    )
    assert P.chat_messages(req.messages) == [{"role": "user", "content": "a\nb"}]


@pytest.mark.parametrize("kind", ["image_url", "input_audio", "file"])
def test_non_text_part_is_a_400_naming_the_part(kind):
    parts = [ContentPart(type="text", text="look"), ContentPart(type=kind)]
    msgs = [ChatMessage(role="system", content="s"), ChatMessage(role="user", content=parts)]
    with pytest.raises(InvalidRequest) as info:
        P.chat_messages(msgs)
    assert info.value.status == 400
    assert info.value.param == "messages[1].content[1].type"
    assert f"'{kind}'" in info.value.message


def test_unknown_part_type_is_rejected():
    with pytest.raises(InvalidRequest) as info:
        P.chat_messages([ChatMessage(role="user", content=[ContentPart(type="hologram")])])
    assert info.value.param == "messages[0].content[0].type"


def test_text_part_without_text_is_rejected():
    with pytest.raises(InvalidRequest) as info:
        P.chat_messages([ChatMessage(role="user", content=[ContentPart(type="text")])])
    assert info.value.param == "messages[0].content[0].text"


def test_missing_content_becomes_empty_string():
    assert P.chat_messages([ChatMessage(role="assistant")]) == [{"role": "assistant", "content": ""}]


def test_tool_fields_are_carried():
    call = ToolCall(id="call_1", function=FunctionCall(name="f", arguments='{"a":1}'))
    msgs = [
        ChatMessage(role="assistant", tool_calls=[call], reasoning_content="think"),
        ChatMessage(role="tool", content="42", tool_call_id="call_1", name="f"),
    ]
    assert P.chat_messages(msgs) == [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"a":1}'}}],
            "reasoning_content": "think",
        },
        {"role": "tool", "content": "42", "name": "f", "tool_call_id": "call_1"},
    ]


def test_reasoning_wins_over_reasoning_content():
    msg = ChatMessage(role="assistant", content="x", reasoning="r1", reasoning_content="r2")
    assert P.chat_messages([msg])[0]["reasoning_content"] == "r1"


# ---------------------------------------------------------------- completion_prompts


def _prompts(body: bytes):
    return P.completion_prompts(openai_completions.decode_request(body).prompt)


def test_string_prompt():
    assert _prompts(b'{"prompt":"hello"}') == ["hello"]


def test_list_of_strings():
    assert _prompts(b'{"prompt":["a","b"]}') == ["a", "b"]


def test_token_ids_are_one_prompt():
    assert _prompts(b'{"prompt":[1,2,3]}') == [[1, 2, 3]]


def test_list_of_token_id_lists():
    assert _prompts(b'{"prompt":[[1,2],[3]]}') == [[1, 2], [3]]


@pytest.mark.parametrize("body", [b'{"prompt":""}', b'{"prompt":["a",""]}', b'{"prompt":[[1],[]]}'])
def test_an_empty_prompt_is_rejected_also_inside_a_batch(body):
    with pytest.raises(InvalidRequest) as info:
        _prompts(body)
    assert info.value.param == "prompt" and "empty" in info.value.message


@pytest.mark.parametrize("body", [b'{"prompt":[]}', b'{"prompt":["a",1]}', b'{"prompt":[1,[2]]}', b'{"prompt":["a",[1]]}'])
def test_bad_prompt_shapes_are_rejected(body):
    with pytest.raises(InvalidRequest) as info:
        _prompts(body)
    assert info.value.param == "prompt"
