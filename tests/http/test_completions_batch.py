"""Completions as vLLM serves them to lm-evaluation-harness and LangChain: batched
prompts, echo (also `max_tokens: 0`), prompt logprobs; exact bytes on the fake engine.

A batch is one engine request per prompt (ids suffixed `-<i>`), merged into
one stream: prompt p's choice c is `index` p × n + c, steps interleave as the
engine makes them, usage is summed. The fake engine's logprobs are
deterministic (engine_adapter/fake.py): output token p has -0.25 * (p % 4 + 1),
prompt token p > 0 has -(p % 4 + 1) / 8, the first prompt token none.
"""

from __future__ import annotations

import json

from engine_adapter.fake import FakeScript
from streamproxy.http.state import SYSTEM_FINGERPRINT
from tests.http.http_support import assert_created_sane, assert_openai_error, normalize_created
from tests.support import USER_HI, USER_HI_PROMPT_TOKENS, sse

FP = SYSTEM_FINGERPRINT.encode()
HEAD = b'data: {"id":"cmpl-req-1","object":"text_completion","created":0,"model":"fake","system_fingerprint":"' + FP + b'",'
DONE = sse.DONE_FRAME + b"\n\n"
# One engine step per write (the writer keeps up with a 10 ms step): deterministic chunking.
SCRIPT = FakeScript(tokens=["Hel", "lo", " world"], token_delay=0.01)


def chunk(index: int, text: str, logprobs: object = None, finish: str | None = None) -> bytes:
    lp = b"null" if logprobs is None else json.dumps(logprobs, separators=(",", ":")).encode()
    reason = b"null" if finish is None else b'"' + finish.encode() + b'"'
    return (
        HEAD + b'"choices":[{"index":' + str(index).encode() + b',"text":' + json.dumps(text, ensure_ascii=False).encode()
        + b',"logprobs":' + lp + b',"finish_reason":' + reason + b"}]}\n\n"
    )


def usage_chunk(prompt: int, completion: int) -> bytes:
    return (
        HEAD + b'"choices":[],"usage":{"prompt_tokens":' + str(prompt).encode() + b',"completion_tokens":' + str(completion).encode()
        + b',"total_tokens":' + str(prompt + completion).encode() + b',"prompt_tokens_details":{"cached_tokens":0}}}\n\n'
    )


def legacy(tokens: list[str], logprobs: list[float | None], offsets: list[int]) -> dict:
    """The legacy logprobs object of a fake answer asked with `logprobs: 1` (its top is the token itself)."""
    return {
        "tokens": tokens,
        "token_logprobs": logprobs,
        "top_logprobs": [None if lp is None else {t: lp} for t, lp in zip(tokens, logprobs)],
        "text_offset": offsets,
    }


async def post(client, body: dict, *, stream: bool) -> bytes:
    resp = await client.post("/v1/completions", json={**body, "stream": stream}, headers={"X-Request-Id": "req-1"})
    raw = await resp.read()
    assert resp.status == 200, raw
    assert resp.headers["Content-Type"].startswith("text/event-stream" if stream else "application/json")
    normalized, created = normalize_created(raw)
    assert_created_sane(created)
    return normalized


# -- batches -------------------------------------------------------------------------------------


async def test_batched_prompts_stream_interleaved_choices_indexed_prompt_times_n(serve):
    client, engine = await serve(SCRIPT)
    body = await post(client, {"prompt": ["ab", "c"], "n": 2, "max_tokens": 2, "stream_options": {"include_usage": True}}, stream=True)
    assert body == (
        # Step 1: both prompts' two choices, prompt 1's numbered 2 and 3.
        chunk(0, "Hel") + chunk(1, "Hel") + chunk(2, "Hel") + chunk(3, "Hel")
        # Step 2: the last token of each, and each choice's finish.
        + chunk(0, "lo") + chunk(0, "", finish="length") + chunk(1, "lo") + chunk(1, "", finish="length")
        + chunk(2, "lo") + chunk(2, "", finish="length") + chunk(3, "lo") + chunk(3, "", finish="length")
        + usage_chunk(3, 8)
        + DONE
    )
    # One engine request per prompt, ids suffixed as vLLM does; each asked for n choices.
    assert [(rid, ids, p.n) for rid, ids, p in engine.submitted] == [("req-1-0", [97, 98], 2), ("req-1-1", [99], 2)]


async def test_batched_token_id_lists_non_stream_answer_in_index_order_with_summed_usage(serve):
    client, engine = await serve(SCRIPT)
    body = await post(client, {"prompt": [[97, 98], [99], [100]], "max_tokens": 4}, stream=False)
    assert json.loads(body) == {
        "id": "cmpl-req-1",
        "object": "text_completion",
        "created": 0,
        "model": "fake",
        "system_fingerprint": SYSTEM_FINGERPRINT,
        "choices": [
            {"index": i, "text": "Hello world", "logprobs": None, "finish_reason": "stop"} for i in range(3)
        ],
        "usage": {"prompt_tokens": 4, "completion_tokens": 9, "total_tokens": 13, "prompt_tokens_details": {"cached_tokens": 0}},
    }
    assert [ids for _, ids, _ in engine.submitted] == [[97, 98], [99], [100]]
    assert engine.num_running == 0


async def test_a_batch_keeps_each_choices_utf8_whole_across_steps(serve):
    # "€" split over two engine steps, in every choice of every prompt.
    client, _ = await serve(FakeScript(tokens=[b"\xe2\x82", b"\xac!"], token_delay=0.01))
    body = await post(client, {"prompt": ["a", "b"], "n": 1}, stream=True)
    assert body == (
        chunk(0, "€!") + chunk(0, "", finish="stop") + chunk(1, "€!") + chunk(1, "", finish="stop") + DONE
    )


async def test_an_engine_failure_in_a_batch_ends_the_stream_with_an_error_and_leaves_nothing_running(serve):
    client, engine = await serve(FakeScript(text=" word", token_delay=0.01, fail_after=1))
    body = await post(client, {"prompt": ["a", "b"], "max_tokens": 10, "logprobs": 0}, stream=True)
    frames = sse.data(body)
    assert frames[-1] == b"[DONE]"
    error = json.loads(frames[-2])
    assert set(error) == {"error"} and "injected failure" in error["error"]["message"]
    assert engine.num_running == 0


async def test_a_single_plain_prompt_is_still_one_unsuffixed_engine_request(serve):
    client, engine = await serve(SCRIPT)
    await post(client, {"prompt": ["hi"]}, stream=True)
    assert [rid for rid, _, _ in engine.submitted] == ["req-1"]


# -- echo ----------------------------------------------------------------------------------------


async def test_echo_stream_puts_the_prompt_before_each_choices_text(serve):
    client, engine = await serve(SCRIPT)
    body = await post(client, {"prompt": ["hi", "yo"], "echo": True, "max_tokens": 2}, stream=True)
    assert body == (
        chunk(0, "hiHel") + chunk(1, "yoHel")
        + chunk(0, "lo") + chunk(0, "", finish="length") + chunk(1, "lo") + chunk(1, "", finish="length")
        + DONE
    )
    assert [p.prompt_logprobs for _, _, p in engine.submitted] == [None, None]  # no logprobs asked: none computed


async def test_echo_with_logprobs_stream_gives_the_prompts_logprobs_first_the_first_null(serve):
    client, engine = await serve(SCRIPT)
    body = await post(client, {"prompt": "abc", "echo": True, "logprobs": 1, "max_tokens": 2}, stream=True)
    first = legacy(["a", "b", "c", "Hel"], [None, -0.25, -0.375, -0.25], [0, 1, 2, 3])
    assert body == (
        chunk(0, "abcHel", first)
        + chunk(0, "lo", legacy(["lo"], [-0.5], [6]))
        + chunk(0, "", finish="length")
        + DONE
    )
    # vLLM's rule: with echo, the prompt's logprobs are asked for as many as `logprobs`.
    assert engine.submitted[-1][2].prompt_logprobs == 1


async def test_echo_non_stream_with_and_without_logprobs(serve):
    client, _ = await serve(SCRIPT)
    plain = json.loads(await post(client, {"prompt": "abc", "echo": True, "max_tokens": 3}, stream=False))
    assert plain["choices"] == [{"index": 0, "text": "abcHello world", "logprobs": None, "finish_reason": "length"}]
    with_lp = json.loads(await post(client, {"prompt": "abc", "echo": True, "max_tokens": 1, "logprobs": 1}, stream=False))
    assert with_lp["choices"] == [
        {
            "index": 0,
            "text": "abcHel",
            "logprobs": legacy(["a", "b", "c", "Hel"], [None, -0.25, -0.375, -0.25], [0, 1, 2, 3]),
            "finish_reason": "length",
            # vLLM sends the prompt's logprobs in its own shape as well.
            "prompt_logprobs": [
                None,
                {"98": {"logprob": -0.25, "rank": 1, "decoded_token": "b"}},
                {"99": {"logprob": -0.375, "rank": 1, "decoded_token": "c"}},
            ],
        }
    ]
    assert with_lp["usage"]["prompt_tokens"] == 3 and with_lp["usage"]["completion_tokens"] == 1


async def test_echo_max_tokens_0_stream_is_the_prompt_alone_with_its_logprobs(serve):
    client, engine = await serve(SCRIPT)
    body = await post(
        client,
        {"prompt": ["abc", "de"], "echo": True, "max_tokens": 0, "logprobs": 1, "stream_options": {"include_usage": True}},
        stream=True,
    )
    assert body == (
        chunk(0, "abc", legacy(["a", "b", "c"], [None, -0.25, -0.375], [0, 1, 2]))
        + chunk(0, "", finish="length")
        + chunk(1, "de", legacy(["d", "e"], [None, -0.25], [0, 1]))
        + chunk(1, "", finish="length")
        # vLLM's usage: the one token the engine was asked for counts (it is generated, then dropped).
        + usage_chunk(5, 2)
        + DONE
    )
    assert [p.max_tokens for _, _, p in engine.submitted] == [1, 1]


async def test_echo_max_tokens_0_non_stream_of_token_id_prompts_decodes_them(serve):
    # lm-evaluation-harness's loglikelihood request: token ids, echo, logprobs, max_tokens 0.
    client, _ = await serve(SCRIPT)
    answer = json.loads(await post(client, {"prompt": [[104, 105], [120]], "echo": True, "max_tokens": 0, "logprobs": 0}, stream=False))
    assert [(c["index"], c["text"], c["finish_reason"]) for c in answer["choices"]] == [(0, "hi", "length"), (1, "x", "length")]
    first = answer["choices"][0]
    assert first["logprobs"] == legacy(["h", "i"], [None, -0.25], [0, 1])
    assert first["prompt_logprobs"] == [None, {"105": {"logprob": -0.25, "rank": 1, "decoded_token": "i"}}]
    assert answer["choices"][1]["prompt_logprobs"] == [None]
    assert answer["usage"] == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5, "prompt_tokens_details": {"cached_tokens": 0}}


# -- prompt_logprobs ------------------------------------------------------------------------------


async def test_completions_prompt_logprobs_without_echo_ride_on_each_choice(serve):
    client, engine = await serve(SCRIPT)
    answer = json.loads(await post(client, {"prompt": "ab", "n": 2, "max_tokens": 1, "prompt_logprobs": 2}, stream=False))
    expected = [
        None,
        {
            "98": {"logprob": -0.25, "rank": 1, "decoded_token": "b"},
            "-1": {"logprob": -1.25, "rank": 2, "decoded_token": " alt1"},
        },
    ]
    assert [(c["index"], c["text"], c["prompt_logprobs"]) for c in answer["choices"]] == [(0, "Hel", expected), (1, "Hel", expected)]
    assert [rid for rid, _, _ in engine.submitted] == ["req-1"]  # one prompt, no echo: one engine request, as before


async def test_chat_prompt_logprobs_beside_the_choices(serve):
    client, engine = await serve(SCRIPT)
    resp = await client.post("/v1/chat/completions", json={"messages": USER_HI, "max_tokens": 1, "prompt_logprobs": 0})
    answer = await resp.json()
    assert resp.status == 200, answer
    prompt = answer["prompt_logprobs"]
    assert len(prompt) == USER_HI_PROMPT_TOKENS and prompt[0] is None
    ids = engine.submitted[-1][1]
    assert all(list(entry) == [str(token)] for entry, token in zip(prompt[1:], ids[1:]))
    # Without the field, the answer has no such key (as before).
    resp = await client.post("/v1/chat/completions", json={"messages": USER_HI, "max_tokens": 1})
    assert "prompt_logprobs" not in await resp.json()


async def test_chat_prompt_logprobs_cannot_stream(serve):
    client, engine = await serve(SCRIPT)
    resp = await client.post("/v1/chat/completions", json={"messages": USER_HI, "stream": True, "prompt_logprobs": 1})
    assert_openai_error(resp.status, resp.headers, await resp.read(), expect_status=400, param="prompt_logprobs")
    assert engine.submitted == []
