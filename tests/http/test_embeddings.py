"""POST /v1/embeddings on the fake engine (pooling runner and generative)."""

from __future__ import annotations

import base64
import struct

import openai
import pytest

from engine_adapter.fake import FakeEngine
from streamproxy.config import Settings
from streamproxy.http.app import create_app
from tests.support import wait_until


@pytest.fixture
async def embed_client(aiohttp_client):
    engine = FakeEngine(runner="pooling", embedding_dim=8, max_model_len=64)
    client = await aiohttp_client(create_app(Settings(engine="fake"), engine))
    assert await wait_until(lambda: engine.state == "ready", 10.0), engine.state
    return client, engine


async def test_float_embeddings_for_a_list_of_inputs(embed_client):
    client, engine = embed_client
    r = await client.post("/v1/embeddings", json={"model": "fake", "input": ["ab", "c"]})
    assert r.status == 200
    body = await r.json()
    assert body["object"] == "list" and body["model"] == "fake"
    assert [d["index"] for d in body["data"]] == [0, 1] and {d["object"] for d in body["data"]} == {"embedding"}
    assert all(len(d["embedding"]) == 8 for d in body["data"])
    assert body["usage"] == {"prompt_tokens": 3, "total_tokens": 3}
    assert [p for _, p in engine.submitted_embeddings] == [[97, 98], [99]]
    expected = await engine.embed("x", [97, 98])
    assert body["data"][0]["embedding"] == pytest.approx(expected)


async def test_base64_is_little_endian_float32(embed_client):
    client, engine = embed_client
    r = await client.post("/v1/embeddings", json={"input": "ab", "encoding_format": "base64", "dimensions": 4})
    data = (await r.json())["data"][0]["embedding"]
    raw = base64.b64decode(data)
    assert len(raw) == 16
    assert list(struct.unpack("<4f", raw)) == pytest.approx(await engine.embed("x", [97, 98], 4), rel=1e-6)


async def test_token_id_inputs(embed_client):
    client, engine = embed_client
    r = await client.post("/v1/embeddings", json={"input": [[1, 2], [3]]})
    assert r.status == 200 and len((await r.json())["data"]) == 2
    assert [p for _, p in engine.submitted_embeddings[-2:]] == [[1, 2], [3]]


@pytest.mark.parametrize(
    "body, status, param",
    [
        ({"input": "x", "encoding_format": "hex"}, 400, "encoding_format"),
        ({"input": "x" * 65}, 400, "input"),
        ({"input": []}, 400, "input"),
        ({"input": "x", "dimensions": 99}, 400, "dimensions"),
        ({}, 400, "input"),
        ({"input": "x", "model": "other"}, 404, "model"),
        # Found by tests/fuzz: a token-id list holding a string (or null, or an object) reached the
        # engine and was a 500 (TypeError); `input` is typed as completions' `prompt` now.
        ({"input": [["", 0]]}, 400, "input[0][0]"),
        ({"input": [[1, None]]}, 400, "input[0][1]"),
        ({"input": [{"a": 1}]}, 400, "input[0]"),
        ({"input": [1, "a"]}, 400, "input"),
        # Token ids outside the vocabulary are the client's mistake, as on completions (the fake's is 0x110000).
        ({"input": [1, 0x110000]}, 400, "input"),
        ({"input": [[1], [-1]]}, 400, "input[1]"),
    ],
)
async def test_embedding_errors(embed_client, body, status, param):
    client, _ = embed_client
    r = await client.post("/v1/embeddings", json=body)
    assert r.status == status
    assert (await r.json())["error"]["param"] == param


async def test_generative_model_gets_a_clear_400(serve):
    client, _ = await serve()
    r = await client.post("/v1/embeddings", json={"model": "fake", "input": "hello"})
    assert r.status == 400
    err = (await r.json())["error"]
    assert err["code"] == "model_not_supported" and "embedding" in err["message"]


async def test_openai_sdk_reads_base64_embeddings(embed_client):
    client, engine = embed_client
    sdk = openai.AsyncOpenAI(base_url=str(client.make_url("/v1")), api_key="x")
    out = await sdk.embeddings.create(model="fake", input=["ab"])  # the SDK asks for base64 by default
    assert out.data[0].embedding == pytest.approx(await engine.embed("x", [97, 98]), rel=1e-6)
    await sdk.close()
