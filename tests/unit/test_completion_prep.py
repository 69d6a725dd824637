"""core.completion (prompts -> ids and params), core.echo, and the logprobs shapes echo and prompt_logprobs use."""

from __future__ import annotations

import pytest

from engine_adapter.base import Delta, TokenLogprob
from engine_adapter.fake import FakeEngine
from streamproxy.core import completion as C
from streamproxy.core.echo import Echo
from streamproxy.core.logprobs import CompletionLogprobs, vllm_prompt_logprobs
from streamproxy.errors import ContextLengthExceeded, InvalidRequest
from streamproxy.protocol.openai_completions import decode_request

ENGINE = FakeEngine(max_model_len=20)


def plan(body: bytes) -> C.CompletionPlan:
    return C.plan(ENGINE, decode_request(body), max_n=4)


def lp(token: str, value: float | None, top: tuple = ()) -> TokenLogprob:
    return TokenLogprob(ord(token[0]), token, token.encode(), value, top)


# -- plan ---------------------------------------------------------------------------------------


def test_a_batch_is_one_prompt_each_with_its_own_room_when_max_tokens_is_omitted():
    p = plan(b'{"prompt": ["abc", "a"], "max_tokens": null, "n": 2}')
    assert p.prompts == [[97, 98, 99], [97]]
    assert [x.max_tokens for x in p.params] == [17, 19]
    assert p.n == 2 and p.choices == 4 and p.texts is None and not p.prompt_only


def test_token_id_prompts_are_kept_and_echo_decodes_them():
    p = plan(b'{"prompt": [[104, 105], [120]], "echo": true}')
    assert p.prompts == [[104, 105], [120]]
    assert p.texts == ["hi", "x"]


def test_echo_with_max_tokens_0_asks_the_engine_for_one_token_and_logprobs_for_the_prompt():
    p = plan(b'{"prompt": "ab", "echo": true, "max_tokens": 0, "logprobs": 3}')
    assert p.prompt_only and p.params[0].max_tokens == 1
    assert p.params[0].logprobs == 3 and p.params[0].prompt_logprobs == 3  # vLLM: echo's prompt logprobs = logprobs


def test_prompt_logprobs_of_its_own_win_over_echos():
    p = plan(b'{"prompt": "ab", "echo": true, "logprobs": 3, "prompt_logprobs": 1}')
    assert p.params[0].prompt_logprobs == 1


def test_without_echo_no_prompt_logprobs_unless_asked():
    assert plan(b'{"prompt": "ab", "logprobs": 3}').params[0].prompt_logprobs is None


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        (b'{"prompt": "ab", "max_tokens": 0}', "max_tokens", "0 only with 'echo'"),
        (b'{"prompt": ["ab", ""]}', "prompt", "prompt 1 of the list is empty"),
        (b'{"prompt": [[1], [-1]]}', "prompt", "prompt 1 of the list"),
        (b'{"prompt": ["ab", "' + b"x" * 25 + b'"]}', "prompt", "prompt 1 of the list: This model's maximum context length"),
        (b'{"prompt": ["ab", "' + b"x" * 10 + b'"], "max_tokens": 12}', "max_tokens", "prompt 1 of the list"),
        (b'{"prompt": "ab", "best_of": 2}', "best_of", "not supported"),
        (b'{"prompt": "ab", "n": 3, "best_of": 2}', "best_of", "at least 'n'"),
        (b'{"prompt": "ab", "suffix": "z"}', "suffix", "not supported"),
        (b'{"prompt": "ab", "prompt_logprobs": 1, "stream": true}', "prompt_logprobs", "stream"),
        (b'{"prompt": "ab", "prompt_logprobs": -3}', "prompt_logprobs", "-1"),
        (b'{"prompt": [' + b",".join([b'"a"'] * 1025) + b"]}", "prompt", "at most 1024"),
    ],
)
def test_errors_name_the_parameter_and_the_prompt(body, param, words):
    with pytest.raises(InvalidRequest) as info:
        plan(body)
    assert info.value.param == param and words in info.value.message, info.value.message


def test_a_prompt_too_long_is_a_context_length_error():
    with pytest.raises(ContextLengthExceeded):
        plan(b'{"prompt": "' + b"x" * 25 + b'"}')


def test_best_of_equal_to_n_is_fine():
    assert plan(b'{"prompt": "ab", "n": 2, "best_of": 2}').n == 2


# -- echo ---------------------------------------------------------------------------------------


def test_echo_prepends_the_prompt_to_each_choices_first_delta_only():
    echo = Echo("Q: ", 2)
    first = echo([Delta(0, "a", 1), Delta(1, "b", 1)], None)
    later = echo([Delta(0, "c", 1, "stop")], None)
    assert [(d.index, d.text, d.num_tokens) for d in first] == [(0, "Q: a", 1), (1, "Q: b", 1)]
    assert [(d.text, d.finish_reason) for d in later] == [("c", "stop")]


def test_echo_before_half_a_character_stays_bytes():
    (d,) = Echo("é", 1)([Delta(0, b"\xe2\x82", 1)], None)
    assert d.text == "é".encode() + b"\xe2\x82"


def test_echo_puts_the_prompts_logprobs_first():
    prompt = [lp("Q", None), lp(":", -0.5)]
    (d,) = Echo("Q:", 1, logprobs=True)([Delta(0, "a", 1, logprobs=[lp("a", -0.1)])], prompt)
    assert [(t.token, t.logprob) for t in d.logprobs or ()] == [("Q", None), (":", -0.5), ("a", -0.1)]


def test_prompt_only_keeps_the_count_and_the_finish_and_drops_the_answer():
    echo = Echo("Q", 1, prompt_only=True, logprobs=True)
    (d,) = echo([Delta(0, "a", 1, "length", [7], [lp("a", -0.1)])], [lp("Q", None)])
    assert (d.text, d.num_tokens, d.finish_reason, d.token_ids) == ("Q", 1, "length", None)
    assert [t.token for t in d.logprobs or ()] == ["Q"]
    (later,) = echo([Delta(0, "b", 1)], None)
    assert (later.text, later.num_tokens, later.logprobs) == ("", 1, None)


# -- logprobs shapes ------------------------------------------------------------------------------


def test_legacy_logprobs_of_an_unscored_first_prompt_token_are_null():
    out = CompletionLogprobs().add([lp("Q", None), lp("a", -0.5, (lp("a", -0.5), lp("b", -1.0)))])
    assert out == {
        "tokens": ["Q", "a"],
        "token_logprobs": [None, -0.5],
        "top_logprobs": [None, {"a": -0.5, "b": -1.0}],
        "text_offset": [0, 1],
    }


def test_vllm_prompt_logprobs_shape():
    own = TokenLogprob(5, "a", b"a", -0.5, (TokenLogprob(6, "b", b"b", -0.25, rank=1), TokenLogprob(5, "a", b"a", -0.5, rank=2)), rank=2)
    assert vllm_prompt_logprobs([lp("Q", None), own, TokenLogprob(7, "c", b"c", float("-inf"), rank=9)]) == [
        None,
        {"5": {"logprob": -0.5, "rank": 2, "decoded_token": "a"}, "6": {"logprob": -0.25, "rank": 1, "decoded_token": "b"}},
        {"7": {"logprob": -9999.0, "rank": 9, "decoded_token": "c"}},
    ]
