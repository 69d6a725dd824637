"""POST /tokenize and /detokenize with the fake engine (one token per character)."""

from __future__ import annotations

import pytest

MESSAGES = [{"role": "user", "content": "hi there"}]


@pytest.mark.parametrize("prefix", ["", "/v1"])
async def test_tokenize_prompt(serve, prefix):
    client, engine = await serve(max_model_len=512)
    r = await client.post(prefix + "/tokenize", json={"model": "fake", "prompt": "abc"})
    assert r.status == 200
    assert await r.json() == {"count": 3, "max_model_len": 512, "tokens": [97, 98, 99], "token_strs": None}


async def test_tokenize_chat_count_equals_billed_prompt_tokens(serve):
    client, engine = await serve()
    r = await client.post("/tokenize", json={"model": "fake", "messages": MESSAGES})
    tok = await r.json()
    r = await client.post("/v1/chat/completions", json={"model": "fake", "messages": MESSAGES})
    usage = (await r.json())["usage"]
    assert tok["count"] == usage["prompt_tokens"] == len(engine.submitted[-1][1])
    assert tok["tokens"] == engine.submitted[-1][1]


async def test_tokenize_token_strs(serve):
    client, _ = await serve()
    r = await client.post("/tokenize", json={"prompt": "é!", "return_token_strs": True})
    assert (await r.json())["token_strs"] == ["é", "!"]


async def test_detokenize_round_trip(serve):
    client, _ = await serve()
    r = await client.post("/v1/detokenize", json={"model": "fake", "tokens": [104, 105]})
    assert r.status == 200 and await r.json() == {"prompt": "hi"}


@pytest.mark.parametrize(
    "path, body, param",
    [
        ("/tokenize", {"model": "fake"}, "prompt"),
        ("/tokenize", {"prompt": "a", "messages": MESSAGES}, "prompt"),
        ("/tokenize", {"prompt": 3}, "prompt"),
        ("/detokenize", {"tokens": [-1]}, "tokens[0]"),
        ("/detokenize", {}, "tokens"),
    ],
)
async def test_tokenize_errors_are_openai_shaped_400s(serve, path, body, param):
    client, _ = await serve()
    r = await client.post(path, json=body)
    assert r.status == 400
    err = (await r.json())["error"]
    assert err["param"] == param and err["type"] == "invalid_request_error" and err["message"]


async def test_tokenize_unknown_model_404(serve):
    client, _ = await serve()
    r = await client.post("/tokenize", json={"model": "nope", "prompt": "x"})
    assert r.status == 404 and (await r.json())["error"]["code"] == "model_not_found"
