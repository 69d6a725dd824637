"""Batched prompts, echo and prompt logprobs on the real engine (lm-evaluation-harness's requests).

Structure only, never the model's words: counts of prompt tokens and their
logprobs, the first one null, indexes, finish reasons, usage sums, and two
ways to the same prompt (its text and its token ids) giving the same tokens.
"""

from __future__ import annotations

import pytest
import requests

from tests.support import sse

pytestmark = pytest.mark.engine

PROMPTS = ["The capital of France is", "Waves roll in, gulls cry 🐦 over the sea"]


def token_ids(base: str, text: str) -> list[int]:
    r = requests.post(base + "/tokenize", json={"prompt": text}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["tokens"]


def check_prompt_choice(choice: dict, prompt_ids: list[int], text: str) -> None:
    """An echo of the prompt alone (max_tokens 0) with its logprobs: one per prompt token, the first null."""
    assert choice["text"] == text
    assert choice["finish_reason"] in ("length", "stop")
    lp = choice["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(lp["text_offset"]) == len(prompt_ids)
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert all(isinstance(v, float) and v <= 0 for v in lp["token_logprobs"][1:])
    assert all(isinstance(top, dict) and 1 <= len(top) <= 3 for top in lp["top_logprobs"][1:])  # own token + top 2
    prompt_lp = choice["prompt_logprobs"]
    assert len(prompt_lp) == len(prompt_ids) and prompt_lp[0] is None
    for entry, token in zip(prompt_lp[1:], prompt_ids[1:]):
        assert str(token) in entry and entry[str(token)]["logprob"] <= 0 and entry[str(token)]["rank"] >= 1


def test_batch_echo_logprobs_max_tokens_0_gives_the_prompts_logprobs(engine_server, model_name):
    ids = [token_ids(engine_server, p) for p in PROMPTS]
    body = {"model": model_name, "prompt": PROMPTS, "echo": True, "logprobs": 2, "max_tokens": 0, "temperature": 0}
    r = requests.post(engine_server + "/v1/completions", json=body, timeout=300)
    assert r.status_code == 200, r.text
    answer = r.json()
    assert [c["index"] for c in answer["choices"]] == [0, 1]
    for choice, prompt_ids, text in zip(answer["choices"], ids, PROMPTS):
        check_prompt_choice(choice, prompt_ids, text)
    # vLLM's usage: the prompts, and the one token each that the engine generated and echo dropped.
    assert answer["usage"]["prompt_tokens"] == sum(map(len, ids))
    assert answer["usage"]["completion_tokens"] == 2

    # lm-evaluation-harness sends token ids: the same tokens, the text decoded.
    r = requests.post(engine_server + "/v1/completions", json={**body, "prompt": ids}, timeout=300)
    assert r.status_code == 200, r.text
    by_ids = r.json()
    for choice, prompt_ids, text in zip(by_ids["choices"], ids, PROMPTS):
        check_prompt_choice(choice, prompt_ids, text)
    assert [c["logprobs"]["tokens"] for c in by_ids["choices"]] == [c["logprobs"]["tokens"] for c in answer["choices"]]


def test_batch_stream_interleaves_indexes_and_echo_starts_each_choice(engine_server, model_name):
    body = {
        "model": model_name, "prompt": PROMPTS, "n": 2, "echo": True, "max_tokens": 5, "temperature": 0.8, "seed": 3,
        "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True},
    }
    r = requests.post(engine_server + "/v1/completions", json=body, timeout=300)
    assert r.status_code == 200, r.text
    chunks = sse.payloads(r.content)
    texts: dict[int, str] = {}
    finishes: dict[int, str] = {}
    for c in chunks[:-1]:
        (choice,) = c["choices"]
        texts[choice["index"]] = texts.get(choice["index"], "") + choice["text"]
        if choice["finish_reason"] is not None:
            finishes[choice["index"]] = choice["finish_reason"]
    assert sorted(texts) == [0, 1, 2, 3]
    assert finishes == {i: "length" for i in range(4)}
    for index, text in texts.items():
        assert text.startswith(PROMPTS[index // 2]) and len(text) > len(PROMPTS[index // 2])
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 4 * 5
    # The two prompts' engine requests ran side by side: their chunks interleave.
    order = [c["choices"][0]["index"] // 2 for c in chunks[:-1]]
    assert order != sorted(order)
