"""The tool-calling flags, and the vLLM adapter's logprob conversion (no vLLM import)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import pytest

from engine_adapter.base import GenerationParams
from engine_adapter.token_bytes import TokenBytes
from engine_adapter.vllm_params import rejected
from engine_adapter.vllm_stream import _logprobs
from streamproxy.cli import build


def test_flags_reach_the_settings():
    settings, _ = build(["--engine", "fake", "--enable-auto-tool-choice", "--tool-call-parser", "pythonic"])
    assert (settings.enable_auto_tool_choice, settings.tool_call_parser) == (True, "pythonic")
    settings, _ = build(["--engine", "fake"])
    assert (settings.enable_auto_tool_choice, settings.tool_call_parser) == (False, None)


def test_auto_tool_choice_needs_a_parser():
    with pytest.raises(SystemExit, match="--enable-auto-tool-choice requires --tool-call-parser"):
        build(["--engine", "fake", "--enable-auto-tool-choice"])


def test_unknown_parser_is_refused_at_start():
    with pytest.raises(SystemExit, match="unknown --tool-call-parser 'nope'.*hermes, llama3_json"):
        build(["--engine", "fake", "--tool-call-parser", "nope"])


@dataclass
class Logprob:  # the fields of vllm.logprobs.Logprob the adapter reads
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


def test_vllm_positions_become_token_logprobs():
    vocab = {1: b"\xe4\xbd", 2: b" a", 3: b"b"}
    # vLLM: the sampled token first (its own rank), then the top-k by rank.
    positions = [
        {1: Logprob(-0.5, 2), 2: Logprob(-0.1, 1)},
        {3: Logprob(-0.2, 1), 2: Logprob(-3.0, 2)},
    ]
    token_bytes = cast(TokenBytes, vocab.__getitem__)  # _logprobs only calls it
    out = _logprobs([1, 3], positions, token_bytes, 2)
    assert out is not None
    assert [(t.token_id, t.token, t.bytes, t.logprob) for t in out] == [(1, "\\xe4\\xbd", b"\xe4\xbd", -0.5), (3, "b", b"b", -0.2)]
    assert [[(a.token_id, a.logprob) for a in t.top] for t in out] == [[(2, -0.1), (1, -0.5)], [(3, -0.2), (2, -3.0)]]
    zero = _logprobs([1], positions[:1], token_bytes, 0)
    assert zero is not None and zero[0].top == [] and zero[0].logprob == -0.5
    assert _logprobs([1], None, token_bytes, 0) is None


def test_engine_refusal_names_the_structured_constraint():
    with_constraint = GenerationParams(max_tokens=1, structured={"regex": "(?<=a)"})
    err = rejected("Grammar error: look-around is not supported", None, with_constraint)
    assert str(err) == "the structured-output constraint cannot be compiled: Grammar error: look-around is not supported"
    assert str(rejected("Grammar error", None, GenerationParams(max_tokens=1))) == "Grammar error"
    assert str(rejected("temperature must be >= 0", "temperature", with_constraint)) == "temperature must be >= 0"
