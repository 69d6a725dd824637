"""Every client mistake is an exact OpenAI error body with the right status (never a 500)."""

from __future__ import annotations

import json

import pytest

from tests.http.http_support import assert_openai_error

MSG = [{"role": "user", "content": "x"}]


def chat(**extra) -> bytes:
    return json.dumps({"messages": MSG, **extra}).encode()


# (id, body bytes, status, type, param, code)
CHAT_CASES = [
    ("invalid-json", b'{"messages": [', 400, "invalid_request_error", None, "invalid_json"),
    ("not-utf8-json", b"\xff\xfe", 400, "invalid_request_error", None, "invalid_json"),
    ("empty-body", b"", 400, "invalid_request_error", None, "invalid_json"),
    ("whitespace-body", b"  \n ", 400, "invalid_request_error", None, "invalid_json"),
    ("array-body", b"[]", 400, "invalid_request_error", None, ...),
    ("messages-null", b'{"messages": null}', 400, "invalid_request_error", "messages", ...),
    ("messages-empty", b'{"messages": []}', 400, "invalid_request_error", "messages", ...),
    ("content-wrong-type", b'{"messages": [{"role": "user", "content": 5}]}', 400, "invalid_request_error", "messages[0].content", ...),
    ("role-wizard", b'{"messages": [{"role": "wizard", "content": "x"}]}', 400, "invalid_request_error", "messages[0].role", ...),
    (
        "image-url-part",
        b'{"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]}',
        400,
        "invalid_request_error",
        "messages[0].content[0].type",
        ...,
    ),
    ("unknown-model", chat(model="gpt-nope"), 404, "invalid_request_error", "model", "model_not_found"),
    ("temperature-5", chat(temperature=5), 400, "invalid_request_error", "temperature", ...),
    ("temperature-negative", chat(temperature=-0.1), 400, "invalid_request_error", "temperature", ...),
    ("temperature-string", chat(temperature="hot"), 400, "invalid_request_error", "temperature", ...),
    ("top-p-0", chat(top_p=0), 400, "invalid_request_error", "top_p", ...),
    ("n-0", chat(n=0), 400, "invalid_request_error", "n", ...),
    ("n-too-many", chat(n=17), 400, "invalid_request_error", "n", ...),
    ("max-tokens-0", chat(max_tokens=0), 400, "invalid_request_error", "max_tokens", ...),
    ("top-logprobs-without-logprobs", chat(top_logprobs=2), 400, "invalid_request_error", "top_logprobs", ...),
    ("stop-empty-string", chat(stop=""), 400, "invalid_request_error", "stop", ...),
    ("logit-bias-bad-key", chat(logit_bias={"abc": 1}), 400, "invalid_request_error", "logit_bias", ...),
    ("logit-bias-out-of-range", chat(logit_bias={"5": 101}), 400, "invalid_request_error", "logit_bias", ...),
    ("stream-wrong-type", chat(stream="yes"), 400, "invalid_request_error", "stream", "invalid_type"),
    ("stream-options-wrong-type", chat(stream=True, stream_options={"include_usage": "yes"}), 400, "invalid_request_error", "stream_options.include_usage", "invalid_type"),
    ("presence-penalty-3", chat(presence_penalty=3), 400, "invalid_request_error", "presence_penalty", ...),
    # Found by tests/fuzz: nesting past msgspec's recursion limit was a RecursionError (a 500);
    # past 128 levels, whichever way it is found, it is a 400 now.
    ("nested-5000", b'{"a":' * 5000 + b"null" + b"}" * 5000, 400, "invalid_request_error", None, "json_too_deep"),
    ("nested-200-in-kwargs", b'{"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": {"k": '
     + b"[" * 200 + b"]" * 200 + b"}}", 400, "invalid_request_error", None, "json_too_deep"),
    ("nested-128-brackets-in-strings", chat(stop=["[" * 300, "{" * 300]), 200, ..., ..., ...),
]


@pytest.mark.parametrize(
    ("body", "status", "type_", "param", "code"),
    [c[1:] for c in CHAT_CASES],
    ids=[c[0] for c in CHAT_CASES],
)
async def test_chat_request_errors(serve, body, status, type_, param, code):
    client, engine = await serve()
    resp = await client.post("/v1/chat/completions", data=body, headers={"Content-Type": "application/json"})
    raw = await resp.read()
    if status == 200:  # a case that must not be refused
        assert resp.status == 200, raw
        return
    assert_openai_error(resp.status, resp.headers, raw, expect_status=status, type=type_, param=param, code=code)
    assert engine.submitted == []


@pytest.mark.parametrize(
    ("body", "param"),
    [({"model": "fake"}, "messages"), ({"messages": [{"content": "x"}]}, "messages[0].role")],
    ids=["top-level-messages", "nested-role"],
)
async def test_missing_field_names_param(serve, body, param):
    # A missing field is named itself (not its parent, not null).
    client, _ = await serve()
    resp = await client.post("/v1/chat/completions", json=body)
    err = assert_openai_error(
        resp.status, resp.headers, await resp.read(), expect_status=400, type="invalid_request_error", param=param
    )
    assert param.rsplit(".", 1)[-1] in err["message"]


async def test_prompt_longer_than_context(serve):
    client, _ = await serve(max_model_len=32)
    body = {"messages": [{"role": "user", "content": "x" * 100}]}
    resp = await client.post("/v1/chat/completions", json=body)
    err = assert_openai_error(
        resp.status, resp.headers, await resp.read(), expect_status=400, type="invalid_request_error",
        code="context_length_exceeded",
    )
    prompt_tokens = len("<|user|>" + "x" * 100 + "\n<|assistant|>")
    assert "32" in err["message"] and str(prompt_tokens) in err["message"], err


async def test_completions_prompt_longer_than_context(serve):
    client, _ = await serve(max_model_len=32)
    resp = await client.post("/v1/completions", json={"prompt": "y" * 50})
    err = assert_openai_error(resp.status, resp.headers, await resp.read(), expect_status=400, param="prompt")
    assert "32" in err["message"] and "50" in err["message"]


async def test_max_tokens_too_large(serve):
    client, engine = await serve(max_model_len=64)
    resp = await client.post("/v1/chat/completions", json={"messages": MSG, "max_tokens": 1000})
    err = assert_openai_error(
        resp.status, resp.headers, await resp.read(), expect_status=400, param="max_tokens",
        code="context_length_exceeded",
    )
    assert "64" in err["message"] and "1000" in err["message"]
    assert engine.submitted == []


async def test_max_tokens_exactly_fills_context_is_ok(serve):
    client, _ = await serve(max_model_len=64)
    prompt_tokens = len("<|user|>x\n<|assistant|>")
    resp = await client.post("/v1/chat/completions", json={"messages": MSG, "max_tokens": 64 - prompt_tokens})
    assert resp.status == 200
    resp = await client.post("/v1/chat/completions", json={"messages": MSG, "max_tokens": 65 - prompt_tokens})
    assert resp.status == 400


async def test_unknown_route_404(serve):
    client, _ = await serve()
    resp = await client.get("/v1/nothing-here")
    assert_openai_error(resp.status, resp.headers, await resp.read(), expect_status=404, code="not_found")
    resp = await client.post("/v2/chat/completions", json={"messages": MSG})
    assert_openai_error(resp.status, resp.headers, await resp.read(), expect_status=404)


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
async def test_get_on_post_route_405(serve, path):
    client, _ = await serve()
    resp = await client.get(path)
    assert_openai_error(resp.status, resp.headers, await resp.read(), expect_status=405, code="method_not_allowed")


async def test_405_carries_allow_header(serve):
    client, _ = await serve()
    resp = await client.get("/v1/chat/completions")
    assert resp.status == 405
    assert "POST" in resp.headers.get("Allow", "")


async def test_body_over_limit_413(serve):
    client, engine = await serve(max_body_bytes=1000)
    big = json.dumps({"messages": [{"role": "user", "content": "x" * 2000}]}).encode()
    resp = await client.post("/v1/chat/completions", data=big, headers={"Content-Type": "application/json"})
    err = assert_openai_error(resp.status, resp.headers, await resp.read(), expect_status=413, code="request_too_large")
    assert "1000" in err["message"]
    assert engine.submitted == []
    # Just under the limit still works.
    ok = json.dumps({"messages": [{"role": "user", "content": "x" * 100}]}).encode()
    assert len(ok) < 1000
    resp = await client.post("/v1/chat/completions", data=ok, headers={"Content-Type": "application/json"})
    assert resp.status == 200


COMPLETION_CASES = [
    ("missing-prompt", b'{"model": "fake"}', 400, "prompt"),
    ("empty-prompt-list", b'{"prompt": []}', 400, "prompt"),
    ("empty-prompt-string", b'{"prompt": ""}', 400, "prompt"),
    ("empty-string-in-batch", b'{"prompt": ["a", ""]}', 400, "prompt"),
    ("empty-ids-in-batch", b'{"prompt": [[1], []]}', 400, "prompt"),
    ("mixed-prompt", b'{"prompt": ["a", 1]}', 400, "prompt"),
    ("mixed-lists-and-strings", b'{"prompt": [[1, 2], "a"]}', 400, "prompt"),
    ("token-id-out-of-vocab-in-batch", b'{"prompt": [[1], [1114112]]}', 400, "prompt"),
    ("one-prompt-of-the-batch-too-long", b'{"prompt": ["a", "' + b"x" * 5000 + b'"]}', 400, "prompt"),
    ("max-tokens-0-without-echo", b'{"prompt": "a", "max_tokens": 0}', 400, "max_tokens"),
    ("suffix", b'{"prompt": "a", "suffix": "b"}', 400, "suffix"),
    ("best-of-above-n", b'{"prompt": "a", "best_of": 3}', 400, "best_of"),
    ("best-of-below-n", b'{"prompt": "a", "n": 2, "best_of": 1}', 400, "best_of"),
    ("prompt-logprobs-streamed", b'{"prompt": "a", "stream": true, "prompt_logprobs": 1}', 400, "prompt_logprobs"),
    ("prompt-logprobs-negative", b'{"prompt": "a", "prompt_logprobs": -2}', 400, "prompt_logprobs"),
    ("prompt-logprobs-above-engine-max", b'{"prompt": "a", "prompt_logprobs": 21}', 400, "prompt_logprobs"),
    ("unknown-model", b'{"prompt": "a", "model": "other"}', 404, "model"),
    ("logprobs-out-of-range", b'{"prompt": "a", "logprobs": 21}', 400, "logprobs"),
    ("negative-token-id", b'{"prompt": [1, -2]}', 400, "prompt"),
]


@pytest.mark.parametrize(("body", "status", "param"), [c[1:] for c in COMPLETION_CASES], ids=[c[0] for c in COMPLETION_CASES])
async def test_completions_request_errors(serve, body, status, param):
    client, engine = await serve()
    resp = await client.post("/v1/completions", data=body, headers={"Content-Type": "application/json"})
    assert_openai_error(resp.status, resp.headers, await resp.read(), expect_status=status, param=param)
    assert engine.submitted == []
