"""vllm_params.SamplingBuilder's SamplingParams against vLLM's constructor and vLLM's own server.

The builder answers most requests with a copy of one it built before (engine_adapter/vllm_params.py):
every field must be what `SamplingParams(...)` gives for the same request (but for the stop-id set,
which may already hold the engine's EOS ids that vLLM's input processor adds), and after the input
processor's work on it and on earlier copies of the same entry, every field without exception; the
same against what vLLM's server (`ChatCompletionRequest.to_sampling_params`) builds for the same
chat request. It imports vLLM
(about 13 s), so it runs with the engine tests, and over each supported release's sources
(make check-vllm).
"""

from __future__ import annotations

import random
from typing import Any

import msgspec
import pytest

from engine_adapter.base import GenerationParams
from engine_adapter.vllm_params import SamplingBuilder, sampling_params
from streamproxy.core import params as P
from streamproxy.protocol.openai_chat import decode_request

pytestmark = [pytest.mark.engine, pytest.mark.vllm_sources]

EOS = 2
GENERATION_CONFIG = {"eos_token_id": [2, 7]}  # a model whose generation config names a second EOS id
ENGINE_EOS_IDS = {2, 7}


def before_processing(sp: Any) -> dict[str, Any]:
    """Every field but the stop-id set, which must hold the request's stop ids and at most the EOS ids."""
    out = fields(sp)
    stop_ids = out.pop("all_stop_token_ids")
    del out["_all_stop_token_ids"]
    assert set(sp.stop_token_ids) <= stop_ids <= set(sp.stop_token_ids) | ENGINE_EOS_IDS
    return out


def fields(sp: Any) -> dict[str, Any]:
    """Every field, and the derived values vLLM reads (its cached sampling type included)."""
    return {**msgspec.structs.asdict(sp), "sampling_type": sp.sampling_type,
            "all_stop_token_ids": set(sp.all_stop_token_ids), "eos_token_id": sp.eos_token_id}


def processed(sp: Any) -> Any:
    """What vLLM's input processor does to a request's params before it goes to the engine core."""
    copy = sp.clone()
    copy.update_from_generation_config(GENERATION_CONFIG, EOS)
    return copy


def random_params(rng: random.Random) -> GenerationParams:
    """One of a few parameter sets (so the builder's entries are reused), with its own max_tokens and seed."""
    shape = rng.randrange(6)
    params = GenerationParams(max_tokens=rng.randint(1, 900), seed=rng.choice([None, None, 0, 7, rng.randrange(2**40)]))
    if shape >= 1:
        params.temperature = rng.choice([0.0, 0.7, 1.0, 1.3])
        params.top_p = rng.choice([1.0, 0.9])
    if shape >= 2:
        params.top_k = rng.choice([0, 1, 40])
        params.stop = rng.choice([[], ["\n\n"], ["END", "###"]])
        params.include_stop_str_in_output = rng.random() < 0.3
    if shape >= 3:
        params.stop_token_ids = rng.choice([[], [5], [9, 5, 9]])
        params.ignore_eos = rng.random() < 0.5
        params.min_tokens = rng.choice([0, 1])
    if shape >= 4:
        params.logprobs = rng.choice([None, 0, 3])
        params.presence_penalty, params.frequency_penalty = 0.5, -0.25
        params.repetition_penalty = 1.1
    if shape >= 5:
        params.n = 1 if params.temperature == 0.0 else rng.choice([1, 2])
        params.skip_special_tokens = False
        params.min_p = 0.05
        params.prompt_logprobs = rng.choice([None, 1])
    return params


def test_every_field_is_the_constructors_also_after_vllm_worked_on_earlier_copies():
    rng = random.Random(34)
    build = SamplingBuilder(ENGINE_EOS_IDS)
    shapes = [random_params(rng) for _ in range(30)]
    made = []
    for _ in range(600):
        params = msgspec.structs.replace(rng.choice(shapes), max_tokens=rng.randint(1, 900),
                                         seed=rng.choice([None, 0, 7, rng.randrange(2**40)]))
        fast, fresh = build(params), sampling_params(params)
        assert before_processing(fast) == before_processing(fresh), params
        assert fields(processed(fast)) == fields(processed(fresh)), params
        made.append(fast)
    assert len(build._made) <= 60  # entries were reused: the check covered copies, not only first builds
    # Each request's own lists: a change to one request's stop strings reaches no other.
    assert len({id(sp.stop) for sp in made}) == len(made)
    assert len({id(sp.stop_token_ids) for sp in made}) == len(made)


def test_logit_bias_and_structured_outputs_are_built_from_scratch_alike():
    build = SamplingBuilder(ENGINE_EOS_IDS)
    for params in (GenerationParams(max_tokens=8, logit_bias={5: 1.5}),
                   GenerationParams(max_tokens=8, structured={"regex": "a+"})):
        assert fields(build(params)) == fields(sampling_params(params))
        assert fields(processed(build(params))) == fields(processed(sampling_params(params)))
    assert build._made == {}


@pytest.mark.parametrize("given", [dict(max_tokens=0), dict(max_tokens=3, min_tokens=4), dict(max_tokens=0, seed=5)])
def test_what_the_constructor_refuses_the_builder_refuses_in_its_words(given):
    from vllm.exceptions import VLLMValidationError

    build = SamplingBuilder(ENGINE_EOS_IDS)
    build(GenerationParams(max_tokens=10))  # an entry that a copy could come from
    with pytest.raises(VLLMValidationError) as ours:
        build(GenerationParams(**given))
    with pytest.raises(VLLMValidationError) as theirs:
        sampling_params(GenerationParams(**given))
    assert str(ours.value) == str(theirs.value)


def test_seed_minus_one_is_no_seed_as_in_the_constructor():
    build = SamplingBuilder(ENGINE_EOS_IDS)
    build(GenerationParams(max_tokens=10, seed=3))
    assert build(GenerationParams(max_tokens=10, seed=-1)).seed is None
    assert fields(build(GenerationParams(max_tokens=10, seed=-1))) == fields(sampling_params(GenerationParams(max_tokens=10, seed=-1)))


def test_an_entry_whose_stop_ids_gained_anything_but_the_eos_ids_is_built_again():
    """Should a vLLM release add a request's own ids to the shared set, no later request may see them."""
    build = SamplingBuilder(ENGINE_EOS_IDS)
    first = build(GenerationParams(max_tokens=10, stop_token_ids=[5]))
    processed(first).all_stop_token_ids.add(99)  # the shared set, as such a release would change it
    again = build(GenerationParams(max_tokens=12, stop_token_ids=[5]))
    assert again.all_stop_token_ids == {5}
    assert fields(again) == fields(sampling_params(GenerationParams(max_tokens=12, stop_token_ids=[5])))


def test_the_engines_eos_ids_are_the_tokenizers_and_the_generation_configs():
    from types import SimpleNamespace

    from engine_adapter.vllm_params import eos_ids

    tokenizer = SimpleNamespace(eos_token_id=2)
    assert eos_ids(tokenizer, SimpleNamespace(generation_config_fields={"eos_token_id": [2, 7]})) == {2, 7}
    assert eos_ids(tokenizer, SimpleNamespace(generation_config_fields={"eos_token_id": 9})) == {2, 9}
    assert eos_ids(SimpleNamespace(eos_token_id=None), SimpleNamespace(generation_config_fields={})) == set()


def random_body(rng: random.Random) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    optional = {
        "max_tokens": lambda: rng.randint(1, 500),
        "temperature": lambda: rng.choice([0.0, 0.5, 1.0, 1.7]),
        "top_p": lambda: rng.choice([0.5, 1.0]),
        "top_k": lambda: rng.choice([0, 1, 50]),
        "min_p": lambda: rng.choice([0.0, 0.1]),
        "seed": lambda: rng.choice([0, 12345, 2**33]),
        "stop": lambda: rng.choice(["x", ["a", "bcd"], []]),
        "stop_token_ids": lambda: rng.choice([[3], [4, 3, 4]]),
        "presence_penalty": lambda: rng.choice([-1.0, 0.0, 1.5]),
        "frequency_penalty": lambda: rng.choice([-0.5, 0.7]),
        "repetition_penalty": lambda: rng.choice([0.9, 1.2]),
        "ignore_eos": lambda: rng.random() < 0.5,
        "min_tokens": lambda: 1,
        "include_stop_str_in_output": lambda: True,
        "skip_special_tokens": lambda: False,
        "logprobs": lambda: True,
    }
    for name, value in optional.items():
        if rng.random() < 0.35:
            body[name] = value()
    if body.get("logprobs") and rng.random() < 0.5:
        body["top_logprobs"] = rng.choice([0, 2, 5])
    if body.get("temperature", 1.0) > 0 and rng.random() < 0.2:
        body["n"] = 2
    return body


def test_the_same_params_as_vllms_server_for_the_same_chat_request():
    """Every field, for many chat requests (a model without generation-config defaults, which is what
    we serve: vLLM's server would add them as `default_sampling_params`). A client's explicit
    `top_k: -1` would be -1 there and 0 here: both mean no top-k, so it is left out."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    rng = random.Random(340)
    build = SamplingBuilder(ENGINE_EOS_IDS)
    prompt_len, max_model_len = 11, 1024
    for _ in range(300):
        body = random_body(rng)
        req = decode_request(msgspec.json.encode(body))
        params = P.sampling_params(req, prompt_len=prompt_len, max_model_len=max_model_len,
                                   requested_max_tokens=P.chat_max_tokens(req), max_n=16, logprobs=P.chat_logprobs(req))
        ours = build(params)
        theirs = ChatCompletionRequest(**body).to_sampling_params(params.max_tokens, {})
        assert before_processing(ours) == before_processing(theirs), body
        assert fields(processed(ours)) == fields(processed(theirs)), body


def test_a_non_streamed_request_differs_only_in_output_kind():
    """We take a non-streamed answer as deltas too and accumulate it ourselves."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.sampling_params import RequestOutputKind

    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 20, "temperature": 0.3}
    req = decode_request(msgspec.json.encode(body))
    params = P.sampling_params(req, prompt_len=5, max_model_len=100, requested_max_tokens=20, max_n=16)
    ours, theirs = fields(SamplingBuilder()(params)), fields(ChatCompletionRequest(**body).to_sampling_params(20, {}))
    assert (ours.pop("output_kind"), theirs.pop("output_kind")) == (RequestOutputKind.DELTA, RequestOutputKind.FINAL_ONLY)
    assert ours == theirs
